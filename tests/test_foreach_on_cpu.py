"""The multi-tensor (foreach) optimizer on a CPU-only trace: the foreach op runs the same
per-tensor ops in C++, so what leaves is the Python loop between them, not their time; checked
on a trace built inline and on a real single-tensor Adam capture against its own raw events."""

from __future__ import annotations

import gzip
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from builders import KinetoBuilder
from tracewhy.analyses.account import StepModel, step_model
from tracewhy.analyses.what_if import predict, window_edges
from tracewhy.analyses.what_if_edits import MultiTensorOptimizer, WindowEdges
from tracewhy.readers import read_trace

US = 1000
ADAM = Path(__file__).parent / "data" / "calibration" / "foreach_optimizer_before_3.pt.trace.json.gz"
READS = ("aten::item", "aten::_local_scalar_dense")


def test_on_cpu_the_loop_between_per_parameter_ops_leaves_and_their_time_stays(tmp_path: Path) -> None:
    # Two parameters, each: aten::mul_ (30 µs), a read of its step into Python (aten::item,
    # 10 µs), aten::add_ (30 µs), 50 µs of Python between neighbouring ops. Only the 50 µs
    # between one parameter's add_ and the next one's mul_ lie between two repeated tensor ops;
    # the Python around each read stays (no multi-tensor op returns a value per parameter), and
    # so does every op's time.
    b = KinetoBuilder().annotation("ProfilerStep#1", 0, 1000).annotation("ProfilerStep#2", 1000, 100)
    b.annotation("Optimizer.step#Adam.step", 100, 500)
    for start in (110, 330):
        b.op("aten::mul_", start, 30).op("aten::item", start + 80, 10).op("aten::add_", start + 140, 30)
    m = step_model(read_trace(b.write(tmp_path / "t.json")))
    assert m.rules.cpu_only
    p = predict(m, [MultiTensorOptimizer()], [WindowEdges(m, m.paths[0])])
    assert p.predicted_ns // US == 1000 - 50


@pytest.fixture(scope="module")
def adam() -> StepModel:
    return step_model(read_trace(ADAM))


def _loop_gaps_ns(path: Path) -> list[float]:
    """Per Optimizer.step in the raw file: the untraced time between two consecutive outermost
    ops of its thread that both repeat in that step and neither reads a value into Python."""
    with gzip.open(path) as f:
        events: list[dict[str, Any]] = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    out = []
    for step in (e for e in events if e["name"].startswith("Optimizer.step#")):
        t0, t1 = step["ts"], step["ts"] + step["dur"]
        inside = sorted((e for e in events if e is not step and e["tid"] == step["tid"] and t0 <= e["ts"]
                         and e["ts"] + e["dur"] <= t1), key=lambda e: (e["ts"], -e["dur"]))
        outer: list[dict[str, Any]] = []
        for e in inside:
            if not outer or e["ts"] >= outer[-1]["ts"] + outer[-1]["dur"]:
                outer.append(e)
        counts = Counter(e["name"] for e in outer)
        looped = [counts[e["name"]] > 1 and e["name"] not in READS for e in outer]
        out.append(sum(b["ts"] - a["ts"] - a["dur"] for a, b, la, lb in
                       zip(outer, outer[1:], looped, looped[1:], strict=False) if la and lb) * US)
    return out


def test_a_single_tensor_adam_on_cpu_saves_its_python_loop(adam: StepModel) -> None:
    # Adam(foreach=False) over 128 parameters, CPU only: the step saves the untraced Python
    # between its per-parameter ops, as the raw events give it (1.2 ms of 3.5 ms per
    # Optimizer.step), not the per-tensor ops' time that a GPU's launches would cost.
    assert adam.rules.cpu_only
    windows = window_edges(adam, max_steps=len(adam.paths))
    saved = statistics.median(predict(adam, [MultiTensorOptimizer()], [w]).saved_ns for w in windows)
    assert saved == pytest.approx(statistics.median(_loop_gaps_ns(ADAM)), rel=0.03)
