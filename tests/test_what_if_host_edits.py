"""Edits that rewrite host work (``what_if_host_edits``) and checkpointing's hook time
(``RemoveRecompute``), each replayed on a step built inline where the edited step's length is
known exactly. The real before/after pairs are in test_calibration.py."""

from __future__ import annotations

from pathlib import Path

from builders import KinetoBuilder
from tracewhy.analyses.account import StepModel, step_model
from tracewhy.analyses.what_if import predict
from tracewhy.analyses.what_if_edits import Fix, RemoveRecompute, WindowEdges
from tracewhy.analyses.what_if_host_edits import BatchLoop, Preallocate, SetGradsToNone
from tracewhy.readers import read_trace

US = 1000


def _model(tmp_path: Path, b: KinetoBuilder) -> StepModel:
    return step_model(read_trace(b.write(tmp_path / "t.json")))


def _first_step(model: StepModel, *edits: Fix) -> int:
    """The first analysed step's predicted length, µs (the builders' steps are step 0)."""
    return predict(model, list(edits), [WindowEdges(model, model.paths[0])]).predicted_ns // US


def _steps(b: KinetoBuilder, length: float = 1000) -> KinetoBuilder:
    return b.annotation("ProfilerStep#1", 0, length).annotation("ProfilerStep#2", length, 100)


def test_a_vectorised_loop_keeps_one_call_per_op_and_a_share_of_its_python(tmp_path: Path) -> None:
    # The block (0-800) runs aten::mean 4 times (50, 60, 70, 80 µs) and aten::std 4 times
    # (40 µs each): 8 calls, 420 µs; the other 380 µs are the loop's Python. Vectorised: one
    # call of each, the 3 others saving the cheapest (3 x 50 + 3 x 40), and the Python kept in
    # the share of calls left (2 of 8): 380 -> 95.
    b = _steps(KinetoBuilder())
    b.annotation("preprocess", 0, 800)
    for i, mean in enumerate((50, 60, 70, 80)):
        b.op("aten::mean", 10 + 190 * i, mean).op("aten::std", 100 + 190 * i, 40)
    m = _model(tmp_path, b)
    assert _first_step(m, BatchLoop("preprocess")) == 1000 - 3 * 50 - 3 * 40 - (380 - 95)
    assert _first_step(m, BatchLoop("another block")) == 1000


def test_a_preallocated_buffer_makes_each_growth_cost_the_first(tmp_path: Path) -> None:
    # aten::cat grows a tensor 3 times (20, 40, 60 µs: each copies all rows so far): written in
    # place, each costs what the first did.
    b = _steps(KinetoBuilder())
    for start, dur in ((100, 20), (300, 40), (500, 60)):
        b.op("aten::cat", start, dur)
    m = _model(tmp_path, b)
    assert _first_step(m, Preallocate("aten::cat")) == 1000 - 20 - 40
    assert _first_step(m, Preallocate("aten::stack")) == 1000


def test_gradients_set_to_none_are_not_zeroed(tmp_path: Path) -> None:
    # zero_grad (700-900) zeroes two gradients (2 x 60 µs); the optimizer's step (100-500)
    # stays.
    b = _steps(KinetoBuilder())
    b.annotation("Optimizer.step#SGD.step", 100, 400).op("aten::add_", 150, 300)
    b.annotation("Optimizer.zero_grad#SGD.zero_grad", 700, 200)
    b.op("aten::zero_", 720, 60).op("aten::zero_", 800, 60)
    m = _model(tmp_path, b)
    assert _first_step(m, SetGradsToNone()) == 1000 - 2 * 60


def test_the_node_that_reruns_the_forward_loses_its_hook_time(tmp_path: Path) -> None:
    # Two AddmmBackward0 nodes: the first reruns aten::linear (100 µs) and spends 290 µs of
    # its own (the checkpoint hook's Python) beside its aten::mm (100 µs); the second, which
    # reruns nothing, spends 40 µs of its own beside its aten::mm (100 µs). Without
    # checkpointing the rerun leaves and the first node's own time falls to the second's.
    b = _steps(KinetoBuilder())
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 0, 500).op("AddmmBackward0", 5, 490)
    b.op("aten::linear", 100, 100, **{"Sequence number": 5, "Fwd thread id": 0}).op("aten::mm", 350, 100)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 600, 150).op("AddmmBackward0", 605, 140)
    b.op("aten::mm", 620, 100)
    m = _model(tmp_path, b)
    assert _first_step(m, RemoveRecompute()) == 1000 - 100 - (290 - 40)
