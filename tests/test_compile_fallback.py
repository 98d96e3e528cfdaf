"""torch.compile conclusions that fit the evidence, on real CPU captures made by
scripts/gen_traces/compile_traces.py: a frame Dynamo skipped (a graph break in a loop) had no
effect; a frame that hit the recompile limit runs eagerly after it; a one-time recompile is not a
per-step cost while a recompile every step is; the advice follows the guard that failed; a break
that makes its resume function recompile every step is ranked with that recompile time. Expected
values are read from the raw trace events and from the generating script's plan (MANIFEST.md)."""

from __future__ import annotations

import gzip
import json
import statistics
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from builders import KinetoBuilder
from test_compile import _log, _planted, _trace
from tracewhy.analyses.compile import compile_analysis
from tracewhy.analyses.compile_fallback import FallbackCol
from tracewhy.cli import main
from tracewhy.readers import read_trace


@cache
def _raw(case: str) -> list[dict[str, Any]]:
    with gzip.open(_trace(case), "rt", encoding="utf-8") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _steps(case: str) -> list[dict[str, Any]]:
    return sorted((e for e in _raw(case) if str(e["name"]).startswith("ProfilerStep#")), key=lambda e: e["ts"])


def _in(e: dict[str, Any], w: dict[str, Any]) -> bool:
    return bool(w["ts"] <= e["ts"] and e["ts"] + e["dur"] <= w["ts"] + w["dur"])


def _raw_forward_ns_per_step(case: str, from_step: int) -> int:
    """Median over steps ``from_step``.. of the ``forward`` annotation the loop wraps the model in."""
    per_step = [sum(e["dur"] for e in _raw(case) if e["name"] == "forward" and _in(e, w))
                for w in _steps(case)[from_step:]]
    return round(statistics.median(per_step) * 1000)


def _diagnose(case: str, capsys: pytest.CaptureFixture[str], logs: bool) -> list[dict[str, Any]]:
    argv = ["diagnose", "--no-cache", str(_trace(case)), "--json"] + (["--logs", str(_log(case))] if logs else [])
    assert main(argv) == 0
    findings: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["findings"]
    return findings


def _code(findings: list[dict[str, Any]], code: str) -> dict[str, Any]:
    found = [f for f in findings if f["code"] == code]
    assert len(found) == 1, [f["code"] for f in findings]
    return found[0]


@pytest.mark.parametrize("logs", [False, True])
def test_a_frame_skipped_for_a_break_in_a_loop_had_no_effect(logs: bool, capsys: pytest.CaptureFixture[str]) -> None:
    events = _raw("loop_skip")
    assert not any(str(e["name"]).startswith("Torch-Compiled Region") for e in events)
    assert any("compile_id=0/0" in str(e["name"]) and _in(e, _steps("loop_skip")[0]) for e in events)
    f = _code(_diagnose("loop_skip", capsys, logs), "compile-no-effect")
    assert f["severity"] == "high"
    assert f["evidence"]["step"] == "ProfilerStep#0" and f["evidence"]["call_site"] == "forward"
    assert f["evidence"]["eager_steps"] == len(_steps("loop_skip")) - 1
    assert f["evidence"]["eager_ns_per_step"] == _raw_forward_ns_per_step("loop_skip", 1)
    if logs:
        assert f["statement"].startswith("torch.compile had no effect on `forward`")
        assert "graph break in loop" in f["statement"] and "loop" in f["next_step"]
    else:
        assert f["statement"].startswith("torch.compile had no effect on frame 0")


@pytest.mark.parametrize("logs", [False, True])
def test_the_recompile_limit_and_the_eager_steps_after_it(logs: bool, capsys: pytest.CaptureFixture[str]) -> None:
    _, recompiles = _planted("recompile_limit")
    limit_step = 2  # the plan: steps 0 and 1 compile, the third value of n hits recompile_limit=2
    assert any("compile_id=0/2" in str(e["name"]) and _in(e, _steps("recompile_limit")[limit_step])
               for e in _raw("recompile_limit"))
    findings = _diagnose("recompile_limit", capsys, logs)
    f = _code(findings, "recompile-limit")
    assert f["severity"] == "high"
    assert f["evidence"]["region"] == "0/2" and f["evidence"]["step"] == f"ProfilerStep#{limit_step}"
    assert f["evidence"]["compiled_before"] == 2
    assert f["evidence"]["eager_steps"] == len(recompiles) - limit_step - 1
    assert f["evidence"]["eager_ns_per_step"] == _raw_forward_ns_per_step("recompile_limit", limit_step + 1)
    assert "0/1 in ProfilerStep#1" in f["statement"]  # the seconds-long recompile before the limit
    # The give-up is not a recompile of its own, nor a spike of the steps it happens in.
    assert not any(x["code"] == "recompile" and "0/2" in x["statement"] for x in findings)
    assert not any(x["code"] == "step-time-spikes" and "torch.compile work" in x["statement"] for x in findings)
    if logs:
        assert "hit config.recompile_limit (2)" in f["statement"] and "`forward`" in f["statement"]
        assert "tensor" in f["next_step"] and "mark_dynamic(x" not in f["next_step"]


def test_the_limit_is_not_counted_as_a_recompile(capsys: pytest.CaptureFixture[str]) -> None:
    _, planted = _planted("recompile_limit")
    assert main(["compile", "--no-cache", str(_trace("recompile_limit")), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["recompiles"] for s in doc["steps"]] == planted
    assert [(f["region"], f["step"]) for f in doc["fallbacks"]] == [("0/2", "ProfilerStep#2")]


def test_a_one_time_recompile_is_no_per_step_cost(capsys: pytest.CaptureFixture[str]) -> None:
    _, planted = _planted("recompile_once")
    findings = _diagnose("recompile_once", capsys, True)
    f = _code(findings, "recompile")
    assert f["recoverable_ns_per_step"] == 0 and f["severity"] == "low"
    assert "one-time" in f["statement"] and f"ProfilerStep#{planted.index(1)}" in f["statement"]
    spikes = [x for x in findings if x["code"] == "step-time-spikes"]
    assert all(planted.index(1) not in x["evidence"]["spike_steps"] for x in spikes)


def test_a_recompile_every_step_is_a_per_step_cost(capsys: pytest.CaptureFixture[str]) -> None:
    _, planted = _planted("recompile_every")
    findings = _diagnose("recompile_every", capsys, True)
    f = _code(findings, "recompile")
    assert "every step" in f["statement"] and f["severity"] in ("high", "medium")
    assert f["evidence"]["every_step"] is True and len(f["evidence"]["recompiles"]) == sum(planted)
    assert f["recoverable_ns_per_step"] > 100_000_000  # seconds of compiling per step, not zero
    assert not [x for x in findings if x["code"] == "step-time-spikes" and "torch.compile work" in x["statement"]]


@pytest.mark.parametrize(("case", "wanted", "unwanted"), [
    ("recompile_once", ("mark_dynamic(x, 0)", "dynamic=True"), ("capture_scalar_outputs",)),
    ("recompile_every", ("torch.tensor(n)", "torch.where"), ("mark_dynamic(x, 0) or",)),
    ("item_every", ("capture_scalar_outputs=True", "torch.where"), ("mark_dynamic(x, 0) or", "drop_last")),
])
def test_the_advice_follows_the_failed_guard(case: str, wanted: tuple[str, ...], unwanted: tuple[str, ...],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    f = _code(_diagnose(case, capsys, True), "recompile")
    assert all(w in f["next_step"] for w in wanted), f["next_step"]
    assert not any(u in f["next_step"] for u in unwanted), f["next_step"]


def test_a_break_that_recompiles_its_resume_function_is_ranked_with_that_time(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The .item() float goes into the resume function (frame 1), which recompiles every step: the
    break costs those compiles, not the microseconds of eager ops between the regions."""
    _, planted = _planted("item_every")
    steady = _steps("item_every")[1:]
    compiles = [e for e in _raw("item_every") if str(e["name"]).startswith("dynamo_data: compile_id=1/")]
    assert [sum(_in(e, w) for e in compiles) for w in steady] == planted[1:]
    findings = _diagnose("item_every", capsys, True)
    f = _code(findings, "graph-breaks")
    tops = [e for e in _raw("item_every") if e["name"] == "dynamo" and any(
        _in(c, e) for c in compiles)]
    raw_per_step = sum(e["dur"] for e in tops if any(_in(e, w) for w in steady)) * 1000 / len(steady)
    assert f["recoverable_ns_per_step"] >= 0.5 * raw_per_step > 100_000_000
    assert "recompiles every step" in f["statement"]


@pytest.mark.parametrize(("case", "row"), [
    ("loop_skip", {"region": "0/0", "kind": "frame skipped", "function": "forward",
                   "reason": "graph break in loop"}),
    ("recompile_limit", {"region": "0/2", "kind": "recompile limit", "function": "forward",
                         "reason": "hit config.recompile_limit (2); last guard failure: n == 3"}),
])
def test_the_logs_name_the_frame_given_up_and_why(case: str, row: dict[str, str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Read from the log lines themselves: the give-up record of each capture, as Dynamo wrote it."""
    text = _log(case).read_text(encoding="utf-8")
    assert ("frame skipped: forward" if case == "loop_skip" else "hit config.recompile_limit (2)") in text
    assert main(["compile", "--no-cache", str(_trace(case)), "--logs", str(_log(case)), "--json"]) == 0
    logged = json.loads(capsys.readouterr().out)["logged_fallbacks"]
    assert [{k: x[k] for k in row} for x in logged] == [row]
    assert main(["compile", "--no-cache", str(_trace(case)), "--logs", str(_log(case))]) == 0
    out = capsys.readouterr().out
    assert "frames that stopped running compiled" in out and row["region"] in out


def _tiny(tmp_path: Path, nested_in_region: bool) -> Path:
    """Four steps, each with a ``forward`` annotation; step 0 compiles frame 1 (``dynamo`` with its
    ``_data`` annotation), inside region 0/0 or with no region around it; no region of frame 1 runs."""
    b = KinetoBuilder()
    for i in range(4):
        t = 1000.0 * i
        b.annotation(f"ProfilerStep#{i}", t, 900).annotation("forward", t + 10, 100 + 10 * i)
        if i == 0:
            if nested_in_region:
                b.annotation("Torch-Compiled Region: 0/0", t + 20, 80)
            b.annotation("dynamo", t + 30, 50).annotation("dynamo_data: compile_id=1/0", t + 31, 1)
        elif nested_in_region:
            b.annotation("Torch-Compiled Region: 0/0", t + 20, 50)
        b.op("aten::mm", t + 85, 10)
    return b.write(tmp_path / "tiny.json")


def test_a_frame_compiled_inside_a_region_leaves_the_outer_frame_compiled(tmp_path: Path) -> None:
    """A function called from a broken frame is compiled as a frame of its own, inside the outer
    frame's region: finding no region of it does not make torch.compile ineffective."""
    assert compile_analysis(read_trace(_tiny(tmp_path, nested_in_region=True))).fallbacks.height == 0
    fallbacks = compile_analysis(read_trace(_tiny(tmp_path, nested_in_region=False))).fallbacks
    assert fallbacks.select(FallbackCol.REGION, FallbackCol.STEP, FallbackCol.CALL_SITE, FallbackCol.EAGER_STEPS,
                            FallbackCol.EAGER_NS_PER_STEP).rows() == [("1/0", "ProfilerStep#0", "forward", 3, 120_000)]
