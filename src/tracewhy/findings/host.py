"""Host-side signatures that cost time even when they are not the biggest gap: copies from
pageable memory, synchronous copies, allocator calls in steady state and per-step scalar reads
(step-time spikes are ``findings/spikes.py``'s)."""

from __future__ import annotations

import numpy as np
import polars as pl

from tracewhy.analyses.copies import copies
from tracewhy.analyses.host_activity import Flag
from tracewhy.analyses.source_lines import SourceLine
from tracewhy.analyses.steps import StepCol
from tracewhy.analyses.syncs import compiler_rows
from tracewhy.findings import source_line as sl
from tracewhy.findings import thresholds as th
from tracewhy.findings.anti_patterns import anti_patterns_result
from tracewhy.findings.applicability import device_allocation_advice, pinned_copy_advice, run_facts
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col
from tracewhy.units import fmt_bytes
from tracewhy.units import fmt_ns as ms


def findings(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    steps = max(ctx.steps().table.height, 1)
    facts = run_facts(ctx)
    c = copies(ctx.trace)
    if c.pageable_bytes / steps >= th.PAGEABLE_MIN_BYTES:
        pageable = c.by_direction.filter((pl.col("src_mem") == "Pageable") | (pl.col("dst_mem") == "Pageable"))
        gbps = pageable.get_column("bytes").sum() / max(int(pageable.get_column("time_ns").sum()), 1)
        out.append(Finding(
            code=Code.PAGEABLE_MEMCPY, severity=Severity.MEDIUM,
            statement=f"{c.pageable_count} copies move {fmt_bytes(c.pageable_bytes)} through pageable host memory "
                      f"({fmt_bytes(round(c.pageable_bytes / steps))} per step at {gbps:.1f} GB/s): each is staged "
                      "through a bounce buffer and cannot overlap the host.",
            next_step=pinned_copy_advice(facts) + ".",
            recoverable_ns_per_step=0,
            evidence={"pageable_copies": c.pageable_count, "pageable_bytes": c.pageable_bytes,
                      "by_direction": c.by_direction.to_dicts()},
        ))
    if c.sync_copy_calls:
        out.append(Finding(
            code=Code.SYNCHRONOUS_MEMCPY, severity=Severity.LOW,
            statement=f"{c.sync_copy_calls} synchronous copy calls (cudaMemcpy without Async) blocked the host "
                      f"{ms(c.sync_copy_ns)} in total.",
            next_step=("Use tensor.to(device, non_blocking=True) from pinned memory, or cudaMemcpyAsync on a stream."
                       if facts.pytorch else "Use cudaMemcpyAsync on a stream, from pinned host memory."),
            evidence={"calls": c.sync_copy_calls, "blocked_ns": c.sync_copy_ns},
        ))
    out += _allocator(ctx)
    out += _scalar_reads(ctx)
    return out


def _allocator(ctx: Context) -> list[Finding]:
    host = ctx.host()
    steps_table = ctx.steps().table
    rows = np.flatnonzero(host.self_flag[Flag.ALLOC])
    if rows.size == 0 or steps_table.height == 0:
        return []
    steady = steps_table.filter(pl.col(StepCol.STEADY))
    ts = host.ts[rows]
    in_steady = np.zeros(rows.size, dtype=bool)
    for a, z in steady.select(StepCol.TS, StepCol.WINDOW_END).iter_rows():
        in_steady |= (ts >= a) & (ts < z)
    if not in_steady.any():
        return []
    blocked = int((host.end[rows] - host.ts[rows])[in_steady].sum())
    per_step = in_steady.sum() / max(steady.height, 1)
    facts = run_facts(ctx)
    why = ("the caching allocator keeps missing, usually from changing tensor shapes" if facts.pytorch else
           "the program allocates and frees device memory inside its loop")
    return [Finding(
        code=Code.ALLOCATOR_IN_STEADY_STATE, severity=Severity.MEDIUM,
        statement=f"{per_step:.1f} cudaMalloc/cudaFree calls per steady step ({ms(blocked / max(steady.height, 1))} "
                  f"per step blocked): {why}.",
        next_step=device_allocation_advice(facts) + ".",
        recoverable_ns_per_step=round(blocked / max(steady.height, 1)),
        evidence={"calls_in_steady_steps": int(in_steady.sum()), "blocked_ns": blocked, "pytorch": facts.pytorch,
                  "pytorch_rule": facts.pytorch_rule},
    )]


def _scalar_reads(ctx: Context) -> list[Finding]:
    """Reads of a device value on the host, one per outermost call, split by where they come
    from: the optimizer's own step (its single-tensor path reads each step counter) or the
    training loop (named by its annotation and Python line when the trace has them)."""
    reads = ctx.syncs().scalar_reads
    steps = ctx.steps().table.height
    has_gpu = ctx.trace.of_kind(*GPU_ACTIVITY_KINDS).height > 0
    if has_gpu:  # on a GPU a read costs only when a synchronize or a synchronous copy ran inside it
        reads = reads.filter(pl.col("blocking_calls") > 0).with_columns(pl.col("blocking_calls").alias("calls"))
    calls = int(reads.get_column("calls").sum())
    if steps == 0 or calls < steps:
        return []
    from_optimizer = int(reads.filter(pl.col("optimizer")).get_column("calls").sum())
    user = reads.filter(~pl.col("optimizer")).sort("calls", descending=True)
    where = [w for w in (user.row(0, named=True)["python"], user.row(0, named=True)["annotation"])
             if w] if user.height else []
    line = sl.scalar_read_line(ctx) if calls - from_optimizer else None
    parts = []
    if calls - from_optimizer:
        parts.append(f"{(calls - from_optimizer) / steps:.1f} in the training loop" + _read_site(where, line))
    if from_optimizer:
        block = reads.filter(pl.col("optimizer")).row(0, named=True)["annotation"] or "the optimizer's step"
        parts.append(f"{from_optimizer / steps:.1f} inside {block}")
    names = ", ".join(sorted(set(reads.get_column(Col.NAME).to_list())))
    # On a GPU trace the cost of these reads is the drain they cause, which the sync finding
    # measures; counting their own (blocked) time here would count it twice. On a CPU-only
    # trace the hazard is latent and only the ops' own time is counted.
    recoverable = 0 if has_gpu else round(_own_time(ctx, reads.get_column(Col.NAME).unique().to_list()) / steps)
    advice = []
    if calls - from_optimizer:
        advice.append("Stop reading values back every step"
                      + sl.named(line, " (", ")")
                      + ": accumulate losses/metrics on the device and call .item() every N steps (or log "
                        "asynchronously).")
    if from_optimizer and _multi_tensor_optimizer(ctx):
        # torch/optim/adam.py's _multi_tensor_adam reads each step counter too (``_get_value``)
        # unless capturable: foreach=True, which this optimizer has, would change nothing.
        advice.append("The optimizer's reads are its step counters, read once per parameter even on its "
                      "multi-tensor path: construct it with capturable=True (or fused=True) to keep them on the "
                      "device; the training loop needs no change for them.")
    elif from_optimizer:
        advice.append("The optimizer's reads come from its single-tensor path (each parameter's step counter): "
                      "construct it with foreach=True or fused=True (the default for CUDA parameters), or "
                      "capturable=True to keep the counters on the device; the training loop needs no change for "
                      "them.")
    return [Finding(
        code=Code.SCALAR_READ_PER_STEP,
        severity=Severity.MEDIUM if has_gpu else Severity.LOW,
        statement=f"{calls / steps:.1f} scalar reads per step ({names}): {'; '.join(parts)}"
                  + (", each blocked on the GPU." if has_gpu else
                     ". On this CPU-only trace a read waits for nothing: what the reads cost here is the work that "
                     "computes the values read and the code around it; on a GPU each read of a device value would "
                     "also wait for all queued work and drain the pipeline"
                     + (" (the optimizer's step counters stay on the host there too unless capturable=True, so "
                        "its reads would not)." if from_optimizer else ".")),
        next_step=" ".join(advice),
        recoverable_ns_per_step=recoverable,
        evidence={"calls": calls, "per_step": calls / steps, "from_optimizer": from_optimizer,
                  "reads": reads.to_dicts(), **sl.evidence(line)},
    )]


def _multi_tensor_optimizer(ctx: Context) -> bool:
    """Every optimizer step in the trace runs multi-tensor ops (``analyses/anti_patterns``)."""
    blocks = [b for b in anti_patterns_result(ctx).optimizer if b.is_step]
    return bool(blocks) and all(b.multi_tensor for b in blocks)


def _read_site(where: list[str], line: SourceLine | None) -> str:
    """Where the loop's reads are: the innermost frame or annotation above the most of them, and
    the user line above them when the trace has one and it is not that same frame."""
    if line is None:
        return f" (most at {where[0]})" if where else ""
    if not where or where[0] == sl.frame_name(line):
        return sl.named(line, " (most at ", ")")
    return sl.named(line, f" (most at {where[0]}, ", ")")


def _own_time(ctx: Context, names: list[str]) -> float:
    """Time inside the outermost of these ops (aten::item wraps _local_scalar_dense: count it once),
    outside torch.compile's compile work (the reads ``syncs`` leaves out as the compiler's)."""
    s = ctx.trace.slices
    ids = np.flatnonzero(s.get_column(Col.NAME).is_in(names).to_numpy())  # categorical: no string copy
    host = ctx.host()
    compiling = host.ids[compiler_rows(s.get_column(Col.NAME).gather(host.ids), host)]
    ids = ids[~np.isin(ids, compiling)]
    enclosing = s.get_column(Col.OP).fill_null(-1).to_numpy()[ids]
    outer = ~np.isin(enclosing, ids)
    return float(s.get_column(Col.DUR).to_numpy()[ids][outer].sum())
