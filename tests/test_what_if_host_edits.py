"""Edits that rewrite host work (``what_if_host_edits``, with the untraced Python around removed
ops: ``what_if_gaps``) and checkpointing's hook time and forward entries (``RemoveRecompute``),
each replayed on a step built inline where the edited step's length is known exactly, CPU-only
and with a GPU where the edit tells them apart. The real before/after pairs are in
test_calibration.py."""

from __future__ import annotations

from pathlib import Path

from builders import KinetoBuilder
from tracewhy.analyses.account import StepModel, step_model
from tracewhy.analyses.critical_path_replay import GraphEdit
from tracewhy.analyses.what_if import predict
from tracewhy.analyses.what_if_checkpoint import after_rerun_nodes, forward_at_rerun_cost
from tracewhy.analyses.what_if_edits import Fix, RemoveRecompute, WindowEdges
from tracewhy.analyses.what_if_host_edits import BatchLoop, Preallocate, RemoveCode, SetGradsToNone
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


def test_a_vectorised_loop_drops_its_split_and_join(tmp_path: Path) -> None:
    # aten::unbind (30 µs) splits the batch before the loop's first aten::mean and aten::stack
    # (20 µs) joins the results after its last; aten::sum (10 µs) runs once, later: it stays.
    # The block (0-800) makes 5 calls (160 µs) and spends 640 µs of its own: vectorised, one
    # mean is saved, unbind and stack leave, and the own time keeps the share of the calls
    # left (one mean and the sum, 2 of 5): 640 -> 256.
    b = _steps(KinetoBuilder())
    b.annotation("preprocess", 0, 800)
    b.op("aten::unbind", 10, 30).op("aten::mean", 100, 50).op("aten::mean", 200, 50)
    b.op("aten::stack", 300, 20).op("aten::sum", 700, 10)
    m = _model(tmp_path, b)
    assert _first_step(m, BatchLoop("preprocess")) == 1000 - 50 - 30 - 20 - (640 - 256)


def test_a_preallocated_buffer_makes_each_growth_cost_the_first(tmp_path: Path) -> None:
    # aten::cat grows a tensor 3 times (20, 40, 60 µs: each copies all rows so far): written in
    # place, each costs what the first did.
    b = _steps(KinetoBuilder())
    for start, dur in ((100, 20), (300, 40), (500, 60)):
        b.op("aten::cat", start, dur)
    m = _model(tmp_path, b)
    assert _first_step(m, Preallocate("aten::cat")) == 1000 - 20 - 40
    assert _first_step(m, Preallocate("aten::stack")) == 1000


def test_a_preallocated_buffer_is_never_released_while_it_grows(tmp_path: Path) -> None:
    # Each token: aten::cat (20, 40, 60 µs), 30 µs of Python (the replaced tensor dropped),
    # aten::bmm (50), 10 µs, aten::softmax (10), 10 µs. After the loop's last op (440) the step
    # waits 560 µs, untraced, to its end (the grown tensor dropped as the code returns). Written
    # in place: the growth as before (20 + 40 less), and each release down to the typical gap
    # between two other ops (bmm to softmax: 10 µs): 3 x 20 after the cats, 550 at the end.
    b = _steps(KinetoBuilder())
    for start, dur in ((0, 20), (130, 40), (280, 60)):
        b.op("aten::cat", start, dur).op("aten::bmm", start + dur + 30, 50).op("aten::softmax", start + dur + 90, 10)
    m = _model(tmp_path, b)
    assert _first_step(m, Preallocate("aten::cat")) == 1000 - (20 + 40) - 3 * 20 - 550
    # An op the loop does not repeat runs after it: the step's end is not where the grown tensor
    # is dropped, so that wait stays.
    m = _model(tmp_path, b.op("aten::sum", 600, 10))
    assert _first_step(m, Preallocate("aten::cat")) == 1000 - (20 + 40) - 3 * 20


def test_a_preallocated_buffer_makes_each_growth_kernel_cost_the_first(tmp_path: Path) -> None:
    # On a GPU the growth is the copy kernels: three aten::cat calls (10 µs each on the host)
    # launch copies of 100, 200 and 300 µs, back to back from 100 µs; the host waits for them
    # in cudaDeviceSynchronize (70-710), then adds for 270 µs. Written in place, each copy costs
    # what the first did: the GPU is done at 400, not 700, and the step 300 µs shorter. The
    # host calls, all alike, keep their time.
    b = _steps(KinetoBuilder())
    for i, copy in enumerate((100, 200, 300)):
        b.op("aten::cat", 10 + 20 * i, 10)
        b.launch("CatArrayBatchedCopy", 12 + 20 * i, 5, 100 + (0, 100, 300)[i], copy)
    b.op("cudaDeviceSynchronize", 70, 640, cat="cuda_runtime").op("aten::add", 720, 270)
    m = _model(tmp_path, b)
    assert _first_step(m, Preallocate("aten::cat")) == 1000 - 300
    # Given the growing calls, only theirs: the first two grow (their copies 100 and 200 µs),
    # the third's copy stays.
    first_two = tuple(sorted(int(i) for i in m.trace.slices.filter(
        m.trace.slices["name"].cast(str) == "aten::cat")["id"].to_list()))[:2]
    assert _first_step(m, Preallocate("aten::cat", first_two)) == 1000 - 100


def test_gradients_set_to_none_are_not_zeroed(tmp_path: Path) -> None:
    # zero_grad (700-900) zeroes two gradients (2 x 60 µs); the optimizer's step (100-500)
    # stays.
    b = _steps(KinetoBuilder())
    b.annotation("Optimizer.step#SGD.step", 100, 400).op("aten::add_", 150, 300)
    b.annotation("Optimizer.zero_grad#SGD.zero_grad", 700, 200)
    b.op("aten::zero_", 720, 60).op("aten::zero_", 800, 60)
    m = _model(tmp_path, b)
    assert _first_step(m, SetGradsToNone()) == 1000 - 2 * 60


def _zero_grad_step(b: KinetoBuilder) -> KinetoBuilder:
    # Backward hands two gradients over (AccumulateGrad nodes 100-300 and 400-600, each adding
    # the new gradient into the old one with aten::add_, 100 µs); zero_grad (1700-1900) zeroes
    # them (2 x 60 µs).
    b.annotation("ProfilerStep#1", 0, 2000).annotation("ProfilerStep#2", 2000, 100)
    for start in (100, 400):
        b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", start, 200)
        b.op("torch::autograd::AccumulateGrad", start + 5, 190).op("aten::add_", start + 50, 100)
    b.annotation("Optimizer.zero_grad#SGD.zero_grad", 1700, 200)
    return b.op("aten::zero_", 1720, 60).op("aten::zero_", 1800, 60)


def test_on_a_cpu_trace_gradients_set_to_none_land_on_fresh_pages(tmp_path: Path) -> None:
    # CPU only: the zeroing (120 µs) leaves, the nodes' accumulation (2 x 100 µs) leaves, and
    # the first touch of the gradients' pages comes in: 3 x the zeroing's 120 µs = 360 µs.
    m = _model(tmp_path, _zero_grad_step(KinetoBuilder()))
    assert _first_step(m, SetGradsToNone(first_touch_per_zeroing=3.0)) == 2000 - 120 - 200 + 360
    # Priced as free, the fix saves the zeroing and the accumulation.
    assert _first_step(m, SetGradsToNone(first_touch_per_zeroing=0.0)) == 2000 - 120 - 200


def test_on_a_gpu_trace_gradients_set_to_none_save_the_zeroing(tmp_path: Path) -> None:
    # The same step with a kernel: the caching allocator reuses the freed gradients' memory,
    # so only the zeroing leaves.
    b = _zero_grad_step(KinetoBuilder()).launch("void gemm_kernel", 1000, 10, 1010, 50)
    m = _model(tmp_path, b)
    assert _first_step(m, SetGradsToNone(first_touch_per_zeroing=3.0)) == 2000 - 120


def test_removed_code_takes_the_python_around_its_ops_with_it(tmp_path: Path) -> None:
    # Forward ops (recorded by autograd: a sequence number) with 10 µs between them; a hook
    # after the second runs aten::abs (20 µs) and aten::item (10 µs) with 60 µs of untraced
    # Python around them (30 + 20 + 10 at 210-300): the reads leave with that Python, the
    # neighbours then 10 µs apart (the typical gap between two kept ops).
    b = _steps(KinetoBuilder())
    seq = {"Sequence number": 1, "Fwd thread id": 0}
    b.op("aten::linear", 0, 100, **seq).op("aten::linear", 110, 100, **seq)
    b.op("aten::abs", 240, 20).op("aten::item", 280, 10)
    b.op("aten::relu", 300, 100, **seq).op("aten::linear", 410, 100, **seq).op("aten::linear", 520, 100, **seq)
    m = _model(tmp_path, b)
    part = "host: up to aten::item"
    assert _first_step(m, RemoveCode(part)) == 1000 - 30 - (60 - 10)
    assert _first_step(m, RemoveCode("host: up to something else")) == 1000


def test_removed_code_at_the_steps_end_takes_the_python_up_to_it(tmp_path: Path) -> None:
    # Logging at the end of the step: after three forward ops (10 µs apart) aten::norm
    # (400-420) and aten::item (440-450) run amid untraced Python that lasts to the step's end
    # (650 µs from 320 to 1000 outside the two ops). The run of removed ops reaches the window's
    # end: that Python leaves too, down to the typical gap: 1000 - 30 - (650 - 10).
    b = _steps(KinetoBuilder())
    seq = {"Sequence number": 1, "Fwd thread id": 0}
    b.op("aten::linear", 0, 100, **seq).op("aten::linear", 110, 100, **seq).op("aten::relu", 220, 100, **seq)
    b.op("aten::norm", 400, 20).op("aten::item", 440, 10)
    m = _model(tmp_path, b)
    assert _first_step(m, RemoveCode("host: up to aten::item")) == 1000 - 30 - 640


def test_checkpoint_entries_leave_with_their_wrapper_python(tmp_path: Path) -> None:
    # Two checkpointed regions, each entered with an aten::empty (5 µs, not recorded by
    # autograd) and the _NoopSaveInputs op (30 µs) after 100 µs of the wrapper's Python; the
    # model's ops (recorded: a sequence number) are 10 µs apart elsewhere.
    b = _steps(KinetoBuilder())
    seq = {"Sequence number": 1, "Fwd thread id": 0}
    b.op("aten::linear", 0, 100, **seq).op("aten::gelu", 110, 50, **seq)
    b.op("aten::empty", 200, 5).op("_NoopSaveInputs", 255, 30, **seq)
    b.op("aten::linear", 335, 100, **seq).op("aten::gelu", 445, 50, **seq)
    b.op("aten::empty", 535, 5).op("_NoopSaveInputs", 590, 30, **seq)
    b.op("aten::linear", 670, 100, **seq).op("aten::gelu", 780, 50, **seq)
    m = _model(tmp_path, b)
    # Each entry: 175 µs from the gelu's end to the linear's start (40 + 5 + 50 + 30 + 50),
    # of which 35 in ops: all of it leaves but the typical 10 µs gap (to a µs: the scaled
    # edges round down).
    assert abs(_first_step(m, RemoveRecompute()) - (1000 - 2 * (175 - 10))) <= 1


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


def _reduction_us(m: StepModel, edit: GraphEdit) -> float:
    """The host time an edit's scaled edges lose, µs."""
    g = m.graph
    dur = (g.node_ts[g.dst[edit.scaled]] - g.node_ts[g.src[edit.scaled]]).astype(float)
    return float((dur * (1.0 - edit.factor)).sum()) / US


def test_a_checkpointed_regions_forward_ops_cost_what_their_rerun_costs(tmp_path: Path) -> None:
    # A region entered with _NoopSaveInputs runs aten::linear (150 µs), aten::gelu (60) and
    # aten::linear (150) under the checkpoint's saved-tensor hooks; backward reruns them in one
    # node: 100, 70 and 90 µs. Each forward op keeps the smaller of its two times: the linears
    # lose 50 and 60 µs, the gelu (cheaper in the forward) nothing. A forward op after the
    # region (aten::mean) is no region's.
    b = _steps(KinetoBuilder(), 2000)
    seq = {"Sequence number": 1, "Fwd thread id": 0}
    b.op("_NoopSaveInputs", 0, 30, **seq)
    b.op("aten::linear", 40, 150, **seq).op("aten::gelu", 200, 60, **seq).op("aten::linear", 270, 150, **seq)
    b.op("aten::mean", 430, 50, **seq)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 500, 600).op("AddmmBackward0", 505, 590)
    b.op("aten::linear", 520, 100, **seq).op("aten::gelu", 630, 70, **seq).op("aten::linear", 710, 90, **seq)
    b.op("aten::mm", 900, 100)
    m = _model(tmp_path, b)
    w = WindowEdges(m, m.paths[0])
    assert round(_reduction_us(m, forward_at_rerun_cost(w))) == 50 + 60
    without_rerun = _steps(KinetoBuilder(), 2000).op("_NoopSaveInputs", 0, 30, **seq).op("aten::linear", 40, 150, **seq)
    m = _model(tmp_path, without_rerun)
    assert forward_at_rerun_cost(WindowEdges(m, m.paths[0])).empty


def test_the_python_after_a_node_that_reran_falls_to_its_twins(tmp_path: Path) -> None:
    # Three AddmmBackward0 nodes (100 µs each, the first rerunning aten::linear); after the
    # first 60 µs pass, untraced, before the next op, after the second 20, after the third 30
    # (then aten::sum). Without checkpointing the gap after the first falls to the median of its
    # twins' gaps that reran nothing: 25.
    b = _steps(KinetoBuilder())
    node = "autograd::engine::evaluate_function: AddmmBackward0"
    b.op(node, 0, 100).op("aten::linear", 10, 50, **{"Sequence number": 5, "Fwd thread id": 0})
    b.op(node, 160, 100).op(node, 280, 100).op("aten::sum", 410, 10)
    m = _model(tmp_path, b)
    w = WindowEdges(m, m.paths[0])
    assert round(_reduction_us(m, after_rerun_nodes(w))) == 60 - 25
    plain = _model(tmp_path, _steps(KinetoBuilder()).op(node, 0, 100).op(node, 160, 100).op("aten::sum", 300, 10))
    assert after_rerun_nodes(WindowEdges(plain, plain.paths[0])).empty
