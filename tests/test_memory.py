"""tracewhy memory: the peak of the [memory] events against their own Total Allocated, the
ledger of a memory-timeline export against the export's rows, snapshot replay on pickles built
from torch's documented layout, and hostile pickles refused without running anything."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from conftest import GENERATED, shared_trace
from tracewhy.analyses.memory import ChurnCol, DeviceMemory, analyze_memory
from tracewhy.analyses.memory_snapshot import analyze_snapshot
from tracewhy.cli import main
from tracewhy.errors import TraceError
from tracewhy.findings.memory import memory_findings, snapshot_findings
from tracewhy.readers import read_trace
from tracewhy.readers.memory.snapshot import read_memory_snapshot
from tracewhy.readers.memory.timeline import read_memory_timeline

MiB = 1 << 20
#: torch/profiler/_memory_profiler.py ``_CATEGORY_TO_COLORS`` order, as tracewhy names them.
EXPORT_ORDER = ["parameters", "optimizer_state", "inputs", "temporaries", "activations", "gradients",
                "autograd_detail", "unknown"]
ADAM_TRACE = GENERATED / "cpu_adam_memory.pt.trace.json.gz"
ADAM_SIZES = GENERATED / "memory_timeline" / "cpu_adam_memory_timeline.json.gz"
ADAM_RAW = GENERATED / "memory_timeline" / "cpu_adam_memory_timeline.raw.json.gz"


def _json_out(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["memory", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _load(path: Path) -> Any:
    return json.loads(gzip.decompress(path.read_bytes()))


# --- memory-timeline exports ------------------------------------------------------------------

def _sizes_oracle(path: Path) -> tuple[int, dict[str, int]]:
    """The export's own peak: the row of [times, sizes] whose columns sum highest."""
    _, sizes = _load(path)
    row = max(sizes, key=sum)
    return sum(row), dict(zip(EXPORT_ORDER, row[1:], strict=True))


def _raw_oracle(path: Path) -> tuple[int, dict[str, int]]:
    """The raw rows replayed one by one, the state taken after the last row of each instant."""
    rows = _load(path)
    live: dict[int, int] = defaultdict(int)
    best: tuple[int, dict[int, int]] = (-1, {})
    for i, (ts, _action, nbytes, category) in enumerate(rows):
        live[category] += nbytes
        if i + 1 == len(rows) or rows[i + 1][0] != ts:
            total = sum(live.values())
            if total > best[0]:
                best = (total, dict(live))
    return best[0], {name: best[1].get(i, 0) for i, name in enumerate(EXPORT_ORDER)}


@pytest.mark.parametrize("path", [ADAM_SIZES, ADAM_RAW], ids=["sizes", "raw"])
def test_timeline_ledger_is_the_exports_own_rows(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    oracle = _sizes_oracle if "raw" not in path.name else _raw_oracle
    total, ledger = oracle(path)
    out = _json_out([str(path)], capsys)
    assert out["input"] == "memory_timeline" and out["ledger_source"] == "export"
    assert out["peak_total_bytes"] == total
    assert out["ledger_at_peak"] == ledger


def test_both_layouts_of_one_profile_agree_and_adam_state_is_twice_the_weights() -> None:
    sizes, raw = read_memory_timeline(ADAM_SIZES), read_memory_timeline(ADAM_RAW)
    assert sizes.layout.value == "sizes" and raw.layout.value == "raw"
    assert sizes.table.get_column("total_bytes").max() == raw.table.get_column("total_bytes").max()
    _, ledger = _sizes_oracle(ADAM_SIZES)
    # exp_avg and exp_avg_sq per parameter, plus Adam's six 4-byte step counters.
    assert ledger["optimizer_state"] == 2 * ledger["parameters"] + 6 * 4


def test_real_raw_timeline_export(capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_trace("hta/torch_memory_timeline_raw.json.gz")
    total, ledger = _raw_oracle(path)
    out = _json_out([str(path)], capsys)
    assert out["layout"] == "raw" and out["events"] == 16845
    assert (out["peak_total_bytes"], out["ledger_at_peak"]) == (total, ledger)
    assert max(ledger, key=lambda k: ledger[k]) == "activations"


def test_read_trace_still_refuses_a_timeline_export() -> None:
    with pytest.raises(TraceError, match="memory-timeline export, not a profiler trace"):
        read_trace(ADAM_SIZES)


# --- [memory] events of profiler traces ---------------------------------------------------------

def _raw_peaks(path: Path) -> dict[str, tuple[int, int | None]]:
    """Max Total Allocated and Total Reserved per device, straight from the [memory] events."""
    doc = _load(path)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    peaks: dict[str, tuple[int, int | None]] = {}
    running: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("name") != "[memory]":
            continue
        a = e["args"]
        kind, index = a.get("Device Type", 0), a.get("Device Id", -1)
        device = "cpu" if kind == 0 else f"cuda:{index}"
        # PyTorch < 1.10 wrote only "Bytes": allocated is then their running sum, reserved unknown.
        running[device] += a["Bytes"]
        allocated, reserved = a.get("Total Allocated", running[device]), a.get("Total Reserved")
        old_a, old_r = peaks.get(device, (allocated, reserved))
        peaks[device] = (max(old_a, allocated), None if reserved is None else max(old_r or 0, reserved))
    return peaks


@pytest.mark.parametrize("path", [
    ADAM_TRACE,
    GENERATED / "cpu_python_export_memory.pt.trace.json.gz",
    "hta/v100_ddp2_rank1_memprofile.json.gz",
    "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz",
], ids=["adam", "python-export", "v100-ddp", "resnet50"])
def test_peak_is_the_events_own_total_allocated(path: Path | str, capsys: pytest.CaptureFixture[str]) -> None:
    p = path if isinstance(path, Path) else shared_trace(path)
    expected = _raw_peaks(p)
    out = _json_out([str(p)], capsys)
    got = {d["device"]: (d["peak_allocated_bytes"], d["peak_reserved_bytes"]) for d in out["devices"]}
    assert got == expected
    for d in out["devices"]:
        assert sum(d["ledger"].values()) == d["peak_allocated_bytes"]  # every byte at the peak is placed
        assert d["peak_step"] is None or d["peak_step"].startswith("ProfilerStep#")


def test_v100_ddp_peak_in_context() -> None:
    """A real 32 GB V100 DDP run: the peak falls in backward inside a step, under the
    device's memory, with reserved far above allocated (the fragmentation finding)."""
    r = analyze_memory(read_trace(shared_trace("hta/v100_ddp2_rank1_memprofile.json.gz")))
    gpu = next(d for d in r.devices if d.device == "cuda:1")
    assert gpu.peak_allocated_bytes == 6_629_508_096
    assert gpu.reserved_at_peak_bytes is not None
    assert gpu.peak_allocated_bytes <= gpu.reserved_at_peak_bytes <= 32 * 1024**3
    assert gpu.peak_step == "ProfilerStep#2" and gpu.peak_op is not None and "Backward" in gpu.peak_op
    assert gpu.steps.filter(pl.col(ChurnCol.STEADY)).height == 5
    codes = {f.code for f in memory_findings(r)}
    assert "memory-fragmentation" in codes and "memory-peak" in codes
    assert "memory-growth" not in codes and "allocator-churn" not in codes  # flat, warm cache


def test_adam_trace_inferred_ledger_and_steps() -> None:
    r = analyze_memory(read_trace(ADAM_TRACE))
    (cpu,) = r.devices
    assert r.ledger_source == "inferred"
    # The peak is in backward: the weights' gradients are live, no optimizer state was made in
    # the trace (Adam made it in the first, unprofiled step).
    assert cpu.ledger["optimizer_state"] == 0
    # Every weight's gradient but the conv layer's own (being computed at the peak) is live: the
    # same bytes the profiler's export files as GRADIENT at its own peak.
    assert cpu.ledger["gradients"] == _sizes_oracle(ADAM_SIZES)[1]["gradients"] == 133_928
    assert cpu.peak_python_stack  # with_stack=True
    # The frame named is the user's innermost (the loop's train_step), not torch's module frames.
    user = [f for f in cpu.peak_python_stack if "(" in f and not f.startswith(("torch/", "<"))]
    assert cpu.peak_frame is not None and user and cpu.peak_frame.split(" ")[-1] == user[0].split(": ")[-1]
    steady = cpu.steps.filter(pl.col(ChurnCol.STEADY))
    assert steady.get_column(ChurnCol.ALLOCATIONS).n_unique() == 1  # the same loop every step
    assert cpu.growth_bytes_per_step is not None and abs(cpu.growth_bytes_per_step) < 1


def _device_with_steps(ends: list[int], reserve_changes: int = 0) -> DeviceMemory:
    steps = pl.DataFrame({
        ChurnCol.STEP: [f"ProfilerStep#{i}" for i in range(len(ends))], ChurnCol.STEADY: [True] * len(ends),
        ChurnCol.ALLOCATIONS: [10] * len(ends), ChurnCol.FREES: [10] * len(ends),
        ChurnCol.BYTES_ALLOCATED: [MiB] * len(ends), ChurnCol.ALLOCATED_AT_END: ends,
        ChurnCol.RESERVE_CHANGES: [reserve_changes] * len(ends),
    })
    from tracewhy.analyses.memory_growth import SITES_SCHEMA, StepGrowth

    slope = (ends[-1] - ends[0]) / (len(ends) - 1)
    rises = sum(b > a for a, b in itertools.pairwise(ends))
    return DeviceMemory("cuda:0", 100, max(ends), max(ends), max(ends), 0, None, None, None, None, None, None, (),
                        {"activations": max(ends)}, pl.DataFrame(), steps, slope,
                        StepGrowth(rises, len(ends), pl.DataFrame(schema=SITES_SCHEMA)))


def test_growth_and_churn_findings_fire_on_their_signatures() -> None:
    from tracewhy.analyses.memory import MemoryResult

    def codes(d: DeviceMemory) -> set[str]:
        return {f.code for f in memory_findings(MemoryResult((d,), pl.DataFrame(), "inferred"))}

    assert "memory-growth" in codes(_device_with_steps([100 * MiB, 110 * MiB, 120 * MiB, 130 * MiB]))
    assert "memory-growth" not in codes(_device_with_steps([100 * MiB] * 4))
    # A step up that then holds (a buffer allocated lazily and kept) is no leak, however steep.
    assert "memory-growth" not in codes(_device_with_steps([100 * MiB, 100 * MiB, 200 * MiB, 200 * MiB]))
    assert "allocator-churn" in codes(_device_with_steps([100 * MiB] * 4, reserve_changes=2))


# --- snapshots -----------------------------------------------------------------------------------

def _frames(file: str, line: int) -> list[dict[str, Any]]:
    """A stack as the allocator records it, innermost first: torch's frame, then the user's."""
    return [{"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", "line": 125,
             "name": "forward"}, {"filename": file, "line": line, "name": "step"}]


def _entry(action: str, addr: int, size: int, where: tuple[str, int] = ("train.py", 1), **extra: Any) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": _frames(*where), **extra}


def build_snapshot(*, expandable: bool = False, oom: bool = False) -> dict[str, Any]:
    """A snapshot in the layout torch/cuda/memory.py documents: one 2 MiB segment allocated
    before recording (its one block still live), one 20 MiB segment the window allocates. In the
    window: A 8 MiB (a.py:10), B 12 MiB (b.py:20), B freed, C 4 MiB (c.py:30)."""
    s1, s2 = 0x7F00_0000_0000, 0x7F00_1000_0000
    grow = "segment_map" if expandable else "segment_alloc"
    trace = [
        _entry(grow, s2, 20 * MiB), _entry("alloc", s2, 8 * MiB, ("a.py", 10)),
        _entry("alloc", s2 + 8 * MiB, 12 * MiB, ("b.py", 20)),
        _entry("free_requested", s2 + 8 * MiB, 12 * MiB, ("b.py", 21)),
        _entry("free_completed", s2 + 8 * MiB, 12 * MiB, ("b.py", 21)),
        _entry("alloc", s2 + 8 * MiB, 4 * MiB, ("c.py", 30)),
    ]
    if oom:
        trace.append(_entry("oom", 0, 64 * MiB, ("d.py", 40), device_free=3 * MiB))
    for i, e in enumerate(trace):
        e["time_us"] = 1000 + i
    block = {"size": 2 * MiB, "requested_size": 2 * MiB - 512, "state": "active_allocated",
             "frames": _frames("w.py", 5)}
    segments = [
        {"device": 0, "address": s1, "total_size": 2 * MiB, "stream": 0, "segment_type": "large",
         "segment_pool_id": (0, 0), "allocated_size": 2 * MiB, "active_size": 2 * MiB, "is_expandable": False,
         "blocks": [{**block, "address": s1}]},
        {"device": 0, "address": s2, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
         "segment_pool_id": (0, 0), "allocated_size": 12 * MiB, "active_size": 12 * MiB, "is_expandable": expandable,
         "blocks": [
             {"address": s2, "size": 8 * MiB, "requested_size": 8 * MiB, "state": "active_allocated",
              "frames": _frames("a.py", 10)},
             {"address": s2 + 8 * MiB, "size": 4 * MiB, "requested_size": 4 * MiB, "state": "active_allocated",
              "frames": _frames("c.py", 30)},
             {"address": s2 + 12 * MiB, "size": 8 * MiB, "requested_size": 8 * MiB, "state": "inactive", "frames": []},
         ]},
    ]
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"expandable_segments": expandable, "PYTORCH_CUDA_ALLOC_CONF": ""}}


def _write(tmp_path: Path, data: Any, name: str = "snap.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(data, protocol=4))
    return path


@pytest.mark.parametrize("expandable", [False, True])
def test_snapshot_replays_backward_from_the_final_state(tmp_path: Path, expandable: bool) -> None:
    r = analyze_snapshot(read_memory_snapshot(_write(tmp_path, build_snapshot(expandable=expandable))))
    (d,) = r.devices
    # Allocated counts block sizes, as torch.cuda.memory_allocated does; the final w.py block was
    # asked for 512 B under its 2 MiB block, so the requested curve sits 512 B under it throughout.
    assert d.timeline.get_column("allocated_bytes").to_list() == [x * MiB for x in (2, 10, 22, 22, 10, 14)]
    assert d.timeline.get_column("requested_bytes").to_list() == [x * MiB - 512 for x in (2, 10, 22, 22, 10, 14)]
    assert [v // MiB for v in d.timeline.get_column("reserved_bytes")] == [22] * 6
    assert (d.peak_allocated_bytes, d.peak_requested_bytes, d.peak_seq, d.peak_time_us) == \
        (22 * MiB, 22 * MiB - 512, 2, 1002)
    assert d.peak_frames[-1] == ("b.py", 20, "step")
    live = {row[0]: row[2] for row in d.live_at_peak.iter_rows()}
    assert live == {"b.py:20 step": 12 * MiB, "a.py:10 step": 8 * MiB, "w.py:5 step": 2 * MiB}
    assert sum(live.values()) == d.peak_allocated_bytes  # what is live at the peak is the peak
    assert (d.free_in_segments_bytes, d.largest_free_block_bytes, d.rounding_waste_bytes) == (8 * MiB, 8 * MiB, 512)
    assert d.expandable_segments == int(expandable)
    assert r.allocator_settings["expandable_segments"] is expandable


def _torch_block(requested: int, *, free_block: int | None = None, small_pool: bool = False) -> int:
    """The block c10/cuda/CUDACachingAllocator.cpp hands out for a request, written from its
    source: ``round_size`` (at least kMinBlockSize = 512 B, then up to a multiple of 512 B), then
    ``should_split`` on the free block it is cut from: a small-pool block splits when 512 B or more
    would remain, a large-pool block only when more than kSmallSize = 1 MiB would remain."""
    rounded = max(512, -(-requested // 512) * 512)
    if free_block is None:
        return rounded
    remaining = free_block - rounded
    return rounded if (remaining >= 512 if small_pool else remaining > MiB) else free_block


def test_snapshot_peak_counts_block_sizes_as_max_memory_allocated(tmp_path: Path) -> None:
    """Trace entries record requested bytes; torch.cuda.max_memory_allocated counts the blocks.
    A 2 MiB small segment holds 1000 B and 1 B; a 12 MiB segment allocated for 11.5 MiB + 1 B is
    not split (under 1 MiB would remain), so the whole segment is the block; a 20 MiB segment
    gives 3 MiB + 1 B its rounded block. All three freed but the 1 B block, which the final
    state holds."""
    small, whole, split = 0x7F00_0000_0000, 0x7F00_1000_0000, 0x7F00_2000_0000
    requests = {small: 1000, small + 1024: 1, whole: 11 * MiB + MiB // 2 + 1, split: 3 * MiB + 1}
    trace = [_entry("segment_alloc", small, 2 * MiB), _entry("alloc", small, requests[small]),
             _entry("alloc", small + 1024, 1), _entry("segment_alloc", whole, 12 * MiB),
             _entry("alloc", whole, requests[whole]), _entry("segment_alloc", split, 20 * MiB),
             _entry("alloc", split, requests[split])]
    trace += [_entry(a, addr, requests[addr]) for addr in (whole, split, small)
              for a in ("free_requested", "free_completed")]
    segments = [{"device": 0, "address": small, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
                 "allocated_size": 512, "is_expandable": False, "blocks": [
                     {"address": small, "size": 1024, "requested_size": 0, "state": "inactive", "frames": []},
                     {"address": small + 1024, "size": 512, "requested_size": 1, "state": "active_allocated",
                      "frames": _frames("w.py", 5)},
                     {"address": small + 1536, "size": 2 * MiB - 1536, "requested_size": 0, "state": "inactive",
                      "frames": []}]}]
    d = analyze_snapshot(read_memory_snapshot(_write(tmp_path, {"segments": segments,
                                                                "device_traces": [trace]}))).devices[0]
    expected_peak = (_torch_block(1000, free_block=2 * MiB, small_pool=True)
                     + _torch_block(1, free_block=2 * MiB - 1024, small_pool=True)
                     + _torch_block(requests[whole], free_block=12 * MiB)
                     + _torch_block(requests[split], free_block=20 * MiB))
    assert expected_peak == 1024 + 512 + 12 * MiB + 3 * MiB + 512  # the rule, spelled out
    assert d.peak_allocated_bytes == expected_peak
    assert d.peak_requested_bytes == sum(requests.values())
    assert (d.final_allocated_bytes, d.final_requested_bytes) == (512, 1)
    assert d.timeline.get_column("allocated_bytes").to_list()[-1] == 512  # the replay lands on the final state


def test_kineto_cuda_events_count_the_same_blocks_the_snapshot_replay_counts() -> None:
    """On a real V100 profile_memory trace every CUDA [memory] event is a whole number of 512 B
    blocks, and Total Allocated moves by exactly the event's bytes: the profiler reports block
    sizes, so the snapshot's peak, replayed in block sizes, is the same measure as the trace's."""
    from tracewhy.analyses.allocator_blocks import round_size

    trace = read_trace(shared_trace("hta/v100_ddp2_rank1_memprofile.json.gz"))
    cuda = trace.memory.filter(pl.col("device_type") == 1)
    nbytes = cuda.get_column("bytes").to_numpy()
    assert cuda.height > 20_000 and (round_size(abs(nbytes)) == abs(nbytes)).all()
    totals = cuda.get_column("total_allocated").to_numpy()
    assert ((totals[1:] - totals[:-1]) == nbytes[1:]).all()


def test_snapshot_oom_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "snap.pickle.gz"  # a gzipped snapshot is one too
    path.write_bytes(gzip.compress(pickle.dumps(build_snapshot(oom=True), protocol=4)))
    out = _json_out([str(path)], capsys)
    (d,) = out["devices"]
    assert (d["peak_allocated_bytes"], d["peak_requested_bytes"], d["peak_ts_ns"]) == \
        (22 * MiB, 22 * MiB - 512, 1_002_000)
    assert d["ooms"] == [{"seq": 6, "time_us": 1006, "requested_bytes": 64 * MiB, "device_free_bytes": 3 * MiB,
                          "frame": "d.py:40 step"}]
    assert "memory-peak" in {f["code"] for f in out["findings"]}
    assert snapshot_findings(analyze_snapshot(read_memory_snapshot(path)))[0].severity.value == "high"


class _MakesAFile:
    """Unpickling this would create a file: what a hostile "snapshot" does."""

    def __init__(self, target: Path, how: str) -> None:
        self.target, self.how = target, how

    def __reduce__(self) -> tuple[Any, ...]:
        if self.how == "system":
            return (os.system, (f"touch {self.target}",))
        return (open, (str(self.target), "w"))


@pytest.mark.parametrize("how", ["system", "open"])
def test_hostile_pickle_is_refused_and_nothing_runs(tmp_path: Path, how: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "pwned"
    path = _write(tmp_path, {"segments": [], "device_traces": [[_MakesAFile(target, how)]]})
    with pytest.raises(TraceError, match="refused as a memory snapshot"):
        read_memory_snapshot(path)
    assert main(["memory", str(path)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refused" in err
    assert not target.exists()


def test_protocol_zero_hostile_pickle_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    path = tmp_path / "old.pickle"
    path.write_bytes(f"cposix\nsystem\n(Vtouch {target}\ntR.".encode())
    with pytest.raises(TraceError):
        read_memory_snapshot(path)
    assert main(["memory", str(path)]) == 3
    assert not target.exists()


def test_snapshot_that_is_not_a_snapshot(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not a CUDA memory snapshot"):
        read_memory_snapshot(_write(tmp_path, [1, 2, 3]))
    cut = _write(tmp_path, build_snapshot())
    cut.write_bytes(cut.read_bytes()[:200])
    with pytest.raises(TraceError, match="not a readable pickle"):
        read_memory_snapshot(cut)


def _torch_shared_trace(sites: int) -> list[dict[str, Any]]:
    """A trace whose stacks share objects as torch writes them: one dict per distinct frame,
    a fresh list per captured traceback (py_symbolize). Every call site's stack differs from
    the others only in its innermost frame, so all of them look alike at the frames the reader
    samples before comparing; each site allocates twice, with two lists."""
    common = [{"filename": f"/venv/torch/f{i}.py", "line": i, "name": "g"} for i in range(1, 8)]
    inner = [{"filename": f"site{s}.py", "line": s, "name": "step"} for s in range(sites)]
    trace = [{"action": "alloc", "addr": 512 * i, "size": 512, "stream": 0, "frames": [inner[i % sites], *common]}
             for i in range(2 * sites)]
    return trace


def test_shared_frame_objects_read_as_their_content(tmp_path: Path) -> None:
    sites = 40  # beyond HINT_CANDIDATES: the later sites are interned by content
    trace = _torch_shared_trace(sites)
    shared = read_memory_snapshot(_write(tmp_path, {"segments": [], "device_traces": [trace]}, "shared.pickle"))
    # The same data with every frame its own object: interned by content alone.
    unshared = read_memory_snapshot(_write(tmp_path, {"segments": [], "device_traces": [json.loads(json.dumps(trace))]},
                                           "unshared.pickle"))
    assert shared.events.equals(unshared.events) and shared.stacks == unshared.stacks
    stacks = shared.events.get_column("stack").to_list()
    assert stacks == [i % sites for i in range(2 * sites)]
    assert [s[0] for s in shared.stacks] == [(f"site{s}.py", s, "step") for s in range(sites)]


def test_frames_that_contain_themselves_are_refused(tmp_path: Path) -> None:
    trace = _torch_shared_trace(2)
    for e in trace:  # innermost frames now lists that hold themselves: comparing two never ends
        loop: list[Any] = []
        loop.append(loop)
        e["frames"][0] = loop
    with pytest.raises(TraceError, match="nest too deeply"):
        read_memory_snapshot(_write(tmp_path, {"segments": [], "device_traces": [trace]}))


def test_a_stack_without_python_names_its_first_telling_frame() -> None:
    """Allocations on the autograd engine's thread carry C++ frames only; the innermost is the
    unwinder's own, which says nothing. torch's viewer hides it (``_frame_filter`` in
    torch/cuda/_memory_viz.py), and so does the live-at-peak table's frame."""
    from tracewhy.analyses.memory_snapshot import user_frame

    frames = (("??", 0, "torch::unwind::unwind()"), ("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
              ("core/boxing/impl.h", 41, "c10::impl::wrap_kernel"),
              ("aten/src/ATen/native/cuda/Blas.cpp", 312, "at::native::addmm_out_cuda_impl"),
              ("torch/csrc/autograd/engine.cpp", 1100, "torch::autograd::Engine::thread_main"))
    assert user_frame(frames) == "aten/src/ATen/native/cuda/Blas.cpp:312 at::native::addmm_out_cuda_impl"
    assert user_frame((("train.py", 7, "step"), *frames)) == "train.py:7 step"
    assert user_frame(frames[:2]) == "??:0 torch::unwind::unwind()"  # nothing better: the innermost


def test_the_frame_named_for_an_allocation_is_never_the_allocator() -> None:
    """A stack recorded with stacks="all" holds the allocator's own C++ frames innermost (as
    torch 2.x's CUDACachingAllocator.cpp and EmptyTensor.cpp name them), then the op that asked
    for the memory, then Python. The frame named is the user's line; without Python frames the
    op; a stack from inside torch's own Python (an optimizer step) names that Python frame."""
    from tracewhy.analyses.memory_snapshot import user_frame

    allocator = (("??", 0, "torch::unwind::unwind()"),
                 ("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
                 ("c10/cuda/CUDACachingAllocator.cpp", 3455,
                  "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, "
                  "unsigned long, CUstream_st*)"),
                 ("c10/cuda/CUDACachingAllocator.cpp", 3860,
                  "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)"),
                 ("aten/src/ATen/EmptyTensor.cpp", 62, "at::detail::empty_generic(c10::ArrayRef<long>, ...)"),
                 ("aten/src/ATen/native/cuda/EmptyTensor.cpp", 33, "at::detail::empty_cuda(...)"),
                 ("build/aten/src/ATen/RegisterCUDA.cpp", 1200, "at::(anonymous namespace)::create_out(...)"),
                 ("build/aten/src/ATen/RegisterCUDA.cpp", 1400,
                  "at::(anonymous namespace)::structured_addmm_out_cuda_functional::set_output_raw_strided(...)"))
    op = ("aten/src/ATen/native/cuda/Blas.cpp", 312, "at::native::addmm_out_cuda_impl")
    engine = ("torch/csrc/autograd/engine.cpp", 1100, "torch::autograd::Engine::thread_main")
    assert user_frame((*allocator, op, engine)) == \
        "aten/src/ATen/native/cuda/Blas.cpp:312 at::native::addmm_out_cuda_impl"
    optimizer = ("/venv/lib/python3.11/site-packages/torch/optim/adamw.py", 480, "_multi_tensor_adamw")
    assert user_frame((*allocator, op, optimizer)) == f"{optimizer[0]}:480 _multi_tensor_adamw"
    assert user_frame((*allocator, op, optimizer, ("train.py", 88, "main"))) == "train.py:88 main"


def test_a_snapshot_peak_in_the_optimizer_step_gets_optimizer_advice(tmp_path: Path) -> None:
    """A snapshot has no step annotations; the stack of the allocation that reached the peak does:
    foreach Adam's frame in torch/optim puts a 600 MiB peak in the optimizer step, whose advice
    is the optimizer's state, not activation checkpointing."""
    seg, size = 0x7F00_0000_0000, 600 * MiB + 1
    adam = ("/venv/lib/python3.11/site-packages/torch/optim/adam.py", 540)
    trace = [_entry("segment_alloc", seg, 1024 * MiB), _entry("alloc", seg, size, adam),
             _entry("free_requested", seg, size, adam), _entry("free_completed", seg, size, adam)]
    trace[1]["frames"][1]["name"] = "_multi_tensor_adam"
    segments = [{"device": 0, "address": seg, "total_size": 1024 * MiB, "stream": 0, "segment_type": "large",
                 "allocated_size": 0, "is_expandable": False,
                 "blocks": [{"address": seg, "size": 1024 * MiB, "requested_size": 0, "state": "inactive",
                             "frames": []}]}]
    r = analyze_snapshot(read_memory_snapshot(_write(tmp_path, {"segments": segments, "device_traces": [trace]})))
    (d,) = r.devices
    assert (d.peak_allocated_bytes, d.peak_requested_bytes, d.peak_phase) == (600 * MiB + 512, size, "optimizer")
    (finding,) = [f for f in snapshot_findings(r) if f.code == "memory-peak"]
    assert "optimizer step" in finding.next_step and "checkpoint" not in finding.next_step
