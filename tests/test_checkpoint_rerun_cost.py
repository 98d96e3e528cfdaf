"""Activation checkpointing off, checked on a real checkpointed capture against its own raw
events: the region's forward ops priced at what backward's rerun of the same ops cost
(``what_if_checkpoint.forward_at_rerun_cost``; regions and reruns paired here by position, not by
name), and the untraced time after each node that reran a region down to its twins'
(``what_if_checkpoint.after_rerun_nodes``)."""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from tracewhy.analyses.account import StepModel, step_model
from tracewhy.analyses.critical_path_replay import GraphEdit
from tracewhy.analyses.what_if import window_edges
from tracewhy.analyses.what_if_checkpoint import after_rerun_nodes, forward_at_rerun_cost
from tracewhy.readers import read_trace

CHECKPOINTED = Path(__file__).parent / "data" / "calibration" / "checkpointing_before_2.pt.trace.json.gz"
NODE = "autograd::engine::evaluate_function: "


@pytest.fixture(scope="module")
def model() -> StepModel:
    return step_model(read_trace(CHECKPOINTED))


@functools.cache
def _steps(path: Path) -> list[tuple[float, list[dict[str, Any]]]]:
    """Per ProfilerStep in the raw file: its start (µs) and the complete events inside it."""
    with gzip.open(path) as f:
        events: list[dict[str, Any]] = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    return [(step["ts"], [e for e in events if e is not step and step["ts"] <= e["ts"] < step["ts"] + step["dur"]])
            for step in events if step["name"].startswith("ProfilerStep#")]


def _outermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if not out or e["ts"] >= out[-1]["ts"] + out[-1]["dur"]:
            out.append(e)
    return out


def _nested(events: list[dict[str, Any]], op: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in events if e is not op and e["tid"] == op["tid"]
            and op["ts"] <= e["ts"] and e["ts"] + e["dur"] <= op["ts"] + op["dur"]]


def _hook_ops_us(events: list[dict[str, Any]], fw: dict[str, Any], again: dict[str, Any]) -> float:
    """What the events nested in the rerun op under a name nested nowhere in its forward twin
    took, outermost ones only: the recompute hook's detaches."""
    known = {e["name"] for e in _nested(events, fw)}
    extra = [e for e in _nested(events, again) if e["name"] not in known]
    return sum(e["dur"] for e in _outermost(extra))


def _hook_excess_ns(path: Path) -> dict[int, float]:
    """Per ProfilerStep (its start, ns): each region's forward ops (the three outermost ops after
    its _NoopSaveInputs: Linear, GELU, Linear) against the same ops rerun in backward (the
    outermost recorded ops under a backward node's function, three per region), the k-th rerun
    the k-th region from the last; the sum of what the forward op took beyond its rerun, the
    rerun without the ops of its recompute hook."""
    out = {}
    for t0, inside in _steps(path):
        nodes = [e for e in inside if e["name"].startswith(NODE)]
        first_node = min(n["ts"] for n in nodes)
        forward = _outermost([e for e in inside if e["ts"] < first_node])
        regions = [forward[i + 1:i + 4] for i, e in enumerate(forward) if e["name"] == "_NoopSaveInputs"]
        rerun = [e for e in inside if e["name"] in ("aten::linear", "aten::gelu") and e["ts"] >= first_node]
        reruns = _outermost(rerun)
        assert len(reruns) == 3 * len(regions) == 24
        excess = 0.0
        for k, region in enumerate(reversed(regions)):
            for fw, again in zip(region, reruns[3 * k:3 * k + 3], strict=True):
                assert fw["name"] == again["name"]
                excess += max(0.0, fw["dur"] - (again["dur"] - _hook_ops_us(inside, fw, again)))
        out[round(t0 * 1000)] = excess * 1000
    return out


def _lost_ns(model: StepModel, edit: GraphEdit) -> float:
    g = model.graph
    dur = (g.node_ts[g.dst[edit.scaled]] - g.node_ts[g.src[edit.scaled]]).astype(float)
    return float((dur * (1.0 - edit.factor)).sum())


def _gap_excess_ns(path: Path) -> dict[int, float]:
    """Per ProfilerStep (its start, ns): after each AddmmBackward0 node holding a rerun op, the
    gap to the next outermost op beyond the median gap after the nodes of that name holding none."""
    out = {}
    for t0, inside in _steps(path):
        outer = _outermost(inside)
        held, plain = [], []
        for a, b in itertools.pairwise(outer):
            if a["name"] == NODE + "AddmmBackward0":
                reran = any(e["name"] == "aten::linear" and a["ts"] < e["ts"] < a["ts"] + a["dur"] for e in inside)
                (held if reran else plain).append(b["ts"] - a["ts"] - a["dur"])
        assert len(held) == len(plain) == 8
        out[round(t0 * 1000)] = 1000 * sum(max(0.0, gap - statistics.median(plain)) for gap in held)
    return out


def test_the_gap_after_a_node_that_reran_falls_to_its_twins(model: StepModel) -> None:
    expected = _gap_excess_ns(CHECKPOINTED)
    for w in window_edges(model, max_steps=len(model.paths)):
        lost = _lost_ns(model, after_rerun_nodes(w))
        assert lost > 50_000  # 11 to 12 µs per rerunning node beyond its twins in this capture
        assert abs(lost - expected[w.path.window_start]) < 1_000


def test_forward_ops_lose_what_they_took_beyond_their_rerun(model: StepModel) -> None:
    expected = _hook_excess_ns(CHECKPOINTED)
    for w in window_edges(model, max_steps=len(model.paths)):
        lost = _lost_ns(model, forward_at_rerun_cost(w))
        # 0.5 to 0.8 ms per step on this capture (the hooks' Python inside each forward op)
        assert lost > 300_000
        assert abs(lost - expected[w.path.window_start]) < 1_000  # within 1 µs (times rounded to ns)


def test_a_capture_without_checkpointing_has_nothing_to_price() -> None:
    plain = step_model(read_trace(CHECKPOINTED.with_name("checkpointing_after_2.pt.trace.json.gz")))
    windows = window_edges(plain, max_steps=len(plain.paths))
    assert all(forward_at_rerun_cost(w).empty and after_rerun_nodes(w).empty for w in windows)


def test_the_ops_a_rerun_holds_beyond_its_twin_are_the_recompute_hooks_detaches() -> None:
    """torch.utils.checkpoint's recompute hook (use_reentrant=False) detaches each tensor it keeps
    that requires grad, inside the rerun op; the forward op, under the forward's pack hook, calls
    no op. So what the rerun holds beyond its twin is `aten::detach` alone, 2 to 4 µs each."""
    for _, inside in _steps(CHECKPOINTED):
        nodes = [e for e in inside if e["name"].startswith(NODE)]
        first_node = min(n["ts"] for n in nodes)
        forward = _outermost([e for e in inside if e["ts"] < first_node])
        linear = next(e for e in forward if e["name"] == "aten::linear")
        reruns = _outermost([e for e in inside
                             if e["name"] in ("aten::linear", "aten::gelu") and e["ts"] >= first_node])
        known = {e["name"] for e in _nested(inside, linear)}
        extra = _outermost([e for r in reruns for e in _nested(inside, r) if e["name"] not in known])
        assert {e["name"] for e in extra} == {"aten::detach"}
        assert len(extra) >= 24  # at least one per rerun op (both Linears' addmm save two)
