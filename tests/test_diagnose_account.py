"""``diagnose`` built on the step account: it opens with where the step goes, each time finding
names the part it explains and the step predicted with its fix, the planted causes lead their
diagnosis, a copy-bound step says so with the copies' own figures, and ``critical-path``'s gain
for a part is the recoverable time of the finding that explains it."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import GENERATED, account_of, cli_output, shared_trace
from test_account_real import _path, _traces
from tracewhy.analyses.account import AccountCol
from tracewhy.errors import TraceError
from tracewhy.findings import thresholds as th
from tracewhy.readers import read_trace

HEALTHY = "Nothing here costs a meaningful share"


def _run(argv: list[str]) -> str:
    return cli_output(*argv)


def _diagnose(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(_run(["diagnose", str(path), "--json"]))
    return out


def _first_cause(d: dict[str, Any]) -> dict[str, Any]:
    first: dict[str, Any] = next(f for f in d["findings"] if f["severity"] != "trust")
    return first


def test_the_copy_bound_window_leads_with_its_copies(tmp_path: Path) -> None:
    """nsys-ai's H100 window: the export's own memcpy rows (read here with sqlite3) hold 223
    pinned HtoD copies per process, 25.5 GB in 921 ms; the diagnosis leads with them: bytes,
    GB/s and memory kind, the GPU's busy time split into kernels and copies."""
    path = shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz")
    db = tmp_path / "h100.sqlite"
    db.write_bytes(gzip.decompress(path.read_bytes()))
    with sqlite3.connect(db) as conn:
        pinned = conn.execute(
            "SELECT count(*), sum(bytes), sum(m.end - m.start) FROM CUPTI_ACTIVITY_KIND_MEMCPY m "
            "JOIN ENUM_CUDA_MEM_KIND k ON k.id = m.srcKind WHERE m.copyKind = 1 AND k.label = 'Pinned' "
            "GROUP BY m.globalPid").fetchall()
    count, moved, busy = pinned[0]
    d = _diagnose(path)
    f = _first_cause(d)
    assert f["code"] == "copy-bound" and f["severity"] == "high" and f["part"] == "copies: HtoD pinned"
    copies = f["evidence"]["copies"][0]
    assert (copies["copies_per_step"], copies["bytes_per_step"]) == (count, moved)
    assert copies["bytes_per_s"] == pytest.approx(moved / busy * 1e9, rel=0.01)
    for said in ("pinned memory", f"{moved / 2**30:.1f} GiB", f"{moved / busy:.1f} GB/s", "copies 97"):
        assert said in f["statement"], said
    # The export names no GPU: the rate is set beside PCIe 4.0 and 5.0 x16's one-way peaks (32, 64 GB/s).
    assert f"{moved / busy / 32:.1%} of PCIe 4.0 x16's 32 GB/s" in f["statement"]
    assert f"{moved / busy / 64:.1%} of PCIe 5.0 x16's 64 GB/s" in f["statement"]
    assert d["account"][0]["part"] == "copies: HtoD pinned" and d["account"][0]["share"] > 0.9
    saturated = next(g for g in d["findings"] if g["code"] == "gpu-saturated")
    assert "kernels 2.3%, copies 97.0%" in saturated["statement"]
    assert not d["healthy"]


#: Planted causes (tests/data/generated/MANIFEST.md): the code of the finding that must lead,
#: and a word of the part it must explain.
PLANTED = {
    "cpu_dataloader_slow": ("input-bound", "data loading"),
    "cpu_lines_sleep": ("input-bound", "data loading"),
    "cpu_slow_step_planted": ("unexplained-part", "planted_slowdown"),
    "cpu_item_sync": ("scalar-read-per-step", "aten::item"),
    "cpu_lines_loop": ("unexplained-part", "python_loop_sum"),
    "ddp_gloo_bcast_rank1": ("unexplained-part", "_delay"),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_each_planted_cause_leads_with_a_prediction(name: str) -> None:
    code, word = PLANTED[name]
    d = _diagnose(GENERATED / f"{name}.pt.trace.json.gz")
    f = _first_cause(d)
    assert f["code"] == code and word in f["part"], (f["code"], f["part"])
    measured = f["evidence"]["measured_step_ns"]
    assert 0 < f["predicted_step_ns"] < measured
    assert f["recoverable_ns_per_step"] == measured - f["predicted_step_ns"]
    assert not d["healthy"]
    assert any(word in a["part"] for a in d["account"])


def test_a_one_time_recompile_leads_without_a_per_step_prediction() -> None:
    """The recompile of cpu_compile_recompile happens once (the last step's new batch size): its
    step is left out of the account as a one-time compile (no compilation part in the steady
    mean), and the finding says it is a one-time cost, with no per-step saving predicted."""
    d = _diagnose(GENERATED / "cpu_compile_recompile.pt.trace.json.gz")
    f = _first_cause(d)
    assert f["code"] == "recompile" and "one-time" in f["statement"]
    assert f["predicted_step_ns"] is None and f["recoverable_ns_per_step"] == 0
    assert not any("compilation" in a["part"] for a in d["account"])


#: Traces whose critical-path gains and diagnose's recoverable times are compared: BERT (one
#: step, GPU), the slow DataLoader (8 CPU steps), the 16-rank all-to-all (steps, GPU).
AGREE = ("tracelens/h100_bert-small_bs1_seq512.json.gz", "generated/cpu_dataloader_slow.pt.trace.json.gz",
         "hta/a100_16rank_rank0_alltoall.json.gz")


@pytest.mark.parametrize("relative", AGREE)
def test_critical_path_gains_are_diagnose_recoverable(relative: str) -> None:
    """A finding that explains one part with one fix recovers what ``critical-path`` says the
    fix of that part saves (the same replay of the same steps: equal up to rounding the mean)."""
    path = _path(relative)
    d = _diagnose(path)
    cp = json.loads(_run(["critical-path", str(path), "--json"]))
    gains: dict[str, list[int]] = {}
    for g in (g for step in cp["steps"] for g in step["gains"]):
        if g["category"] == "part" and g["gain_ns"] is not None:
            gains.setdefault(g["name"], []).append(g["gain_ns"])
    compared = 0
    for f in d["findings"]:
        parts = f["evidence"].get("parts")
        if f["predicted_step_ns"] is None or not isinstance(parts, list) or parts != [f["part"]] \
                or f["part"] not in gains:
            continue
        mean = sum(gains[f["part"]]) / len(gains[f["part"]])
        assert abs(f["recoverable_ns_per_step"] - mean) <= 1, (f["code"], f["part"])
        compared += 1
    assert compared >= 1, "no finding explains a part critical-path replays"


def test_launch_overhead_is_one_number_on_bert() -> None:
    """Launch overhead on BERT was 1.034 ms recoverable in diagnose and 339 µs in critical-path:
    now the finding recovers what the replay without the launch time saves."""
    path = shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz")
    d = _diagnose(path)
    launch = next(f for f in d["findings"] if f["code"] == "gpu-idle-launch")
    assert launch["part"] == "launch overhead"
    assert "1.034 ms" in launch["statement"]  # its own measurement is kept
    cp = json.loads(_run(["critical-path", str(path), "--json"]))
    gain = next(g["gain_ns"] for step in cp["steps"] for g in step["gains"]
                if g["category"] == "part" and g["name"] == "launch overhead")
    assert launch["recoverable_ns_per_step"] == gain < 1_000_000


@pytest.mark.slow
@pytest.mark.parametrize("relative", _traces())
def test_every_diagnosis_opens_with_where_the_step_goes(relative: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On every trace, the lines before the first cause say where at least 80% of the step goes
    (the account computed apart here; on a trace with neither steps nor iterations, the whole
    trace), and no trace is called healthy while an avoidable part takes
    UNEXPLAINED_PART_MIN_SHARE of the step."""
    try:
        account = account_of(_path(relative))
    except TraceError as e:
        pytest.skip(f"not a profiler trace: {e}")
    monkeypatch.setenv("COLUMNS", "400")  # (a part's name on one line)
    text = _run(["diagnose", str(_path(relative))])
    d = _diagnose(_path(relative))
    avoidable = account.avoidable_parts()
    if avoidable.height and float(avoidable.get_column(AccountCol.SHARE).max()) >= th.UNEXPLAINED_PART_MIN_SHARE:  # type: ignore[arg-type]
        assert HEALTHY not in text and not d["healthy"]
    if account.mean_step_ns == 0:
        return
    listed = [a for a in d["account"] if a["kind"] != "rest"]
    assert sum(a["share"] for a in listed) >= th.ACCOUNT_COVER_SHARE - 1e-9
    first_cause = next((f for f in d["findings"] if f["severity"] != "trust"), None)
    where = text.index("Where the step goes")
    if first_cause is not None:
        assert where < text.index(f"[{first_cause['severity']}] {first_cause['code']}")
    for a in listed:
        assert a["part"][:40] in text[where:], a["part"]


def test_busy_is_kernels_copies_and_memsets_apart() -> None:
    """Every busy statement splits the busy time: the overlap summary and diagnose's utilization
    findings say the copies' 97% apart from the kernels' 2.3% on nsys-ai's H100 window."""
    path = shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz")
    overlap = _run(["overlap", str(path)])
    assert "GPU 0 busy 99.3%: compute kernels 2.3%, communication 0.0%, copies and memsets 97.0%" in overlap
    ddp = _diagnose(shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz"))
    low = next(f for f in ddp["findings"] if f["code"] == "gpu-low-utilization")
    split = low["evidence"]["busy_by_kind_ns"]
    assert set(split) == {"kernels", "copies", "memsets"} and split["kernels"] > split["copies"] > 0
    assert "kernels 23.3%, copies 0.3%" in low["statement"]


@pytest.mark.parametrize(("device", "link", "gb_per_s"), [
    ("NVIDIA H100 80GB HBM3", "PCIe 5.0 x16", 64), ("NVIDIA A100-SXM4-40GB", "PCIe 4.0 x16", 32),
    ("Tesla V100-SXM2-16GB", "PCIe 3.0 x16", 16), ("NVIDIA GH200 480GB", "NVLink-C2C", 450),
    ("AMD Instinct MI300X", "PCIe 5.0 x16", 64)])
def test_host_links_are_one_way_halves_of_the_datasheets(device: str, link: str, gb_per_s: int) -> None:
    """A copy crosses the link one way: half the both-ways figure the datasheets quote."""
    from tracewhy.analyses.peaks import host_link

    found = host_link(device)
    assert found is not None and found.name == link and found.bytes_per_s == gb_per_s * 1e9
    assert host_link("Some Future GPU") is None and host_link(None) is None


def test_the_steps_the_fixes_replay_are_named_where_they_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a small graph (the demo's 16 steps, 10 k edges) every analysed step is replayed, so each
    finding's "step X -> Y" starts from the account's own mean step. On a large one (HTA's V100
    DDP rank, 5 steps of 54 k edges each) 4 are, picked evenly (steps 0, 1, 3 and 4 of the
    account's, read from account --json): the findings start from their mean, which is not the
    account's, and the header says so with that mean, so the two figures are not read as one."""
    monkeypatch.setenv("COLUMNS", "400")
    demo = Path(__file__).resolve().parents[1] / "examples" / "demo_cpu_training.pt.trace.json.gz"
    account = json.loads(_run(["account", str(demo), "--json"]))
    assert len(account["windows"]) == 16
    mean = round(sum(w["window_ns"] for w in account["windows"]) / 16)
    measured = {f["evidence"]["measured_step_ns"] for f in _diagnose(demo)["findings"]
                if f["predicted_step_ns"] is not None and "measured_step_ns" in f["evidence"]}
    assert measured and all(abs(m - mean) <= 1 for m in measured)
    assert "fixes replayed" not in _run(["diagnose", str(demo)])
    assert _diagnose(demo)["replayed"] == {"steps": 16, "of_steps": 16, "mean_step_ns": mean}

    path = shared_trace("hta/v100_ddp2_rank1_memprofile.json.gz")
    windows = [w["window_ns"] for w in json.loads(_run(["account", str(path), "--json"]))["windows"]]
    assert len(windows) == 5
    replayed_mean = round(sum(windows[i] for i in (0, 1, 3, 4)) / 4)
    d = _diagnose(path)
    measured = {f["evidence"]["measured_step_ns"] for f in d["findings"] if f["predicted_step_ns"] is not None
                and "measured_step_ns" in f["evidence"]}
    assert measured == {replayed_mean}
    assert d["replayed"] == {"steps": 4, "of_steps": 5, "mean_step_ns": replayed_mean}  # the HTML report's note
    header = next(line for line in _run(["diagnose", str(path)]).splitlines()
                  if line.startswith("Where the step goes"))
    assert "mean of 5 analysed steps" in header and "fixes replayed on 4 of them" in header


def test_untraced_time_is_said_in_words_and_looked_into_by_what_the_trace_has() -> None:
    """The gloo rank (no Python frames): its untraced part is said by what was open ('with only
    the step's own range open'), not as an item named `nothing but the step open`, and the next
    step is a capture with stacks, since `tracewhy lines` has no frames to show there; a trace
    with frames is sent to `lines` instead."""
    from tracewhy.findings.applicability import run_facts
    from tracewhy.findings.context import Context
    from tracewhy.findings.unexplained import _advice

    path = GENERATED / "ddp_gloo_rank1.pt.trace.json.gz"
    trace = read_trace(path)
    assert "python_function" not in trace.slices.get_column("kind").cast(str).unique().to_list()
    f = next(f for f in _diagnose(path)["findings"]
             if f["code"] == "unexplained-part" and f["evidence"]["kind"] == "idle")
    assert "with only the step's own range open" in f["statement"] and "`nothing" not in f["statement"]
    assert "no Python frames" in f["next_step"] and "with_stack=True" in f["next_step"]
    facts = run_facts(Context(trace))
    assert "tracewhy lines TRACE shows the source lines" in _advice("idle", "", facts, stacks=True)


def _raw_frames(path: Path, needle: str) -> list[float]:
    """Durations (µs) of the raw file's Python frames whose name holds ``needle``."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    return [float(e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") == "python_function"
            and needle in str(e.get("name", ""))]


def test_a_user_lines_host_time_is_split_by_the_library_functions_it_calls() -> None:
    """cpu_lines_item: the account's 'host: workloads.py:78 train_step' is mostly one call of
    record_function's constructor (torch/autograd/profiler.py line 904) that the raw file shows
    lasting over 2 ms in one step: the finding says the library holds most of it, names that
    function with no more time than the raw frames last, and sends the user to time the step
    without the profiler. cpu_provenance: torch.compile's runtime leads, and on a CPU-only run
    the advice names no CUDA graphs. A trace without frames gets no split."""
    path = GENERATED / "cpu_lines_item.pt.trace.json.gz"
    steps = _diagnose(path)["steps"]
    f = next(f for f in _diagnose(path)["findings"] if f["code"] == "unexplained-part"
             and f["part"] == "host: workloads.py:78 train_step")
    lead = f["evidence"]["library"][0]
    assert lead["frame"] == "torch/autograd/profiler.py:904 __init__"
    raw = _raw_frames(path, "torch/autograd/profiler.py(904): __init__")
    steady = sum(1 for s in steps if s["steady"])
    assert max(raw) > 2000 and lead["ns_per_step"] <= sum(raw) * 1e3 / steady
    assert 0.5 * f["evidence"]["part_ns_per_step"] <= f["evidence"]["library_ns_per_step"] <= \
        f["evidence"]["part_ns_per_step"]
    assert "profiler's own Python" in f["next_step"] and "torch/autograd/profiler.py:904 __init__" in f["statement"]
    compiled = next(f for f in _diagnose(GENERATED / "cpu_provenance.pt.trace.json.gz")["findings"]
                    if f["code"] == "unexplained-part" and "library" in f["evidence"])
    assert compiled["evidence"]["library"][0]["frame"].startswith("torch/_dynamo/")
    assert "torch.compile's own per-call work" in compiled["next_step"] and "CUDA graphs" not in compiled["next_step"]
    for f in _diagnose(GENERATED / "ddp_gloo_rank1.pt.trace.json.gz")["findings"]:
        assert "library" not in f["evidence"]
