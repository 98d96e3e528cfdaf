"""Scalar reads: one read per outermost call, attributed to the optimizer or
to the training loop (with its annotation and Python line), a sync on a GPU trace only when a
synchronize or synchronous copy ran inside, and advice that fits where the reads come from.
Expected counts come from the raw JSON: every read goes through one aten::item."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import GENERATED, shared_trace
from tracewhy.cli import main


def _events(path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return [e for e in events if e.get("ph") == "X"]


def _finding(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["diagnose", str(path), "--json", "--no-cache"]) == 0
    found = {f["code"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    f: dict[str, Any] = found["scalar-read-per-step"]
    return f


def test_adam_single_tensor_reads_are_the_optimizers(capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/gen_traces/optimizer_traces.py: Adam(foreach=False) on CPU reads each of the six
    parameters' step counters per step; the loop reads the loss once, in log_loss()."""
    path = GENERATED / "cpu_adam_item.pt.trace.json.gz"
    ev = _events(path)
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    items = [e for e in ev if e["name"] == "aten::item"]
    adam = [e for e in ev if e["name"].startswith("Optimizer.step#Adam.step")]
    in_adam = [i for i in items if any(a["tid"] == i["tid"] and a["ts"] <= i["ts"] <= a["ts"] + a["dur"]
                                       for a in adam)]
    f = _finding(path, capsys)
    assert f["evidence"]["calls"] == len(items) == 35
    assert f["evidence"]["from_optimizer"] == len(in_adam) == 30
    assert f["evidence"]["per_step"] == pytest.approx(len(items) / len(steps))
    assert "6.0 inside Optimizer.step#Adam.step" in f["statement"]
    # The trace holds log_loss's def line, not the line of its .item() call.
    assert ("1.0 in the training loop (most at user function log_loss defined at optimizer_traces.py:18)"
            in f["statement"])
    assert "foreach=True or fused=True" in f["next_step"] and "capturable=True" in f["next_step"]
    assert "accumulate losses" in f["next_step"]  # for the one read the loop makes


def test_item_and_its_local_scalar_dense_are_one_read(capsys: pytest.CaptureFixture[str]) -> None:
    """Two reads per step in the loop (loss and accuracy): 4.0 per step was reported before."""
    path = GENERATED / "cpu_item_sync.pt.trace.json.gz"
    ev = _events(path)
    items = [e for e in ev if e["name"] == "aten::item"]
    inner = [e for e in ev if e["name"] == "aten::_local_scalar_dense"]
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    assert len(inner) == len(items)
    f = _finding(path, capsys)
    assert f["evidence"]["calls"] == len(items)
    assert f["evidence"]["per_step"] == pytest.approx(len(items) / len(steps)) == 2.0
    assert "foreach" not in f["next_step"]


def test_zero_microsecond_pairs_count_once() -> None:
    """HTA's 2023 A100 all-to-all trace writes integer µs: most aten::item calls and their
    _local_scalar_dense last 0 µs, at one instant or at the item's end, so containment cannot
    nest them. There are 945 reads (945 aten::item, 5 of them under aten::is_nonzero)."""
    import polars as pl

    import tracewhy
    from tracewhy.analyses.host_activity import build_host_index
    from tracewhy.analyses.steps import steps
    from tracewhy.analyses.syncs import syncs

    path = shared_trace("hta/a100_16rank_rank0_alltoall.json.gz")
    items = [e for e in _events(path) if e["name"] == "aten::item"]
    trace = tracewhy.load(path)
    reads = syncs(trace, steps(trace), build_host_index(trace)).scalar_reads
    assert int(reads.get_column("calls").sum()) == len(items) == 945
    assert reads.filter(pl.col("name") == "aten::_local_scalar_dense").height == 0


def test_gpu_trace_counts_only_reads_that_synchronized(capsys: pytest.CaptureFixture[str]) -> None:
    """HTA's V100 trace: 4 reads per step in the loop synchronize (a cudaMemcpy or synchronize
    inside each); FusedAdam's read of its step does not, and is not blamed."""
    path = shared_trace("hta/tracediff_test_v100_rank1of2.json.gz")
    ev = _events(path)
    syncing = [e for e in ev if e.get("cat") in ("cuda_runtime", "Runtime")
               and ("Synchronize" in e["name"] or e["name"] in ("cudaMemcpy", "cudaMemcpy2D"))]
    blocked = [i for i in ev if i["name"] == "aten::item" and any(
        c["tid"] == i["tid"] and i["ts"] <= c["ts"] and c["ts"] + c["dur"] <= i["ts"] + i["dur"] for c in syncing)]
    f = _finding(path, capsys)
    assert f["evidence"]["calls"] == len(blocked) > 0
    assert f["evidence"]["from_optimizer"] == 0
    assert all(r["blocking_calls"] > 0 for r in f["evidence"]["reads"])
    assert "each blocked on the GPU" in f["statement"] and "foreach" not in f["next_step"]
