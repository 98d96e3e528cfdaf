"""Which annotated block gates the step: the block attribution line, and whether a synchronize
ends the blocks (then their times are attribution, not throughput)."""

from __future__ import annotations

import polars as pl

from tracewhy.analyses.blocks import BlockCol, BlocksOptions, BlocksResult, blocks
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity

#: Blocks named in the attribution statement.
_NAMED: int = 5


def blocks_result(ctx: Context) -> BlocksResult:
    return ctx.cached("blocks", lambda: blocks(
        ctx.trace, BlocksOptions(step_marker=ctx.options.step_marker, warmup=ctx.options.warmup),
        steps_result=ctx.steps(),
    ))


def findings(ctx: Context) -> list[Finding]:
    """Block attribution for diagnose. The synchronize-per-block trust check lives in
    findings/trust.py (``sync-after-every-block``); ``synchronized_blocks`` is the ``blocks``
    command's own version of it, measured on launches."""
    f = attribution(blocks_result(ctx))
    return [f] if f is not None else []


def attribution(r: BlocksResult) -> Finding | None:
    """'denoise 435 ms (66.8%), decode 107 ms (16.5%), ...' over the outermost blocks with GPU work."""
    gpu = r.table.filter(pl.col(BlockCol.GPU_TIME_PER_STEP) > 0)
    if gpu.height < th.BLOCKS_MIN_FOR_ATTRIBUTION:
        return None
    top = gpu.filter(pl.col(BlockCol.LEVEL) == gpu.get_column(BlockCol.LEVEL).min())
    if top.height < th.BLOCKS_MIN_FOR_ATTRIBUTION:
        top = gpu
    unit = "per step" if r.note is None or "per capture" not in r.note else "over the trace (no step markers)"
    line = ", ".join(
        f"{b[BlockCol.NAME]} {b[BlockCol.GPU_TIME_PER_STEP] / 1e6:.3g} ms ({100 * b[BlockCol.GPU_SHARE]:.1f}%)"
        for b in top.head(_NAMED).iter_rows(named=True)
    )
    # A block whose work another thread launched (autograd's backward thread) shows little of it.
    elsewhere = "".join(
        f" {b[BlockCol.NAME]} owns little: {b[BlockCol.OTHER_THREADS_GPU_PER_STEP] / 1e6:.3g} ms {unit} more were "
        "launched by other threads while it was open."
        for b in r.table.filter(pl.col(BlockCol.LEVEL) == pl.col(BlockCol.LEVEL).min()).iter_rows(named=True)
        if b[BlockCol.OTHER_THREADS_GPU_PER_STEP] > max(b[BlockCol.GPU_TIME_PER_STEP], 0)
    )
    first = top.row(0, named=True)
    return Finding(
        code=Code.BLOCK_ATTRIBUTION, severity=Severity.INFO,
        statement=f"GPU time {unit} by annotated block: {line}.{elsewhere}",
        next_step=f"Start with {first[BlockCol.NAME]!r}: tracewhy blocks TRACE --names '{first[BlockCol.NAME]}' and "
                  "tracewhy kernels TRACE for the kernels inside it.",
        evidence={"steps": r.steps, "gpu_time_ns_per_step": r.gpu_time_ns_per_step,
                  "blocks": top.select(BlockCol.NAME, BlockCol.GPU_TIME_PER_STEP, BlockCol.GPU_SHARE).to_dicts()},
    )


def synchronized_blocks(r: BlocksResult) -> Finding | None:
    """Most blocks that launched GPU work end with a synchronize before anything else is launched."""
    share = r.synced_share
    n = int(r.table.get_column(BlockCol.GPU_INSTANCES).sum()) if r.table.height else 0
    if share is None or n < th.BLOCKS_MIN_FOR_ATTRIBUTION or share < th.BLOCKS_SYNCED_MIN_SHARE:
        return None
    synced = int(r.table.get_column(BlockCol.SYNCED_INSTANCES).sum())
    return Finding(
        code=Code.BLOCKS_SYNCHRONIZED, severity=Severity.TRUST,
        statement=f"A synchronize ends {synced} of {n} annotated blocks that launched GPU work "
                  f"({100 * share:.0f}%): the GPU drains after every block, so blocks cannot overlap. "
                  "Read the block times as attribution, not throughput.",
        next_step="Measure throughput without the per-block torch.cuda.synchronize() (at most one per step).",
        evidence={"blocks_with_gpu_work": n, "ended_by_sync": synced, "share": round(share, 3)},
    )
