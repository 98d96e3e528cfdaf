"""``memory`` across ranks and ``memory A --vs B``, on real captures: a two-rank gloo DDP run whose
rank 1 alone keeps a planted 2 MiB buffer, and runs A, A again and B of one loop where B keeps a
planted 4 MiB table (scripts/gen_traces/memory_compare_traces.py); ResNet-50 runs of tb_plugin's
samples (the same program with 0 and 4 loader workers). Peaks and growths are checked against
sums computed here from the raw JSON; snapshots are built from torch's documented layout."""

from __future__ import annotations

import dataclasses
import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from conftest import GENERATED, shared_trace
from test_memory import MiB, build_snapshot
from tracewhy.cli import main

RANKS = [GENERATED / f"cpu_memory_ranks_rank{r}.pt.trace.json.gz" for r in (0, 1)]
VS_A, VS_A_RERUN, VS_B = (GENERATED / f"cpu_memory_vs_{n}.pt.trace.json.gz" for n in ("a", "a_rerun", "b"))
#: The planted buffers' bytes, as the generator makes them (float32 elements x 4).
RANK_BUFFER_BYTES, LOOKUP_BYTES = 512 * 1024 * 4, 1024 * 1024 * 4
RESNET_NW0 = "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"
RESNET_NW4 = "kineto/resnet50_nw4_span1_worker0.1623212756351.pt.trace.json.gz"


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["memory", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _memory_events(path: Path, device_type: int = 0) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e["args"] for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == device_type]


def _raw_peak(path: Path, device_type: int = 0) -> int:
    """The device's peak of the allocator's own Total Allocated, from the raw JSON; for traces of
    PyTorch < 1.10, which carry only Bytes, the peak of their running sum from the trace's start."""
    events = _memory_events(path, device_type)
    if "Total Allocated" not in events[0]:
        return int(np.cumsum([a["Bytes"] for a in events]).max())
    return max(int(a["Total Allocated"]) for a in events)


def _never_freed(path: Path, nbytes: int) -> int:
    """How many allocations of exactly ``nbytes`` the raw JSON never frees (a kept buffer)."""
    live: dict[int, int] = {}
    for a in _memory_events(path):
        if a["Bytes"] > 0:
            live[a["Addr"]] = a["Bytes"]
        else:
            live.pop(a["Addr"], None)
    return sum(1 for b in live.values() if b == nbytes)


def test_ranks_peak_imbalance_and_the_planted_site(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json([str(p) for p in RANKS], capsys)
    peaks = [_raw_peak(p) for p in RANKS]
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert {r["rank_from"] for r in doc["ranks"]} == {"distributedInfo"}
    assert [r["peak_allocated_bytes"] for r in doc["ranks"]] == peaks
    assert doc["max_rank"] == 1 and doc["max_peak_bytes"] == max(peaks)
    assert doc["median_peak_bytes"] == float(np.median(peaks))
    # Rank 1 alone keeps the planted buffer; it is the one site whose bytes differ between ranks.
    assert (_never_freed(RANKS[0], RANK_BUFFER_BYTES), _never_freed(RANKS[1], RANK_BUFFER_BYTES)) == (0, 1)
    differ = [s for s in doc["sites"] if s["spread_bytes"] > 0]
    assert len(differ) == 1
    (site,) = differ
    assert site["op"] == "aten::zeros" and site["size_class_bytes"] == RANK_BUFFER_BYTES
    assert site["bytes_by_rank"] == [0, RANK_BUFFER_BYTES] and site["max_rank"] == 1
    # The sites add up to each rank's peak.
    for i, peak in enumerate(peaks):
        assert sum(s["bytes_by_rank"][i] for s in doc["sites"]) == peak
    (finding,) = doc["findings"]
    assert finding["code"] == "memory-rank-imbalance" and "rank 1" in finding["statement"]
    assert "aten::zeros" in finding["statement"]


def test_ranks_from_a_directory_and_from_file_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """distributedInfo decides over a misleading file name; without it, the file name decides."""
    for name, target in (("job_rank7.pt.trace.json.gz", RANKS[0]), ("job_rank3.pt.trace.json.gz", RANKS[1])):
        (tmp_path / name).symlink_to(target)
    doc = _json([str(tmp_path)], capsys)
    assert [(r["rank"], r["rank_from"]) for r in doc["ranks"]] == [(0, "distributedInfo"), (1, "distributedInfo")]
    plain = tmp_path / "plain"
    plain.mkdir()
    for name, target in (("run_rank1.pt.trace.json.gz", VS_A), ("run_rank0.pt.trace.json.gz", VS_B)):
        (plain / name).symlink_to(target)
    doc = _json([str(plain)], capsys)
    assert [(r["rank"], r["rank_from"]) for r in doc["ranks"]] == [(0, "file name"), (1, "file name")]
    assert doc["max_rank"] == 0 and doc["ranks"][0]["peak_allocated_bytes"] == _raw_peak(VS_B)


def test_ranks_without_rank_metadata_or_name_fail_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(VS_A), str(VS_B)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot tell which rank" in err[0] and VS_A.name in err[0]


def test_vs_names_what_grew_against_the_raw_peaks(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json([str(VS_A), "--vs", str(VS_B)], capsys)
    growth = _raw_peak(VS_B) - _raw_peak(VS_A)
    assert doc["peak_growth_bytes"] == growth == LOOKUP_BYTES
    peak = {m["measure"]: m for m in doc["measures"]}["peak_allocated"]
    assert (peak["a_bytes"], peak["b_bytes"], peak["beyond_noise"]) == (_raw_peak(VS_A), _raw_peak(VS_B), True)
    top = doc["sites"][0]
    assert top["growth_bytes"] == LOOKUP_BYTES and top["op"] == "aten::zeros"
    assert "build_lookup_table" in top["frame"] and top["beyond_noise"]
    assert _never_freed(VS_B, LOOKUP_BYTES) == 1 and _never_freed(VS_A, LOOKUP_BYTES) == 0
    assert [s for s in doc["sites"] if s["beyond_noise"]] == [top]
    assert sum(s["growth_bytes"] for s in doc["sites"]) == growth
    assert doc["ops"][0]["op"] == "aten::zeros" and doc["ops"][0]["growth_bytes"] == LOOKUP_BYTES
    assert sum(o["growth_bytes"] for o in doc["ops"]) == growth
    (finding,) = doc["findings"]
    assert finding["code"] == "memory-grew" and "build_lookup_table" in finding["statement"]


def test_a_run_without_python_frames_is_compared_by_op_and_size_class() -> None:
    """B captured without with_stack (its frames dropped here): the sites lose their frames on
    both sides, so the same allocations still meet, and only the planted one grew."""
    from tracewhy.analyses.memory import analyze_memory
    from tracewhy.analyses.memory_compare import compare_runs, trace_capture
    from tracewhy.readers import read_trace

    a, b = (trace_capture(analyze_memory(read_trace(p)), p.name) for p in (VS_A, VS_B))
    assert a is not None and b is not None
    b = dataclasses.replace(b, sites=b.sites.with_columns(pl.lit(None, dtype=pl.String).alias("frame")))
    g = compare_runs(a, b)
    grown = g.sites.filter(pl.col("beyond_noise"))
    assert grown.select("op", "frame", "size_class_bytes", "growth_bytes").rows() == [
        ("aten::zeros", None, LOOKUP_BYTES, LOOKUP_BYTES)]
    assert g.sites.get_column("frame").null_count() == g.sites.height


def test_vs_a_rerun_of_the_same_program_is_noise(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json([str(VS_A), "--vs", str(VS_A_RERUN)], capsys)
    assert doc["peak_growth_bytes"] == _raw_peak(VS_A_RERUN) - _raw_peak(VS_A)
    assert not any(s["beyond_noise"] for s in doc["sites"]) and doc["findings"] == []


@pytest.mark.slow  # two 1.2 MB traces; test_vs_a_rerun_of_the_same_program_is_noise covers the rule fast
def test_vs_on_real_resnet_runs_with_other_loader_workers_is_noise(capsys: pytest.CaptureFixture[str]) -> None:
    """tb_plugin's ResNet-50 samples: one program with 0 and 4 DataLoader workers. The GPU's
    peak moves by a block, well within the noise: no growth is claimed."""
    a, b = shared_trace(RESNET_NW0), shared_trace(RESNET_NW4)
    doc = _json([str(a), "--vs", str(b)], capsys)
    assert doc["a"]["device"] == doc["b"]["device"] == "cuda:0"
    assert doc["peak_growth_bytes"] == _raw_peak(b, 1) - _raw_peak(a, 1)
    assert abs(doc["peak_growth_bytes"]) < doc["noise_bytes"] and doc["findings"] == []


def _snapshot_on(device: int, extra_mib: int = 0) -> dict[str, Any]:
    """``build_snapshot``'s state on ``device``, with ``extra_mib`` more held from e.py:50."""
    snap = build_snapshot()
    for seg in snap["segments"]:
        seg["device"] = device
    if extra_mib:
        addr = 0x7F00_2000_0000
        snap["segments"].append({
            "device": device, "address": addr, "total_size": extra_mib * MiB, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "allocated_size": extra_mib * MiB, "active_size": extra_mib * MiB,
            "is_expandable": False, "blocks": [{"address": addr, "size": extra_mib * MiB,
                                                "requested_size": extra_mib * MiB, "state": "active_allocated",
                                                "frames": [{"filename": "e.py", "line": 50, "name": "keep"}]}]})
    snap["device_traces"] = [[] for _ in range(device)] + snap["device_traces"]
    return snap


def _pickle(path: Path, data: Any) -> Path:
    path.write_bytes(pickle.dumps(data, protocol=4))
    return path


def test_snapshots_ranks_by_device_and_vs_by_frame(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _pickle(tmp_path / "snap_a.pickle", _snapshot_on(0))
    b = _pickle(tmp_path / "snap_b.pickle", _snapshot_on(1, extra_mib=6))
    doc = _json([str(a), str(b)], capsys)
    assert [(r["rank"], r["rank_from"], r["device"]) for r in doc["ranks"]] == [
        (0, "snapshot device", "cuda:0"), (1, "snapshot device", "cuda:1")]
    assert doc["ranks"][1]["peak_allocated_bytes"] - doc["ranks"][0]["peak_allocated_bytes"] == 6 * MiB
    assert doc["sites"][0]["frame"] == "e.py:50 keep" and doc["sites"][0]["bytes_by_rank"] == [0, 6 * MiB]
    (tmp_path / "notes.txt").write_text("not a rank")  # a directory holds other files too
    assert [r["rank"] for r in _json([str(tmp_path)], capsys)["ranks"]] == [0, 1]
    doc = _json([str(a), "--vs", str(b)], capsys)
    assert doc["peak_growth_bytes"] == 6 * MiB and doc["sites"][0]["frame"] == "e.py:50 keep"
    assert doc["sites"][0]["growth_bytes"] == 6 * MiB


def test_vs_of_different_kinds_fails_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = _pickle(tmp_path / "snap.pickle", build_snapshot())
    assert main(["memory", str(VS_A), "--vs", str(snap)]) not in (0, 70)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a trace, B a snapshot" in err[0]
    timeline = GENERATED / "memory_timeline" / "cpu_adam_memory_timeline.json.gz"
    assert main(["memory", str(VS_A), "--vs", str(timeline)]) not in (0, 70)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "memory-timeline export cannot be compared" in err[0]


def test_the_python_api_mirrors_the_command() -> None:
    import tracewhy as tw
    from tracewhy.reports.memory import MemoryGrowthReport, MemoryRanksReport

    ranks = tw.memory([str(p) for p in RANKS])
    assert isinstance(ranks, MemoryRanksReport) and ranks.result.max_rank == 1
    assert ranks.result.ranks.get_column("peak_allocated_bytes").to_list() == [_raw_peak(p) for p in RANKS]
    grew = tw.memory(VS_A, vs=VS_B, top=3)
    assert isinstance(grew, MemoryGrowthReport) and grew.result.peak_growth_bytes == LOOKUP_BYTES
    assert grew.result.sites.height == 3


def test_snapshots_on_one_device_number_take_their_ranks_from_file_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two nodes' local rank 0 both record device 0: the file names tell the ranks apart."""
    a = _pickle(tmp_path / "node0_rank0.pickle", _snapshot_on(0))
    b = _pickle(tmp_path / "node1_rank8.pickle", _snapshot_on(0, extra_mib=2))
    doc = _json([str(a), str(b)], capsys)
    assert [(r["rank"], r["rank_from"]) for r in doc["ranks"]] == [(0, "file name"), (8, "file name")]


def test_two_traces_of_one_rank_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "again_rank1.pt.trace.json.gz").symlink_to(RANKS[0])
    assert main(["memory", str(RANKS[0]), str(tmp_path / "again_rank1.pt.trace.json.gz")]) not in (0, 70)
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" not in line]
    assert len(err) == 1 and "rank 0 again" in err[0]


def test_vs_on_real_bert_runs_names_the_grown_site_and_the_slack(capsys: pytest.CaptureFixture[str]) -> None:
    """TraceLens's BERT-small inference, one program on an H100 (A) and an MI300X (B): on the
    MI300X aten::linear holds a 76 MiB block at the peak that the H100 run does not, and the
    allocator reserves 55 MiB more above what is allocated."""
    a = shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz")
    b = shared_trace("tracelens/mi300x_bert-small_bs1_seq512.json.gz")
    doc = _json([str(a), "--vs", str(b)], capsys)

    def at_peak(path: Path) -> tuple[int, int, list[int]]:
        """Allocated and reserved at the first event at the peak, and the sizes live then."""
        with gzip.open(path, "rt") as f:
            events = [e["args"] for e in json.load(f)["traceEvents"]
                      if e.get("name") == "[memory]" and e["args"].get("Device Type") != 0]
        at = max(range(len(events)), key=lambda i: (events[i]["Total Allocated"], -i))
        live: dict[int, int] = {}
        for e in events[:at + 1]:
            if e["Bytes"] > 0:
                live[e["Addr"]] = e["Bytes"]
            else:
                live.pop(e["Addr"], None)
        return int(events[at]["Total Allocated"]), int(events[at]["Total Reserved"]), sorted(live.values())

    (alloc_a, res_a, live_a), (alloc_b, res_b, live_b) = at_peak(a), at_peak(b)
    assert 76 * MiB in live_b and 76 * MiB not in live_a
    measures = {m["measure"]: m for m in doc["measures"]}
    assert (measures["peak_allocated"]["a_bytes"], measures["peak_allocated"]["b_bytes"]) == (alloc_a, alloc_b)
    assert measures["slack_at_peak"]["growth_bytes"] == (res_b - alloc_b) - (res_a - alloc_a)
    assert doc["sites"][0]["op"] == "aten::linear" and doc["sites"][0]["growth_bytes"] == 76 * MiB
    (finding,) = doc["findings"]
    assert finding["code"] == "memory-grew" and "slack at the peak" in finding["statement"]


def test_vs_with_only_the_slack_grown_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """B holds a 64 MiB segment with nothing allocated in it: allocated is the same, the reserved
    memory above it is not."""
    b_snap = _snapshot_on(0)
    addr = 0x7F00_3000_0000
    b_snap["segments"].append({
        "device": 0, "address": addr, "total_size": 64 * MiB, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "allocated_size": 0, "active_size": 0, "is_expandable": False,
        "blocks": [{"address": addr, "size": 64 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]})
    a = _pickle(tmp_path / "a.pickle", _snapshot_on(0))
    b = _pickle(tmp_path / "b.pickle", b_snap)
    doc = _json([str(a), "--vs", str(b)], capsys)
    measures = {m["measure"]: m for m in doc["measures"]}
    assert doc["peak_growth_bytes"] == 0 and measures["slack_at_peak"]["growth_bytes"] == 64 * MiB
    (finding,) = doc["findings"]
    assert finding["code"] == "memory-grew" and "did not grow" in finding["statement"]
    assert "expandable_segments" in finding["next_step"]
