"""What-if predictions: each fix replayed on a trace built inline where the edited step's length
is known exactly, on the real or generated trace where it applies, and, where the critical
path's gains replay the same change, agreeing with them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from tracewhy.analyses.account import AccountCol, StepModel, step_account, step_model
from tracewhy.analyses.account_names import PartName
from tracewhy.analyses.critical_path import CriticalPathOptions, PathCol, critical_path
from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.what_if import WhatIfCol, predict, what_if
from tracewhy.analyses.what_if_edits import (
    DropSync,
    Edit,
    HideCollective,
    MultiTensorOptimizer,
    OverlapCopies,
    PrefetchData,
    RemoveCompile,
    RemoveRecompute,
    WindowEdges,
)
from tracewhy.analyses.what_if_removals import RemovePart, RemoveSlices
from tracewhy.readers import read_trace

US = 1000
FETCH = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _model(tmp_path: Path, b: KinetoBuilder) -> StepModel:
    return step_model(read_trace(b.write(tmp_path / "t.json")))


def _first_step(model: StepModel, *edits: Edit) -> int:
    """The first analysed step's predicted length, µs (the builders' steps are step 0)."""
    return predict(model, list(edits), [WindowEdges(model, model.paths[0])]).predicted_ns // US


def _steps(b: KinetoBuilder, length: float = 1000) -> KinetoBuilder:
    return b.annotation("ProfilerStep#1", 0, length).annotation("ProfilerStep#2", length, 100)


def test_no_edit_predicts_the_measured_step(tmp_path: Path) -> None:
    m = step_model(read_trace(GENERATED / "cpu_dataloader_slow.pt.trace.json.gz"))
    p = predict(m, [])
    assert p.predicted_ns == p.measured_ns and not p.changed


def test_dropping_a_sync_gives_the_longer_of_the_two_chains(tmp_path: Path) -> None:
    # aten::mm launches a gemm (40-840); cudaDeviceSynchronize (100-850) waits for it, then
    # aten::add (860-990). Without the wait the host is done at 250 µs (the sync returns at
    # once, add runs 110-240, the step's last 10 µs); the GPU chain runs to 840: the step ends
    # with the longer one.
    b = _steps(KinetoBuilder())
    b.op("aten::mm", 10, 50).launch("sm80_gemm_kernel", 20, 10, gpu_ts=40, gpu_dur=800)
    b.op("cudaDeviceSynchronize", 100, 750, cat="cuda_runtime")
    b.op("aten::add", 860, 130)
    m = _model(tmp_path, b)
    assert _first_step(m) == 1000
    assert _first_step(m, DropSync()) == 840
    # With a 1 ms kernel-free host tail the host chain is the longer one.
    b2 = _steps(KinetoBuilder(), 2000)
    b2.op("aten::mm", 10, 50).launch("sm80_gemm_kernel", 20, 10, gpu_ts=40, gpu_dur=800)
    b2.op("cudaDeviceSynchronize", 100, 750, cat="cuda_runtime")
    b2.op("aten::add", 860, 1130)
    assert _first_step(_model(tmp_path, b2), DropSync()) == 100 + 10 + 1130 + 10


def test_a_copy_that_overlaps_no_longer_holds_the_host_or_the_stream(tmp_path: Path) -> None:
    # aten::to's cudaMemcpyAsync (20-490) waits for its pageable copy (30-480); aten::mm then
    # launches a gemm (510-520 -> 530-930) that cudaDeviceSynchronize (560-940) waits for.
    # Pinned and non_blocking: the call returns at once (to ends at 30), mm launches at 40,
    # the gemm runs 60-460, the sync returns at 470 and the step ends 60 µs later: 530. The
    # copy (30-480 on its own stream) ends before that.
    b = _steps(KinetoBuilder())
    b.op("aten::to", 10, 490).launch("Memcpy HtoD (Pageable -> Device)", 20, 470, gpu_ts=30, gpu_dur=450,
                                     cat="gpu_memcpy", api="cudaMemcpyAsync", bytes=1 << 20)
    b.op("aten::mm", 500, 50).launch("sm80_gemm_kernel", 510, 10, gpu_ts=530, gpu_dur=400)
    b.op("cudaDeviceSynchronize", 560, 380, cat="cuda_runtime")
    m = _model(tmp_path, b)
    assert _first_step(m, OverlapCopies("HtoD")) == 530
    assert _first_step(m, OverlapCopies("DtoH")) == 1000  # nothing to move


def test_prefetching_takes_the_fetch_off_and_leaves_the_collate(tmp_path: Path) -> None:
    # The fetch (10-700) holds the batch's aten::stack (600-650): with workers the 640 µs of
    # the dataset's Python leave the main thread, the 50 µs of stacking stay.
    b = _steps(KinetoBuilder())
    b.annotation(FETCH, 10, 690).op("aten::stack", 600, 50)
    b.op("aten::mm", 710, 280)
    m = _model(tmp_path, b)
    assert _first_step(m, PrefetchData()) == 1000 - 640


def test_a_multi_tensor_optimizer_keeps_one_launch_per_chunk_on_a_gpu(tmp_path: Path) -> None:
    # Optimizer.step (100-500) calls aten::add_ once per parameter (4 x 40 µs), each launching
    # a kernel: with foreach, one call per 36 tensors, the 3 others saving the cheapest call's
    # 40 µs each. The Python between the calls stays: on a GPU the launches are what it saves.
    b = _steps(KinetoBuilder())
    b.annotation("Optimizer.step#SGD.step", 100, 400)
    for start in (110, 200, 290, 380):
        b.op("aten::add_", start, 40).launch("vectorized_elementwise_kernel", start + 10, 20, gpu_ts=start + 25,
                                             gpu_dur=5)
    m = _model(tmp_path, b)
    assert _first_step(m, MultiTensorOptimizer()) == 1000 - 3 * 40


def test_removing_recompute_drops_the_forward_rerun_in_backward(tmp_path: Path) -> None:
    # A backward node reruns aten::relu (autograd records it: a sequence number) for 200 µs
    # before its own threshold_backward.
    b = _steps(KinetoBuilder())
    b.op("autograd::engine::evaluate_function: ReluBackward0", 100, 500).op("ReluBackward0", 110, 480)
    b.op("aten::relu", 120, 200, **{"Sequence number": 5, "Fwd thread id": 0})
    b.op("aten::threshold_backward", 330, 250)
    m = _model(tmp_path, b)
    assert _first_step(m, RemoveRecompute()) == 1000 - 200


def test_removing_compilation_keeps_the_compiled_code(tmp_path: Path) -> None:
    b = _steps(KinetoBuilder())
    b.annotation("Torch-Compiled Region: 0/0", 10, 980)
    b.annotation("_compile.compile_inner (dynamo_timed)", 20, 780)
    b.annotation("CompiledFunction", 810, 170)
    m = _model(tmp_path, b)
    assert _first_step(m, RemoveCompile()) == 1000 - 780


def test_a_gradient_allreduce_hidden_until_the_optimizer_reads_it(tmp_path: Path) -> None:
    # Backward launches an all-reduce (30-2030 on stream 20); the next gemm (launched at 120)
    # waits for it on stream 7 (2040-2540, a wait the trace did not record), a sync waits for
    # the gemm (2550), then the optimizer (2560-2990). Hidden, the gemm starts 10 µs after its
    # launch (the trace's launch latency: 130-630), the sync returns at 640, and the optimizer,
    # which reads the reduced gradients, starts when the all-reduce ends: 2030 + 430 + 10.
    b = _steps(KinetoBuilder(), 3000)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 10, 90)
    b.launch("ncclKernel_AllReduce_RING_LL_Sum_float", 20, 5, gpu_ts=30, gpu_dur=2000, stream=20)
    b.op("autograd::engine::evaluate_function: MmBackward0", 110, 90)
    b.launch("sm80_gemm_kernel", 120, 5, gpu_ts=2040, gpu_dur=500, stream=7)
    b.op("cudaDeviceSynchronize", 210, 2340, cat="cuda_runtime")
    b.annotation("Optimizer.step#SGD.step", 2560, 430)
    m = _model(tmp_path, b)
    assert _first_step(m) == 3000
    assert _first_step(m, HideCollective()) == 2030 + 430 + 10
    assert _first_step(m, HideCollective("broadcast")) == 3000


def test_a_hidden_allreduce_still_costs_the_host_its_issue(tmp_path: Path) -> None:
    # DDP's hook issues the all-reduce from backward: nccl:all_reduce (20-220 on the host) holds
    # its launch (25); the kernel runs 300-700 on stream 20 and nothing waits for it; backward's
    # host work goes on to 990. The step is the host's: hiding the kernel under compute changes
    # nothing, and issuing an asynchronous collective costs the host the same hidden or not.
    b = _steps(KinetoBuilder())
    b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 10, 980)
    b.annotation("nccl:all_reduce", 20, 200)
    b.launch("ncclKernel_AllReduce_RING_LL_Sum_float", 25, 5, gpu_ts=300, gpu_dur=400, stream=20)
    m = _model(tmp_path, b)
    assert _first_step(m) == 1000
    assert _first_step(m, HideCollective()) == 1000
    assert _first_step(m, HideCollective("all_reduce")) == 1000


def test_a_cpu_collective_in_backward_leaves_with_its_time(tmp_path: Path) -> None:
    # gloo on CPU tensors: c10d::allreduce_ (20-320) launches no GPU work, the data moves inside
    # the call: hidden, its 300 µs leave the host's path.
    b = _steps(KinetoBuilder())
    b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 10, 980)
    b.op("c10d::allreduce_", 20, 300)
    m = _model(tmp_path, b)
    assert _first_step(m, HideCollective()) == 1000 - 300


def test_gradients_reduced_by_hand_after_backward_are_hidden_with_their_waits(tmp_path: Path) -> None:
    # gloo on CPU, the gradients all-reduced by hand once backward (10-300) is done: each
    # c10d::allreduce_ (20 µs) is followed by its untraced wait (to 600, to 800) before the
    # division; then the optimizer (820-990, two aten::add_). Hidden (as DDP would issue them
    # from backward), the calls leave the thread and their waits shrink to the gap two kept ops
    # leave (10 µs): 40 + (280 - 10) + (170 - 10) = 470 µs off the thread. That data movement
    # still takes its time, on gloo's thread, from backward's start (no AccumulateGrad here):
    # the optimizer starts at 10 + 470 = 480, not 820, and the step ends 340 µs sooner. Had the
    # reduction not been on the clock, the step would have lost all 470 (its old prediction).
    b = _steps(KinetoBuilder())
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 10, 290)
    b.op("c10d::allreduce_", 310, 20).op("aten::div_", 600, 10)
    b.op("c10d::allreduce_", 620, 20).op("aten::div_", 800, 10)
    b.annotation("Optimizer.step#SGD.step", 820, 170).op("aten::add_", 820, 70).op("aten::add_", 900, 80)
    m = _model(tmp_path, b)
    assert _first_step(m) == 1000
    assert _first_step(m, HideCollective("all_reduce")) == 1000 - (820 - (10 + 470))
    assert _first_step(m, HideCollective("broadcast")) == 1000


def test_a_reduction_on_the_backends_thread_is_counted_once(tmp_path: Path) -> None:
    # The same by-hand reduction, with gloo's own thread recording its work (a gloo:all_reduce
    # range, 330-590, while the caller waits untraced): hidden, what the lane carries is the
    # time the data moved on the clock, 470 µs as above, not that plus the 260 µs range. The
    # optimizer still starts at 480, and what it waited for is communication.
    b = _steps(KinetoBuilder())
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 10, 290)
    b.op("c10d::allreduce_", 310, 20).annotation("gloo:all_reduce", 330, 260, tid=2).op("aten::div_", 600, 10)
    b.op("c10d::allreduce_", 620, 20).annotation("gloo:all_reduce", 640, 150, tid=2).op("aten::div_", 800, 10)
    b.annotation("Optimizer.step#SGD.step", 820, 170).op("aten::add_", 820, 70).op("aten::add_", 900, 80)
    m = _model(tmp_path, b)
    assert _first_step(m, HideCollective("all_reduce")) == 1000 - (820 - (10 + 470))
    p = predict(m, [HideCollective("all_reduce")], [WindowEdges(m, m.paths[0])])
    assert p.next_bottleneck == "communication: all_reduce"
    assert p.parts["communication: all_reduce"] == 470 * US


def test_a_collective_before_backward_is_no_gradient_reduction(tmp_path: Path) -> None:
    # A broadcast before the forward (a config agreed between ranks) is read by what follows it:
    # hiding gradient collectives leaves it.
    b = _steps(KinetoBuilder())
    b.op("c10d::broadcast_", 10, 200)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 220, 500)
    b.annotation("Optimizer.step#SGD.step", 730, 260)
    m = _model(tmp_path, b)
    assert _first_step(m, HideCollective()) == 1000


def test_edits_together_are_one_replay(tmp_path: Path) -> None:
    # The fetch and the planted host block both leave: 1000 - 300 - 200.
    b = _steps(KinetoBuilder())
    b.annotation(FETCH, 10, 300).annotation("planted", 320, 200).op("aten::mm", 530, 460)
    m = _model(tmp_path, b)
    assert _first_step(m, PrefetchData(), RemovePart("host: planted")) == 500
    assert _first_step(m, PrefetchData()) + _first_step(m, RemovePart("host: planted")) - 1000 == 500


# --- real and generated traces ---------------------------------------------------------------------


def test_prefetch_agrees_with_the_gains_of_the_fetch() -> None:
    # cpu_dataloader_slow: the fetches hold only CPU ops (the collate) besides their own time, so
    # "workers prefetch" is the gains' "the fetch takes no time", step for step.
    trace = read_trace(GENERATED / "cpu_dataloader_slow.pt.trace.json.gz")
    m = step_model(trace)
    path = critical_path(trace, CriticalPathOptions(gain_items=10))
    gains = path.gains.filter((pl.col(PathCol.CATEGORY) == "host_ops") & (pl.col("name") == FETCH))
    for p in m.paths:
        expected = gains.filter(pl.col(PathCol.STEP) == p.step).get_column(PathCol.GAIN).item()
        assert predict(m, [PrefetchData()], [WindowEdges(m, p)]).saved_ns == expected
    top = what_if(m, step_account(trace, model=m)).table.row(0, named=True)
    assert top[WhatIfCol.EDIT] == PrefetchData().label and top[WhatIfCol.SAVED_SHARE] > 0.8


def test_removing_slices_is_the_gains_replay() -> None:
    # The same change, the critical path's way and the prediction's: the top items of every
    # step of a DDP trace, each taking no time.
    trace = read_trace(shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz"))
    m = step_model(trace)
    cp = critical_path(trace, CriticalPathOptions(gain_items=3))
    s = trace.slices
    for p in m.paths:
        rows = cp.gains.filter((pl.col(PathCol.STEP) == p.step) & pl.col(PathCol.GAIN).is_not_null())
        for name, category, gain in rows.select("name", PathCol.CATEGORY, PathCol.GAIN).iter_rows():
            on = cp.on_path.filter((pl.col(PathCol.STEP) == p.step) & (pl.col("name") == name)
                                   & (pl.col(PathCol.CATEGORY) == category))
            kinds = (Edge.GPU,) if category in ("kernels", "communication", "copies") and str(
                s.get_column("kind")[int(on.get_column("id")[0])]) != "runtime" else (Edge.HOST,)
            got = predict(m, [RemoveSlices(tuple(on.get_column("id").to_list()), kinds)], [WindowEdges(m, p)])
            assert got.saved_ns == gain, name


def test_pinned_copies_beside_compute_still_end_the_h100_window() -> None:
    # 95% of the window is one stream of pinned HtoD copies: beside compute they still run one
    # after another, so the window shrinks by what else was on its path and the copies stay
    # the next bottleneck.
    m = step_model(read_trace(shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz")))
    a = step_account(m.trace, model=m)
    copies = a.parts.filter(pl.col(AccountCol.PART) == "copies: HtoD pinned").row(0, named=True)
    p = predict(m, [OverlapCopies("HtoD")])
    assert p.changed and p.next_bottleneck == "copies: HtoD pinned"
    assert copies[AccountCol.NS_PER_STEP] <= p.predicted_ns < p.measured_ns
    assert p.next_bottleneck_ns == copies[AccountCol.NS_PER_STEP]


def test_compile_time_leaves_the_recompiling_step() -> None:
    m = step_model(read_trace(GENERATED / "cpu_compile_recompile_every.pt.trace.json.gz"))
    a = step_account(m.trace, model=m)
    compiling = a.parts.filter(pl.col(AccountCol.PART) == PartName.COMPILATION).row(0, named=True)
    p = predict(m, [RemoveCompile()])
    # A recompile in every step: the replay (over at most PREDICTED_STEPS of the account's steps,
    # so its mean differs) saves the compilation's share of its own measured step.
    assert p.saved_ns == pytest.approx(compiling[AccountCol.SHARE] * p.measured_ns, rel=0.01)
    assert p.next_bottleneck != PartName.COMPILATION and PartName.COMPILATION not in p.parts


def test_a_device_synchronize_that_waits_no_longer() -> None:
    # TraceLens' MI300X Qwen step opens with a 13 ms hipDeviceSynchronize the trace links to no
    # GPU work: without it the host launches sooner, but the GPU work that ran in the step still
    # has to finish, so the step saves less than the wait, and the sync leaves the path.
    m = step_model(read_trace(shared_trace("tracelens/mi300x_qwen1.5-0.5b_bs16_seq2048.json.gz")))
    a = step_account(m.trace, model=m)
    waits = a.parts.filter(pl.col(AccountCol.KIND) == "sync").get_column(AccountCol.NS_PER_STEP).sum()
    p = predict(m, [DropSync()])
    assert p.changed and 0 < p.saved_ns < waits
    assert not any(part.startswith("sync: ") for part in p.parts)


def test_item_reads_and_adam_steps_on_cpu() -> None:
    # On CPU a read waits for nothing: dropping the waits changes no step. The loop's own
    # logging work, taken out, saves what the account gives it. Adam's single-tensor loop
    # (foreach=False) calls each op once per parameter: foreach saves host time.
    item = step_model(read_trace(GENERATED / "cpu_item_sync.pt.trace.json.gz"))
    assert predict(item, [DropSync("aten::item")]).saved_ns == 0
    logging = step_account(item.trace, model=item).parts.filter(pl.col(AccountCol.PART) == "host: up to aten::item")
    saved = predict(item, [RemovePart("host: up to aten::item")]).saved_ns
    assert saved == pytest.approx(logging.get_column(AccountCol.NS_PER_STEP).item(), rel=0.01)
    adam = step_model(read_trace(GENERATED / "cpu_adam_item.pt.trace.json.gz"))
    p = predict(adam, [MultiTensorOptimizer()])
    optimizer = step_account(adam.trace, model=adam).parts.filter(pl.col(AccountCol.PART) == PartName.OPTIMIZER)
    assert p.changed and 0 < p.saved_ns < optimizer.get_column(AccountCol.NS_PER_STEP).item()


def test_recompute_leaves_the_checkpointed_resnet() -> None:
    # TraceLens' activation-checkpointing ResNet: conv and batch-norm rerun in backward's unpack
    # hooks; removing them shortens the step, by no more than backward's time on the path.
    m = step_model(read_trace(shared_trace("tracelens/mi300x_resnet_actckpt_ddp8_rank0.json.gz")))
    assert (m.rules.ctx.recompute >= 0).any()
    p = predict(m, [RemoveRecompute()])
    assert p.changed and p.saved_ns > 0


def test_the_hidden_allreduce_of_ddp_saves_at_most_the_exposed_waits() -> None:
    # Hiding the gradient all-reduce removes its kernels from the compute stream's order and the
    # waits on them: no more than the account's communication and sync parts together. On HTA's
    # A100 DDP step the path is the host's (forward, backward, optimizer); no all-reduce kernel
    # is on it, and the host's calls issuing the all-reduce stay: nothing to save.
    m = step_model(read_trace(shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz")))
    a = step_account(m.trace, model=m)
    exposed = a.parts.filter(pl.col(AccountCol.KIND).is_in(["communication", "sync"])).get_column(
        AccountCol.NS_PER_STEP).sum()
    p = predict(m, [HideCollective("all_reduce")])
    assert p.changed and 0 <= p.saved_ns <= exposed
    assert p.saved_ns < 100_000


def test_what_if_combines_the_three_that_save_most() -> None:
    m = step_model(read_trace(GENERATED / "cpu_item_sync.pt.trace.json.gz"))
    r = what_if(m, step_account(m.trace, model=m))
    alone = r.table.filter(~pl.col(WhatIfCol.COMBINED))
    both = r.table.filter(pl.col(WhatIfCol.COMBINED)).row(0, named=True)
    best = alone.sort(WhatIfCol.SAVED, descending=True).head(3).get_column(WhatIfCol.SAVED).to_numpy()
    assert both[WhatIfCol.SAVED] == pytest.approx(np.sum(best), rel=0.05)
