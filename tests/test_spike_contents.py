"""``step-time-spikes`` says what the long steps hold: the ops they call more often, the untraced
time they add and where it falls, and the schedule they come on. Checked on real captures with
work planted every few steps (``scripts/gen_traces/spike_traces.py``: an evaluation every 4th
step, a checkpoint save every 3rd), against counts and durations recomputed here from the raw
JSON and the schedule read from the generating script; and on a real compile trace, where the
long step follows a recompile and holds no more work.

Before: every one of these said "they contain nothing a median step lacks (machine noise, GC or
I/O outside the trace)", although the evaluation steps ran 60 more ``aten::linear`` calls."""

from __future__ import annotations

import ast
import gzip
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import GENERATED, ROOT, checked_report, shared_trace, the_finding
from tracewhy.findings.codes import Code

SCRIPT = ROOT / "scripts" / "gen_traces" / "spike_traces.py"
EVAL = GENERATED / "cpu_spikes_eval.pt.trace.json.gz"
SAVE = GENERATED / "cpu_spikes_save.pt.trace.json.gz"
COMPILE_BREAK = GENERATED / "cpu_compile_break_item.pt.trace.json.gz"


@cache
def _planted() -> dict[str, int]:
    """The script's integer constants (EVAL_EVERY, EVAL_FORWARDS, LAYERS, SAVE_EVERY), written
    ``NAME = 4`` or ``A, B = 4, 20``."""
    out: dict[str, int] = {}
    for node in ast.parse(SCRIPT.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.Assign):
            continue
        target, value = node.targets[0], node.value
        pairs = (zip(target.elts, value.elts, strict=True) if isinstance(target, ast.Tuple)
                 and isinstance(value, ast.Tuple) else [(target, value)])
        out |= {t.id: v.value for t, v in pairs if isinstance(t, ast.Name) and isinstance(v, ast.Constant)
                and isinstance(v.value, int)}
    return out


#: The host work the raw reading counts: ops, annotations and runtime/driver calls, in torch 2.x's
#: categories and in the 2021 Kineto ones ("Operator" for ops and annotations, "Runtime").
_HOST_CATEGORIES = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "Operator", "Runtime")


@cache
def _raw_steps(path: Path) -> dict[str, dict[str, Any]]:
    """Per ProfilerStep in the raw JSON: its duration, its aten::linear calls and their time,
    and the time on its thread outside every op or annotation that starts inside it (its
    outermost ones: the step's own marker aside)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") in _HOST_CATEGORIES]
    steps = {e["name"]: e for e in events if re.fullmatch(r"ProfilerStep#\d+", e["name"])}
    out = {}
    for name, step in steps.items():
        lo, hi = step["ts"], step["ts"] + step["dur"]
        inside = sorted((e for e in events if e is not step and e["tid"] == step["tid"] and lo <= e["ts"] < hi),
                        key=lambda e: (e["ts"], -e["dur"]))
        covered, reach, outer, last = 0.0, lo, [], None
        stretches: dict[str | None, float] = {}  # untraced time by the event it follows
        for e in inside:
            end = min(e["ts"] + e["dur"], hi)
            if e["ts"] >= reach:  # not inside the one before
                outer.append(e)
                stretches[last] = stretches.get(last, 0.0) + e["ts"] - reach
                covered += end - e["ts"]
                reach, last = end, e["name"]
            elif end > reach:
                covered += end - reach
                reach, last = end, e["name"]
        stretches[last] = stretches.get(last, 0.0) + hi - reach
        linear = [e for e in outer if e["name"] == "aten::linear"]
        out[name] = {"dur_us": step["dur"], "linear_calls": len(linear),
                     "linear_us": sum(e["dur"] for e in linear), "untraced_us": step["dur"] - covered,
                     "untraced_after_us": stretches}
    return out


def _numbers(names: list[str]) -> list[int]:
    return [int(n.removeprefix("ProfilerStep#")) for n in names]


def test_an_evaluation_every_few_steps_is_named_by_its_ops_and_its_schedule() -> None:
    planted = _planted()
    f = the_finding(EVAL, Code.STEP_TIME_SPIKES)
    ev = f.evidence
    cause = ev["more_calls"][0]
    raw = _raw_steps(EVAL)
    # The planted steps: loop iterations i % EVAL_EVERY == 0, numbered by the profiler as i.
    evaluating = sorted(n for n in _numbers(list(raw)) if n % planted["EVAL_EVERY"] == 0)
    assert cause["name"] == "aten::linear"
    spiked = [_names(EVAL)[i] for i in ev["spike_steps"]]
    assert _numbers(cause["steps"]) == [n for n in evaluating if f"ProfilerStep#{n}" in spiked] == evaluating
    assert cause["every_steps"] == planted["EVAL_EVERY"]
    # Raw counts: the base steps (steady, not spikes) run one training forward of LAYERS linears;
    # an evaluating step EVAL_FORWARDS more forwards.
    base = [raw[n] for n in _base_steps(EVAL)]
    held = [raw[n] for n in cause["steps"]]
    assert {s["linear_calls"] for s in base} == {planted["LAYERS"]}
    extra_calls = np.mean([s["linear_calls"] for s in held]) - np.mean([s["linear_calls"] for s in base])
    assert extra_calls == planted["EVAL_FORWARDS"] * planted["LAYERS"] == round(cause["extra_calls"])
    extra_ns = (np.mean([s["linear_us"] for s in held]) - np.mean([s["linear_us"] for s in base])) * 1e3
    assert abs(cause["extra_ns"] - extra_ns) <= 0.001 * extra_ns
    assert f"{round(extra_calls)} more aten::linear calls" in f.statement
    assert "every 4th step: " + ", ".join(cause["steps"]) in f.statement
    assert "nothing a median step lacks" not in f.statement
    assert "with_stack=True" in f.next_step and "schedule" in f.next_step


def test_a_checkpoint_save_every_few_steps_is_untraced_time_at_the_step_end() -> None:
    planted = _planted()
    f = the_finding(SAVE, Code.STEP_TIME_SPIKES)
    hole = f.evidence["untraced"]
    raw = _raw_steps(SAVE)
    saving = sorted(n for n in _numbers(list(raw)) if n % planted["SAVE_EVERY"] == 0)
    steady_saving = [n for n in saving if f"ProfilerStep#{n}" in _steady_names(SAVE)]
    assert _numbers(hole["steps"]) == steady_saving
    assert hole["every_steps"] == planted["SAVE_EVERY"]
    assert hole["at_end"] is True
    # The save runs after optimizer.step(): what the profiler records of it last is state_dict's
    # detach of each parameter; the serialization after it is untraced.
    assert hole["after"] == "aten::detach"
    base = [raw[n] for n in _base_steps(SAVE)]
    held = [raw[n] for n in hole["steps"]]
    extra_ns = (np.mean([s["untraced_us"] for s in held]) - np.mean([s["untraced_us"] for s in base])) * 1e3
    assert abs(hole["extra_ns"] - extra_ns) <= 0.01 * extra_ns
    assert "outside every recorded op" in f.statement and "at the step's end" in f.statement
    assert "py-spy" in f.next_step and "nothing a median step lacks" not in f.statement


def test_a_real_trace_it_was_not_written_for() -> None:
    """kineto/resnet50_nw4_span2 (a 2021 GPU capture, old category names): one long step,
    ProfilerStep#21; its extra time is untraced on the training thread after the optimizer step,
    as the raw JSON gives it (the step less its outermost ops and runtime calls, against the
    other steady steps)."""
    path = shared_trace("kineto/resnet50_nw4_span2_worker0.1623213129365.pt.trace.json.gz")
    f = the_finding(path, Code.STEP_TIME_SPIKES)
    hole = f.evidence["untraced"]
    assert hole["steps"] == ["ProfilerStep#21"] and hole["after"] == "Optimizer.step#SGD.step" and hole["at_end"]
    raw = _raw_steps(path)
    base = [raw[n]["untraced_us"] for n in _base_steps(path)]
    extra_ns = (raw["ProfilerStep#21"]["untraced_us"] - np.mean(base)) * 1e3
    assert abs(hole["extra_ns"] - extra_ns) <= 0.01 * extra_ns
    assert "after Optimizer.step#SGD.step, at the step's end" in f.statement


def test_untraced_time_says_where_it_falls_in_the_step() -> None:
    """Without Python frames, the untraced part says which op its stretches follow: on the save
    trace, the stretch after state_dict's last ``aten::detach`` (the serialization), as a mean
    over the steady steps, as the raw JSON gives it."""
    f = the_finding(SAVE, Code.UNEXPLAINED_PART)
    raw = _raw_steps(SAVE)
    steady = sorted(_steady_names(SAVE))
    after_detach = np.mean([raw[n]["untraced_after_us"].get("aten::detach", 0.0) for n in steady]) * 1e3
    said = re.search(r"falls most after `aten::detach` \(([\d.]+) ms per step\)", f.statement)
    assert said is not None, f.statement
    assert abs(float(said.group(1)) * 1e6 - after_detach) <= 0.001 * after_detach + 1e3


def test_the_mean_of_a_part_held_by_a_few_steps_says_so() -> None:
    """The step account's mean per step for the evaluation's linears is paid by the evaluating
    steps only: the unexplained part names them."""
    planted = _planted()
    f = the_finding(EVAL, Code.UNEXPLAINED_PART)
    assert f.evidence["part"] == "host: aten::linear"
    analysed = checked_report(EVAL).account.windows.height  # type: ignore[union-attr]
    evaluating = [n for n in _numbers(list(_raw_steps(EVAL))) if n % planted["EVAL_EVERY"] == 0]
    assert f"100.0% of it in {len(evaluating)} of the {analysed} analysed steps " \
           f"({', '.join(f'#{n}' for n in evaluating)})" in f.statement


def test_a_slow_step_right_after_a_recompile_is_not_called_noise() -> None:
    """cpu_compile_break_item: ProfilerStep#1 recompiles; #2 runs the same ops as #3 and #4, its
    backward slower. Raw JSON: #1 holds inductor_compile, #2 none."""
    f = the_finding(COMPILE_BREAK, Code.STEP_TIME_SPIKES)
    with gzip.open(COMPILE_BREAK, "rt", encoding="utf-8") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
    steps = {e["name"]: e for e in events if e["name"].startswith("ProfilerStep#")}
    spike = _names(COMPILE_BREAK)[f.evidence["spike_steps"][0]]
    before = steps[f"ProfilerStep#{int(spike.removeprefix('ProfilerStep#')) - 1}"]
    compiles = [e for e in events if e["name"] == "inductor_compile"
                and before["ts"] <= e["ts"] < before["ts"] + before["dur"]]
    assert compiles, "the step before the spike compiles"
    assert f.evidence["more_calls"] == [] and f.evidence["untraced"] is None
    assert "follows a step that compiled" in f.statement and "machine noise" not in f.next_step


def _names(path: Path) -> list[str]:
    """The steps table's names, by index (the spike finding's ``spike_steps``)."""
    return [str(n) for n in checked_report(path).steps.table.get_column("name").to_list()]


def _steady_names(path: Path) -> set[str]:
    table = checked_report(path).steps.table
    return {str(n) for n, steady in zip(table.get_column("name").to_list(), table.get_column("steady").to_list(),
                                         strict=True) if steady}


def _base_steps(path: Path) -> list[str]:
    """The steady steps that are no spike: the finding's comparison."""
    spiked = {_names(path)[i] for i in the_finding(path, Code.STEP_TIME_SPIKES).evidence["spike_steps"]}
    return sorted(_steady_names(path) - spiked)


@pytest.mark.parametrize(("path", "fetch", "said"), [
    (GENERATED / "cpu_dataloader_few_workers.pt.trace.json.gz",
     "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "workers fall behind"),
    (ROOT / "examples" / "demo_cpu_training.pt.trace.json.gz",
     "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "loads its batches itself (num_workers=0)"),
])
def test_spikes_that_wait_longer_for_the_dataloader_say_so(path: Path, fetch: str, said: str) -> None:
    """Two real loops whose long steps run the same calls, the DataLoader's fetch taking longer in
    them (raw JSON: its time in the spikes against the other steady steps): the input pipeline,
    not noise. With workers (two, for a slow Dataset) they fall behind; without (num_workers=0,
    the iterator torch names _SingleProcessDataLoaderIter) the main process loads the batch."""
    f = the_finding(path, Code.STEP_TIME_SPIKES)
    assert f.evidence["more_calls"] == [] and f.evidence["untraced"] is None
    assert f.evidence["slower"][0]["name"] == fetch
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
    steps = {e["name"]: e for e in events if re.fullmatch(r"ProfilerStep#\d+", e["name"])}

    def fetch_us(name: str) -> float:
        lo, hi = steps[name]["ts"], steps[name]["ts"] + steps[name]["dur"]
        return sum(e["dur"] for e in events if e["name"] == fetch and lo <= e["ts"] < hi)
    spiked = [_names(path)[i] for i in f.evidence["spike_steps"]]
    extra_ns = (np.mean([fetch_us(n) for n in spiked]) - np.mean([fetch_us(n) for n in _base_steps(path)])) * 1e3
    assert abs(f.evidence["slower"][0]["extra_ns"] - extra_ns) <= 0.001 * extra_ns
    assert said in f.statement and "machine noise" not in f.next_step
    assert "gaps TRACE" not in f.next_step  # a CPU-only run has no GPU gaps to list
