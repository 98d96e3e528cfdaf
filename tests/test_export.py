"""``tracewhy export``: the annotated trace keeps every original event, adds tracewhy's tracks,
and reads back through tracewhy's own reader.

"Kept" is checked against the source file decoded with the standard json module: the multiset
of original events (each canonicalized with sorted keys) must hash the same before and after.
Gap slices are checked against the raw GPU events: none may overlap a kernel, copy or memset.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from conftest import GENERATED, shared_trace
from tracewhy.cli import main
from tracewhy.model.cache import CacheOptions
from tracewhy.model.schema import Col, Kind
from tracewhy.readers import read_trace
from tracewhy.renderers.perfetto import CRITICAL_PATH_PID, FINDINGS_PID, GAPS_TID, UTILIZATION_COUNTER

FRESH = CacheOptions(enabled=False)
GAP_CLASSES = {"input", "sync", "launch", "host", "allocator", "comm", "graph", "dependency", "other"}


def _load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _digest(events: list[dict[str, Any]]) -> str:
    canon = sorted(json.dumps(e, sort_keys=True) for e in events)
    return hashlib.sha256("\n".join(canon).encode()).hexdigest()


def _export(src: Path, out: Path) -> dict[str, Any]:
    assert main(["export", "--no-cache", str(src), "-o", str(out)]) == 0
    return _load(out)


def test_kineto_export_keeps_every_original_event(tmp_path: Path) -> None:
    src = shared_trace("hta/a100_alexnet_critical_path.json.gz")
    original = _load(src)
    out = _export(src, tmp_path / "annotated.json.gz")
    kept = [e for e in out["traceEvents"] if e.get("cat") != "tracewhy"]
    added = [e for e in out["traceEvents"] if e.get("cat") == "tracewhy"]
    assert len(kept) == len(original["traceEvents"]) == 1408  # MANIFEST.md: 1408 events
    assert _digest(kept) == _digest(original["traceEvents"])
    for key, value in original.items():  # the header too
        if key != "traceEvents":
            assert out[key] == value, key
    assert out["tracewhyExport"]["added_events"] == len(added)

    # Gap slices sit where the GPU ran nothing: no kernel, copy or memset of the raw file overlaps one.
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in original["traceEvents"]
           if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    gaps = [e for e in added if e["ph"] == "X" and e["tid"] == GAPS_TID]
    assert gaps and {g["name"] for g in gaps} <= GAP_CLASSES
    for g in gaps:
        lo, hi = g["ts"], g["ts"] + g["dur"]
        assert not any(s < hi - 1e-3 and e > lo + 1e-3 for s, e in gpu), g
    counters = [e for e in added if e["ph"] == "C"]
    assert counters and {e["name"] for e in counters} == {UTILIZATION_COUNTER}
    assert all(0 <= e["args"]["busy %"] <= 100 for e in counters)
    findings = [e for e in added if e["ph"] == "X" and e["pid"] == FINDINGS_PID]
    assert findings and all(e["args"]["statement"] in e["name"] for e in findings)
    projected = [e for e in added if e["ph"] == "X" and e["pid"] == 0 and e["tid"] != GAPS_TID]
    assert projected  # the [param|cuda]-style annotations, on the GPU's process


def test_kineto_export_reads_back_with_the_extra_tracks(tmp_path: Path) -> None:
    src = shared_trace("hta/a100_alexnet_critical_path.json.gz")
    path = tmp_path / "annotated.json"
    doc = _export(src, path)
    before = read_trace(src, cache=FRESH)
    after = read_trace(path, cache=FRESH)
    after.check()
    kinds_before = Counter(before.slices.get_column(Col.KIND).cast(pl.String).to_list())
    kinds_after = Counter(after.slices.get_column(Col.KIND).cast(pl.String).to_list())
    n_added_slices = sum(1 for e in doc["traceEvents"] if e.get("cat") == "tracewhy" and e["ph"] == "X")
    assert kinds_after - kinds_before == Counter({Kind.OTHER.value: n_added_slices})
    k0 = before.of_kind(Kind.KERNEL).get_column(Col.DUR).sum()
    assert after.of_kind(Kind.KERNEL).get_column(Col.DUR).sum() == k0
    names = set(after.threads.get_column("name").to_list())
    assert {"tracewhy: GPU idle gaps", "tracewhy findings"} <= names
    gap_slices = after.slices.filter(pl.col(Col.TID) == GAPS_TID)
    assert set(gap_slices.get_column(Col.NAME).cast(pl.String).to_list()) <= GAP_CLASSES


def test_nsys_export_is_a_chrome_trace_of_the_same_content(tmp_path: Path) -> None:
    src = shared_trace("nsys/nvfuser_matmul_h200_2024.6.sqlite.gz")
    doc = _export(src, tmp_path / "nsys.json.gz")
    assert doc["tracewhyExport"]["original_written_from"] == "model"
    model = read_trace(src, cache=FRESH)
    back = read_trace(tmp_path / "nsys.json.gz", cache=FRESH)
    back.check()
    ours = back.slices.filter(pl.col(Col.KIND) != Kind.OTHER.value)
    theirs = model.slices.filter(pl.col(Col.KIND) != Kind.OTHER.value)
    assert Counter(ours.get_column(Col.KIND).cast(pl.String).to_list()) == \
        Counter(theirs.get_column(Col.KIND).cast(pl.String).to_list())
    # Times are written as exact decimal microseconds: every duration comes back to the ns.
    for kind in (Kind.KERNEL, Kind.MEMCPY, Kind.RUNTIME):
        assert sorted(back.of_kind(kind).get_column(Col.DUR).to_list()) == \
            sorted(model.of_kind(kind).get_column(Col.DUR).to_list())
    # Launch links survive (correlation ids in the args): as many kernels linked as in the model.
    linked = back.of_kind(Kind.KERNEL).get_column(Col.LAUNCH).is_not_null().sum()
    assert linked == model.of_kind(Kind.KERNEL).get_column(Col.LAUNCH).is_not_null().sum() > 0
    assert "tracewhy: GPU idle gaps" in set(back.threads.get_column("name").to_list())


def test_cpu_only_trace_gets_findings_but_no_gpu_tracks(tmp_path: Path) -> None:
    doc = _export(GENERATED / "cpu_slow_step_base.pt.trace.json.gz", tmp_path / "cpu.json")
    added = [e for e in doc["traceEvents"] if e.get("cat") == "tracewhy"]
    assert added and all(e["pid"] in (FINDINGS_PID, CRITICAL_PATH_PID) for e in added)  # the host's path only
    assert any(e["name"].startswith("[trust] cpu-only-trace") for e in added if e["ph"] == "X")


def test_export_refuses_to_overwrite_its_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "t.json.gz"
    src.write_bytes((GENERATED / "cpu_slow_step_base.pt.trace.json.gz").read_bytes())
    assert main(["export", str(src), "-o", str(src)]) == 2
    assert "overwrite the input" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["export", "report"])
def test_writers_refuse_to_overwrite_their_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 command: str) -> None:
    # A fuzz run found `report t.json -o t.json` replacing the trace with HTML (export had the
    # guard, report did not). Same path, a hard link to it, and a file in an input directory
    # of rank traces are all refused, and the input keeps its bytes.
    data = (GENERATED / "cpu_slow_step_base.pt.trace.json.gz").read_bytes()
    src = tmp_path / "t.json.gz"
    src.write_bytes(data)
    link = tmp_path / "link.json.gz"
    os.link(src, link)
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    (ranks / "rank0.json.gz").write_bytes(data)
    for trace, out in ((src, src), (src, link), (ranks, ranks / "rank0.json.gz")):
        assert main([command, str(trace), "-o", str(out)]) == 2
        assert "overwrite the input" in capsys.readouterr().err
    assert src.read_bytes() == data and (ranks / "rank0.json.gz").read_bytes() == data
