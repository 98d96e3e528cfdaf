"""``diagnose`` names the Python line behind its input, sync, scalar-read and host findings:
the planted lines of the generated traces, known from the generating script, and on
real traces the frame the raw events put above the blocking calls; traces without stacks read
exactly as before."""

from __future__ import annotations

import ast
import gzip
import json
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import tracewhy
from conftest import GENERATED, ROOT, checked_report, shared_trace, the_finding
from tracewhy.analyses.source_lines import line_of
from tracewhy.findings import source_line
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.reports.diagnose import diagnose

SCRIPT = ROOT / "scripts" / "gen_traces" / "lines_traces.py"
BERT_MI300X = "tracelens/mi300x_bert-small_bs1_seq512.json.gz"
RESNET_NW0 = "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"
NO_STACKS = ("hta/mi250_minitoy_train_rocm6.2.json.gz", "hta/gp100_step_sync_gpu_user_annotation_2023.json.gz",
             "hta/a100_cuda_event_sync_small.json.gz")
DEMO = ROOT / "examples" / "demo_cpu_training.pt.trace.json.gz"
NAMED = (Code.SCALAR_READ_PER_STEP, Code.GPU_IDLE_SYNC, Code.GPU_IDLE_INPUT, Code.INPUT_BOUND, Code.GPU_IDLE_HOST)


def _planted(function: str) -> dict[str, Any]:
    """The generator's planted function as a with_stack frame names it: file, the ``def`` line
    (the trace has no line of the call in it)."""
    for node in ast.walk(ast.parse(SCRIPT.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return {"file": SCRIPT.name, "line": node.lineno, "function": function, "kind": "def"}
    raise AssertionError(f"{function} is not defined in {SCRIPT.name}")


def _named(line: dict[str, Any]) -> str:
    return f"user function {line['function']} defined at {line['file']}:{line['line']}"


@pytest.mark.parametrize(("name", "code", "function"), [
    ("sleep", Code.INPUT_BOUND, "__getitem__"),
    ("item", Code.SCALAR_READ_PER_STEP, "read_metrics"),
])
def test_the_finding_names_the_planted_line(name: str, code: Code, function: str) -> None:
    f = the_finding(GENERATED / f"cpu_lines_{name}.pt.trace.json.gz", code)
    planted = _planted(function)
    assert f.evidence["line"] == planted
    assert _named(planted) in f.statement


def test_the_scalar_read_advice_points_at_the_line() -> None:
    f = the_finding(GENERATED / "cpu_lines_item.pt.trace.json.gz", Code.SCALAR_READ_PER_STEP)
    assert f.next_step.startswith(f"Stop reading values back every step ({_named(_planted('read_metrics'))}):")


def test_a_spike_names_the_line_its_extra_time_went_to() -> None:
    """In the sleep trace's one spike step a single ``__getitem__`` call slept 64 ms instead of
    1 ms (read from the raw events): the spike's extra time is under the planted line."""
    f = the_finding(GENERATED / "cpu_lines_sleep.pt.trace.json.gz", Code.STEP_TIME_SPIKES)
    assert f.evidence["line"] == _planted("__getitem__")
    assert _named(_planted("__getitem__")) in f.statement
    assert f.evidence["line_extra_ns"] >= 0.5 * f.evidence["excess_ns"] / len(f.evidence["spike_steps"])


def test_the_optimizers_own_reads_name_no_line_of_the_loop() -> None:
    """cpu_adam_item: Adam's single-tensor path reads its step counters under optimizer.step();
    the loop's one read is log_loss's, which is the line named."""
    f = the_finding(GENERATED / "cpu_adam_item.pt.trace.json.gz", Code.SCALAR_READ_PER_STEP)
    assert f.evidence["from_optimizer"] > 0
    assert f.evidence["line"]["function"] == "log_loss"


@cache
def _raw(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "X"]


def _user_frame_above(events: list[dict[str, Any]], inner: dict[str, Any]) -> str:
    """The innermost python_function event around ``inner`` (same thread, enclosing time) that
    names a source file (not a builtin or an nn.Module scope) outside torch, transformers and
    the standard library."""
    def user(name: str) -> bool:
        top = name.split("(", 1)[0].split("/", 1)[0].removesuffix(".py")
        return (re.match(r"^[^<].*\.py\(\d+\): ", name) is not None and top not in ("torch", "transformers")
                and top not in sys.stdlib_module_names)
    around = [e for e in events if e.get("cat") == "python_function" and user(e["name"])
              and (e["pid"], e["tid"]) == (inner["pid"], inner["tid"])
              and e["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= e["ts"] + e["dur"]]
    return str(min(around, key=lambda e: e["dur"])["name"])


@pytest.mark.parametrize(("code", "inner"), [
    (Code.GPU_IDLE_SYNC, "hipDeviceSynchronize"),
    (Code.SCALAR_READ_PER_STEP, "aten::is_nonzero"),
])
def test_the_line_is_the_frame_the_raw_events_put_above_the_blocking_calls(code: Code, inner: str) -> None:
    path = shared_trace(BERT_MI300X)
    events = _raw(path)
    expected = {_user_frame_above(events, e) for e in events if e["name"] == inner}
    assert len(expected) == 1
    line = the_finding(path, code).evidence["line"]
    assert {f"{line['file']}({line['line']}): {line['function']}"} == expected


def test_legacy_call_stacks_name_the_line_that_iterates_the_loader() -> None:
    """PyTorch 1.8's Call stack: no frame inside the fetch is the user's, so the line named is
    the innermost user entry of the fetch's own stack (the loop over the DataLoader)."""
    path = shared_trace(RESNET_NW0)
    stacks = {e["args"]["Call stack"] for e in _raw(path) if e["name"].endswith("DataLoaderIter.__next__")}
    assert len(stacks) == 1
    innermost_user = next(entry for entry in stacks.pop().split(";") if "site-packages" not in entry)
    line = the_finding(path, Code.GPU_IDLE_INPUT).evidence["line"]
    assert f"{line['file']}({line['line']}): {line['function']}" == innermost_user
    assert line["kind"] == "call"  # a Call stack entry is the line being run: the call itself
    assert f"user line {line['file']}:{line['line']} in {line['function']}" in the_finding(path,
                                                                                    Code.GPU_IDLE_INPUT).statement


@pytest.mark.parametrize("relative", NO_STACKS)
def test_without_stacks_no_finding_names_a_line(relative: str) -> None:
    report = checked_report(shared_trace(relative))
    assert {f.code for f in report.findings} & set(NAMED)
    for f in report.findings:
        assert "line" not in f.evidence
        assert "user line" not in f.statement + f.next_step


def test_without_stacks_no_line_is_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(source_line, "line_of", lambda *a, **k: calls.append(1))
    diagnose(tracewhy.load(DEMO))
    diagnose(tracewhy.load(shared_trace(NO_STACKS[0])))
    assert calls == []


def test_each_line_is_looked_up_once_per_diagnosis(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = Context(tracewhy.load(GENERATED / "cpu_lines_item.pt.trace.json.gz"))
    real = line_of
    calls: list[bool] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["within"])
        return real(*args, **kwargs)
    monkeypatch.setattr(source_line, "line_of", counted)
    first = source_line.scalar_read_line(ctx)
    assert first is not None
    assert source_line.scalar_read_line(ctx) == first
    assert source_line.input_line(ctx) is None  # no DataLoader in this loop
    source_line.input_line(ctx)
    assert calls == [False, True]


def test_a_spike_step_where_no_user_frame_starts_names_no_line() -> None:
    """Frames are counted in the step they start in; a step none starts in (here one past the
    last) has no line to name, and the other steps' frames are no reason to name one."""
    ctx = Context(tracewhy.load(GENERATED / "cpu_lines_sleep.pt.trace.json.gz"))
    past_the_end = ctx.steps().table.height
    assert source_line.spike_line(ctx, [past_the_end], excess_ns=1.0) is None
    assert source_line.spike_line(ctx, [1], excess_ns=1.0) is not None  # the trace's real spike step
