"""Warm-up by what the steps are, not by position: the first recorded step is
left out when it is the run's first iteration (ProfilerStep#0) or a slow outlier (more than 3
MADs above the others' median), never for being faster, and `steps` says why. Step numbers and
durations come from the JSON."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest

import tracewhy
from conftest import GENERATED, shared_trace
from tracewhy.analyses.steps import steps
from tracewhy.cli import main


def _raw_steps(path: Path) -> list[tuple[int, float]]:
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    marks = sorted((e["ts"], e["name"], e["dur"]) for e in events
                   if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))
    return [(int(name.split("#")[1]), dur) for _, name, dur in marks]


@pytest.mark.parametrize(("path", "warmup", "why"), [
    # schedule(wait=1, warmup=1, active=5): the first recorded step is iteration 2, as warm as the rest.
    (GENERATED / "cpu_eager_schedule.pt.trace.json.gz", 0, "is not the run's first iteration"),
    # No schedule: ProfilerStep#0 is the iteration that compiled the model.
    (GENERATED / "cpu_compile.pt.trace.json.gz", 1, "step #0 is the run's first iteration"),
    # The same loop with schedule(wait=1, warmup=1), but its first step took 3.1x the others.
    (GENERATED / "cpu_slow_step_base.pt.trace.json.gz", 1, "MADs above"),
])
def test_generated_traces(path: Path, warmup: int, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    raw = _raw_steps(path)
    r = steps(tracewhy.load(path))
    assert r.warmup == warmup and why in r.warmup_reason
    assert r.table.get_column("number").to_list() == [n for n, _ in raw]
    if "MADs" in why:
        rest = [d for _, d in raw[1:]]
        assert raw[0][1] > 3 * statistics.median(rest)
        assert f"{statistics.median(rest) / 1e3:.3f} ms" in r.warmup_reason
    assert main(["steps", str(path), "--json", "--no-cache"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["warmup"] == warmup and doc["warmup_reason"] == r.warmup_reason


def test_first_step_far_below_the_others_is_warm_up_only_while_the_gpu_queue_fills() -> None:
    """HTA's V100 trace: the CPU runs ahead while the GPU's queue fills, so ProfilerStep#101
    spans 35 ms where the steady steps span 96 ms. Being faster does not make it warm-up; the
    GPU work it launched (counted here from the raw launches' correlations) being well over
    twice its span does: its span is not the loop's period."""
    path = shared_trace("hta/v100_rank0_displayTimeUnit_ns_fractional_us.json.gz")
    raw = _raw_steps(path)
    assert raw[0][0] == 101 and raw[0][1] < 0.5 * statistics.median(d for _, d in raw[1:])
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    first = min((e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")),
                key=lambda e: e["ts"])
    launched = {e["args"]["correlation"] for e in events
                if e.get("ph") == "X" and str(e.get("cat")).lower() in ("cuda_runtime", "runtime")
                and first["ts"] <= e["ts"] < first["ts"] + first["dur"] and "correlation" in e.get("args", {})}
    kernel_us = sum(e["dur"] for e in events if e.get("ph") == "X" and str(e.get("cat")).lower() == "kernel"
                    and e.get("args", {}).get("correlation") in launched)
    assert kernel_us > 2 * first["dur"]
    r = steps(tracewhy.load(path))
    assert r.warmup == 1 and "the GPU's queue filled" in r.warmup_reason


def test_explicit_warmup_wins() -> None:
    from tracewhy.analyses.steps import StepsOptions

    r = steps(tracewhy.load(GENERATED / "cpu_eager_schedule.pt.trace.json.gz"), StepsOptions(warmup=2))
    assert r.warmup == 2 and r.warmup_reason == "--warmup 2"


def test_a_step_number_past_int64_is_said_not_taken(tmp_path: Path) -> None:
    """A real capture with one marker renamed ProfilerStep#99999999999999999999999: the step is
    still a step (ordered by time), its number unknown, and the note says so; before, nothing
    was said."""
    from tracewhy.analyses.steps import StepCol

    src = GENERATED / "cpu_adam_memory.pt.trace.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    renamed = 0
    for e in doc["traceEvents"]:
        if e.get("name") == "ProfilerStep#3":
            e["name"], renamed = "ProfilerStep#99999999999999999999999", renamed + 1
    assert renamed == 1
    path = tmp_path / "huge_step.json"
    path.write_text(json.dumps(doc))
    before = steps(tracewhy.load(src))
    r = steps(tracewhy.load(path))
    assert r.table.height == before.table.height  # still a step
    assert None in r.table.get_column(StepCol.NUMBER).to_list()
    assert r.note is not None and "past int64" in r.note and "ProfilerStep#99999999999999999999999" in r.note
    assert before.note is None or "past int64" not in before.note
