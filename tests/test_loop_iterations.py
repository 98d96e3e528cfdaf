"""Traces without step markers: the steps are the loop's iterations, found from the op it repeats
once an iteration at the top level of one thread (the DataLoader fetch, Optimizer.step); a slow
first iteration is warm-up and stays out of the steady figures; critical-path analyses the same
iterations (or the whole trace), never nothing. Expected figures come from the raw JSON."""

from __future__ import annotations

import gzip
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

import tracewhy
from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from tracewhy.analyses.critical_path import critical_path
from tracewhy.analyses.iterations import WHOLE_TRACE_NAME
from tracewhy.analyses.loop_iterations import IterationSource
from tracewhy.analyses.steps import StepCol, steps
from tracewhy.cli import main

US = 1000
FETCH = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
RESNET50 = "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"
AUTOGRAD_API = GENERATED / "cpu_autograd_api_loader.pt.trace.json.gz"


def _events(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    events: list[dict[str, Any]] = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)["traceEvents"]
    return events


def _without_step_markers(path: Path, tmp_path: Path) -> Path:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    out = tmp_path / f"{path.name.split('.')[0]}.no_steps.json"
    out.write_text(json.dumps(doc))
    return out


def _fetch_starts_us(events: list[dict[str, Any]]) -> list[float]:
    return sorted(e["ts"] for e in events if e.get("ph") == "X" and e.get("name") == FETCH)


def test_resnet50_without_markers_has_one_step_per_dataloader_fetch(tmp_path: Path) -> None:
    """The 2021 ResNet-50 capture (tb_plugin's sample) with its ProfilerStep events removed: six
    fetches at the top of the main thread, five whole iterations between them."""
    path = _without_step_markers(shared_trace(RESNET50), tmp_path)
    starts = _fetch_starts_us(_events(path))
    assert len(starts) == 6
    r = steps(tracewhy.load(path))
    assert r.source == IterationSource.DATALOADER and r.marker == FETCH
    assert r.table.height == 5 and r.warmup == 0  # steps #5-#10 of the run: all warm
    assert r.table.get_column(StepCol.TS).to_list() == [round(s * US) for s in starts[:-1]]
    assert r.table.get_column(StepCol.DUR).to_list() == pytest.approx(
        [(b - a) * US for a, b in itertools.pairwise(starts)], abs=2)
    assert r.note is not None and "one per DataLoader fetch" in r.note and "repeats 6 times at the top level" in r.note
    # Each iteration is the period ProfilerStep measured: the marked steps' mean agrees within 2%.
    marked = steps(tracewhy.load(shared_trace(RESNET50)))
    assert r.stats is not None and marked.stats is not None
    assert r.stats.mean_ns == pytest.approx(marked.stats.mean_ns, rel=0.02)


def test_diagnose_without_markers_reports_per_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same capture: the input-bound cause is reported per steady iteration, not over the trace."""
    path = _without_step_markers(shared_trace(RESNET50), tmp_path)
    assert main(["diagnose", str(path), "--json", "--no-cache"]) == 0
    found = {f["code"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert "no-step-markers" not in found
    assert "loop's iterations" in found["step-marker-inferred"]["statement"]
    idle = found["gpu-idle-input"]
    assert "per step" in idle["statement"] and "over the trace" not in idle["statement"]


def test_critical_path_without_markers_takes_the_iterations(tmp_path: Path) -> None:
    path = _without_step_markers(shared_trace(RESNET50), tmp_path)
    r = critical_path(tracewhy.load(path))
    assert r.steps.height == 5 and r.marker == FETCH
    starts = _fetch_starts_us(_events(path))
    assert r.steps.get_column("window_start_ns").to_list() == [round(s * US) for s in starts[:-1]]


def test_critical_path_with_nothing_repeating_takes_the_whole_trace(capsys: pytest.CaptureFixture[str]) -> None:
    """HTA's multi-stream event-sync trace: no steps, no fetch, no optimizer: one window."""
    path = shared_trace("hta/a100_cuda_event_sync_multistream.json.gz")
    r = critical_path(tracewhy.load(path))
    assert r.steps.height == 1 and r.marker == WHOLE_TRACE_NAME
    assert main(["critical-path", str(path), "--no-cache"]) == 0
    assert "no steps to analyse" not in capsys.readouterr().out


def test_slow_first_iteration_is_warm_up_and_out_of_the_steady_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """The autograd profiler API around 7 iterations over a slow DataLoader whose first access
    fills a cache (250 ms): the first iteration is warm-up, the steady ones are input-bound."""
    events = _events(AUTOGRAD_API)
    assert not any(str(e.get("name", "")).startswith("ProfilerStep") for e in events)
    starts = _fetch_starts_us(events)
    periods = [(b - a) * US for a, b in itertools.pairwise(starts)]
    assert periods[0] > 5 * statistics.median(periods[1:])  # the planted cache fill
    r = steps(tracewhy.load(AUTOGRAD_API))
    assert r.table.height == len(periods) and r.warmup == 1 and "above" in r.warmup_reason
    assert r.stats is not None and r.stats.count == len(periods) - 1
    assert r.stats.max_ns == pytest.approx(max(periods[1:]), abs=2)
    fetch_ns = {round(e["ts"] * US): e["dur"] * US for e in events if e.get("ph") == "X" and e.get("name") == FETCH}
    steady_fetch = statistics.mean(fetch_ns[round(s * US)] for s in starts[1:-1])
    assert main(["diagnose", str(AUTOGRAD_API), "--json", "--no-cache"]) == 0
    found = {f["code"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    bound = found["input-bound"]
    assert bound["evidence"]["steady_steps"] == len(periods) - 1
    # Per steady step, the fetch (and what it holds) is the data loading part: the warm-up's
    # 250 ms cache fill is not in it.
    assert bound["evidence"]["mean_dataloader_ns_per_step"] == pytest.approx(steady_fetch, rel=0.05)


def test_a_faster_first_step_is_kept() -> None:
    """A 3-step capture (ProfilerStep#2-#4) whose first step trains on a batch 8x smaller: it is
    faster than the others by far, and it is one of the run's steps, not warm-up."""
    path = GENERATED / "cpu_faster_first_step.pt.trace.json.gz"
    marks = sorted((e["ts"], e["name"], e["dur"]) for e in _events(path)
                   if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))
    assert [m[1] for m in marks] == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert marks[0][2] < 0.5 * min(m[2] for m in marks[1:])
    r = steps(tracewhy.load(path))
    assert r.warmup == 0 and "kept" in r.warmup_reason
    assert r.stats is not None and r.stats.count == 3 and r.stats.min_ns == round(marks[0][2] * US)


def test_optimizer_steps_delimit_iterations_when_nothing_fetches() -> None:
    """TraceLens' MI300X ResNet-18 capture: no ProfilerStep, no DataLoader; five
    Optimizer.step#SGD.step at the top of the main thread (under Python frames only). The first
    iteration (116 ms) is faster than the later ones (about 1.07 s, hipFree storms): kept."""
    path = shared_trace("tracelens/mi300x_ddp_resnet18_no_pool_train.json.gz")
    ends = sorted(e["ts"] + e["dur"] for e in _events(path) if e.get("ph") == "X"
                  and e.get("cat") == "user_annotation" and e["name"] == "Optimizer.step#SGD.step")
    r = steps(tracewhy.load(path))
    assert r.source == IterationSource.OPTIMIZER and r.table.height == len(ends) - 1 == 4
    assert r.table.get_column(StepCol.DUR).to_list() == pytest.approx(
        [(b - a) * US for a, b in itertools.pairwise(ends)], abs=2)
    assert r.warmup == 0


def test_a_benchmark_loop_of_blocks_and_its_cold_first_pass() -> None:
    """TraceLens' MI300X normalization benchmark: three passes over ten top-level blocks, no
    ProfilerStep. Each pass is an iteration (first block to first block); the first pass (lazy
    initialization: 1.17 s against 3.4 ms) is warm-up, though two iterations give no spread."""
    path = shared_trace("tracelens/mi300x_normalization_layers.json.gz")
    starts = sorted(e["ts"] for e in _events(path) if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                    and e["name"] == "BatchNorm affine=True")
    assert len(starts) == 3
    r = steps(tracewhy.load(path))
    assert r.source == IterationSource.ANNOTATION and r.marker == "BatchNorm affine=True"
    assert r.table.get_column(StepCol.TS).to_list() == [round(s * US) for s in starts[:-1]]
    assert r.warmup == 1 and r.stats is not None and r.stats.count == 1
    assert r.stats.mean_ns == pytest.approx((starts[2] - starts[1]) * US, abs=2)


# --- the rule on tiny traces ------------------------------------------------------------------------


def test_the_fetch_is_preferred_and_nested_ones_do_not_count(tmp_path: Path) -> None:
    b = KinetoBuilder()
    for i in range(4):
        t = i * 1000.0
        b.op(FETCH, t, 100)
        b.op("aten::linear", t + 200, 300)
        b.op(FETCH, t + 250, 10)  # nested inside an op: not the loop's head
        b.annotation("Optimizer.step#SGD.step", t + 600, 100)
    r = steps(tracewhy.load(b.write(tmp_path / "t.json")))
    assert r.source == IterationSource.DATALOADER and r.table.height == 3
    assert r.table.get_column(StepCol.TS).to_list() == [0, 1000 * US, 2000 * US]


def test_uneven_repeats_are_not_iterations(tmp_path: Path) -> None:
    b = KinetoBuilder()
    for t in (0.0, 100.0, 5000.0, 5100.0, 20000.0):  # bursts, not a loop's period
        b.annotation("Optimizer.step#SGD.step", t, 50)
    r = steps(tracewhy.load(b.write(tmp_path / "t.json")))
    assert r.table.height == 0
