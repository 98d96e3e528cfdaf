"""Which annotated block gates the step: the block attribution line, and whether a synchronize
ends the blocks (then their times are attribution, not throughput), for profiler traces and for
instrument logs' block timers alike."""

from __future__ import annotations

from typing import Any

import polars as pl

from tracewhy.analyses.blocks import BlockCol, BlocksOptions, BlocksResult, blocks
from tracewhy.analyses.log_blocks import GPU, LogBlocksCol, LogBlocksResult
from tracewhy.analyses.nvtx_work import GpuWork, gpu_work
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.units import fmt_ns as ms

#: Blocks named in the attribution statement.
_NAMED: int = 5


def gpu_work_result(ctx: Context) -> GpuWork:
    """The GPU work of each NVTX range, once per diagnosis: blocks and the report's projection
    table both start from it (the costliest part of either on a large nsys export)."""
    return ctx.cached("nvtx_gpu_work", lambda: gpu_work(ctx.trace))


def blocks_result(ctx: Context) -> BlocksResult:
    """The block table, without the per-range instances (no rule reads them)."""
    return ctx.cached("blocks", lambda: blocks(
        ctx.trace, BlocksOptions(step_marker=ctx.options.step_marker, warmup=ctx.options.warmup, instances=False),
        steps_result=ctx.steps(), work=gpu_work_result(ctx),
    ))


def findings(ctx: Context) -> list[Finding]:
    """Block attribution for diagnose, and the trust check that the blocks were timed one by one:
    the same two findings, from the same function, as the ``blocks`` command."""
    r = blocks_result(ctx)
    return [f for f in (synchronized_blocks(r), attribution(r)) if f is not None]


def attribution(r: BlocksResult) -> Finding | None:
    """'denoise 435 ms (66.8%), decode 107 ms (16.5%), ...' over the outermost blocks with GPU work."""
    gpu = r.table.filter(pl.col(BlockCol.GPU_TIME_PER_STEP) > 0)
    if gpu.height < th.BLOCKS_MIN_FOR_ATTRIBUTION:
        return None
    top = gpu.filter(pl.col(BlockCol.LEVEL) == gpu.get_column(BlockCol.LEVEL).min())
    if top.height < th.BLOCKS_MIN_FOR_ATTRIBUTION:
        top = gpu
    unit = "over the trace (no step markers)" if r.per_capture else "per step"
    # A block whose work another thread launched (autograd's backward thread) shows little of it.
    outer = r.table.filter(pl.col(BlockCol.LEVEL) == pl.col(BlockCol.LEVEL).min())
    elsewhere = outer.filter(pl.col(BlockCol.OTHER_THREADS_GPU_PER_STEP) > pl.max_horizontal(
        pl.col(BlockCol.GPU_TIME_PER_STEP), pl.lit(0))).sort(BlockCol.OTHER_THREADS_GPU_PER_STEP, descending=True)
    owns_little = (f" {elsewhere.height} block(s) own little of the GPU work launched while they were open (other "
                   f"threads launched it), most {elsewhere.row(0, named=True)[BlockCol.NAME]!r}: "
                   f"{_ms(elsewhere.get_column(BlockCol.OTHER_THREADS_GPU_PER_STEP).max())} {unit}."
                   if elsewhere.height else "")
    first = top.row(0, named=True)
    shown = top.head(_NAMED)
    return Finding(
        code=Code.BLOCK_ATTRIBUTION, severity=Severity.INFO,
        statement=f"GPU time {unit} by annotated block (the top {shown.height} of {top.height} tabled): "
                  f"{first[BlockCol.NAME]} leads with {_ms(first[BlockCol.GPU_TIME_PER_STEP])} "
                  f"({100 * first[BlockCol.GPU_SHARE]:.1f}%).{owns_little}",
        next_step=f"Start with {first[BlockCol.NAME]!r}: tracewhy blocks TRACE --names '{first[BlockCol.NAME]}' and "
                  "tracewhy kernels TRACE for the kernels inside it.",
        evidence={"steps": r.steps, "gpu_time_ns_per_step": r.gpu_time_ns_per_step, "unit": unit,
                  "blocks": shown.select(BlockCol.NAME, BlockCol.GPU_TIME_PER_STEP, BlockCol.GPU_SHARE).to_dicts(),
                  "owns_little": elsewhere.select(BlockCol.NAME, BlockCol.OTHER_THREADS_GPU_PER_STEP).to_dicts()},
    )


def _ms(ns: Any) -> str:
    """A block's time as every finding gives times (1.041 s, 279.0 ms), never 1.04e+03 ms."""
    return ms(int(ns or 0))


def synchronized_blocks(r: BlocksResult) -> Finding | None:
    """The run was timed block by block: a synchronize ends most blocks that launched GPU work
    (the next call after a block's last launch, at most analyses/blocks.SYNC_AFTER_BLOCK_NS after
    its end), and more than one per step, so the syncs separate blocks, not only steps. ``blocks``,
    ``diagnose`` and ``check`` all say it through this function."""
    share = r.synced_share
    n = int(r.table.get_column(BlockCol.GPU_INSTANCES).sum()) if r.table.height else 0
    if share is None or n < th.BLOCKS_MIN_FOR_ATTRIBUTION or share < th.BLOCKS_SYNCED_MIN_SHARE:
        return None
    per_step, unit = ending_syncs_per_step(r)
    if per_step < th.BLOCKS_SYNCS_MIN_PER_STEP:
        return None
    synced = int(r.table.get_column(BlockCol.SYNCED_INSTANCES).sum())
    return Finding(
        code=Code.BLOCKS_SYNCHRONIZED, severity=Severity.TRUST,
        statement=f"A synchronize ends {synced} of {n} annotated blocks that launched GPU work "
                  f"({100 * share:.0f}%; {per_step:.3g} synchronizes {unit}): the GPU drains after every block, so "
                  "blocks cannot overlap and the step is slower than without them. Read the block and step times "
                  "as attribution, not throughput.",
        next_step="Measure throughput without the per-block torch.cuda.synchronize() (at most one per step).",
        evidence={"blocks_with_gpu_work": n, "ended_by_sync": synced, "share": round(share, 3),
                  "ending_syncs": r.ending_syncs, "ending_syncs_per_step": round(per_step, 2), "unit": unit},
    )


def ending_syncs_per_step(r: BlocksResult) -> tuple[float, str]:
    """Distinct synchronizes that ended a block, per steady step, and the unit said. Without
    steps, per repeat of the block with the most instances that launched GPU work: a loop runs
    each of its blocks once an iteration, so a loop's one sync per iteration (``loss.item()``
    after its only GPU block) comes to one, as it does per step."""
    if not r.per_capture:
        return r.ending_syncs / r.steps, "per step"
    repeats = int(r.table.select(pl.col(BlockCol.GPU_INSTANCES).max().fill_null(0)).item()) if r.table.height else 0
    return r.ending_syncs / max(repeats, 1), "per iteration (no step markers)"


def log_attribution(r: LogBlocksResult) -> Finding | None:
    """The same line from block timers: 'denoise 435 ms (66.8%), ...' per rank, over its top-level
    blocks, as the mean per steady step (or chunk) and the share of those blocks' time."""
    top = r.table.filter(pl.col(LogBlocksCol.LEVEL) == pl.col(LogBlocksCol.LEVEL).min().over(LogBlocksCol.RANK))
    if top.height < th.BLOCKS_MIN_FOR_ATTRIBUTION:
        return None
    ranks = top.get_column(LogBlocksCol.RANK).unique(maintain_order=True).to_list()
    lines = []
    for rank in ranks:
        rows = top.filter(pl.col(LogBlocksCol.RANK) == rank).head(_NAMED).iter_rows(named=True)
        line = ", ".join(f"{b[LogBlocksCol.NAME]} {b[LogBlocksCol.PER_UNIT] / 1e6:.3g} ms "
                         f"({100 * (b[LogBlocksCol.SHARE] or 0.0):.1f}%)" for b in rows)
        lines.append(f"rank {rank}: {line}" if len(ranks) > 1 else line)
    time = "GPU time" if r.basis == GPU else "Host time"
    per = f"per {r.unit}" if r.unit != "capture" else "over the log (no steps or chunks)"
    counts = sorted(r.steady_units.items())
    steady = str(counts[0][1]) if len({n for _, n in counts}) == 1 else \
        "(" + ", ".join(f"rank {k}: {n}" for k, n in counts) + ")"
    window = f"mean over {steady} steady {r.unit}s after {r.warmup} warm-up" if r.unit != "capture" else "every block"
    first = top.row(0, named=True)
    return Finding(
        code=Code.BLOCK_ATTRIBUTION, severity=Severity.INFO,
        statement=(f"{time} {per} by block ({window}; share of the top-level blocks' time on each rank): "
                   f"{'; '.join(lines)}."),
        next_step=(f"Start with {first[LogBlocksCol.NAME]!r}: profile a few steps with tracewhy.capture.profile and "
                   f"run tracewhy blocks TRACE --names '{first[LogBlocksCol.NAME]}' for the kernels inside it."),
        evidence={"unit": r.unit, "basis": r.basis, "warmup": r.warmup, "steady_units": r.steady_units,
                  "blocks": top.select(LogBlocksCol.RANK, LogBlocksCol.NAME, LogBlocksCol.PER_UNIT,
                                       LogBlocksCol.SHARE).to_dicts()},
    )


def log_synchronized(r: LogBlocksResult) -> Finding | None:
    """The log was written in attribution mode (``block(..., sync=True)``): every such block
    drained the GPU at its end, which removes the overlap the job has without it."""
    if not r.synced_instances and not r.sync:
        return None
    return Finding(
        code=Code.BLOCKS_SYNCHRONIZED, severity=Severity.TRUST,
        statement=(f"Written in attribution mode (sync=True): a synchronize ends {r.synced_instances} of "
                   f"{r.instances} steady blocks, so the GPU drains after each and blocks cannot overlap. The "
                   "block times attribute the step; they do not measure its throughput, and any overlap is lost."),
        next_step=("Measure throughput with the blocks written without sync (tracewhy.instrument.block(name) "
                   "records CUDA events and never synchronizes), and compare the step times."),
        evidence={"synced_instances": r.synced_instances, "instances": r.instances, "header_sync": r.sync},
    )
