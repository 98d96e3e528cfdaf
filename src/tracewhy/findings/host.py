"""Host-side signatures that cost time even when they are not the biggest gap: copies from
pageable memory, synchronous copies, allocator calls in steady state, per-step scalar reads,
and step-time spikes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from tracewhy.analyses.compile import CompileStepCol, RecompileCol
from tracewhy.analyses.compile_fallback import FallbackCol
from tracewhy.analyses.copies import copies
from tracewhy.analyses.host_activity import Flag
from tracewhy.analyses.source_lines import SourceLine
from tracewhy.analyses.spikes import spikes
from tracewhy.analyses.steps import StepCol
from tracewhy.analyses.syncs import compiler_rows
from tracewhy.findings import source_line as sl
from tracewhy.findings import thresholds as th
from tracewhy.findings.anti_patterns import anti_patterns_result
from tracewhy.findings.applicability import device_allocation_advice, pinned_copy_advice, run_facts
from tracewhy.findings.codes import Code
from tracewhy.findings.compile import compile_result
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
    out += _spikes(ctx)
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


def _spikes(ctx: Context) -> list[Finding]:
    sp = spikes(ctx.trace, ctx.steps(), ctx.host())
    # A step that recompiles (or gives up compiling) is the compile findings' to state, once or
    # every step: it is not repeated here as a spike; nor is a step the step account left out as a
    # one-time compile (a branch compiled the first time it is taken): it does not recur per step.
    sp = replace(sp, spikes=sp.spikes.filter(~pl.col("step").is_in(_recompile_steps(ctx) + _one_time_steps(ctx))))
    if sp.spikes.height == 0:
        return []
    extra_cols = [c for c in sp.spikes.columns if c.startswith("extra_")]
    causes: dict[str, float] = {}
    for c in extra_cols:
        v = float(sp.spikes.get_column(c).mean())  # type: ignore[arg-type]
        if v > 0:
            causes[c.removeprefix("extra_")] = v
    steady = sp.per_step.filter(pl.col(StepCol.STEADY))
    excess = int(sp.spikes.get_column("excess_ns").sum())
    in_steps, recompiled_ns = _compile_in_spikes(ctx, sp.spikes.get_column("step").to_list())
    compiling = sum(in_steps.values())
    parts = [f"+{v:.1f} {k.replace('_', ' ')}" for k, v in causes.items()]
    if compiling:
        parts.insert(0, "torch.compile work (Dynamo, AOT autograd, inductor: "
                     + ", ".join(f"{ms(ns)} in {step}" for step, ns in in_steps.items()) + ")")
    explained = bool(parts)
    # Compile time the recompile finding already claims is not recoverable twice; with compile work
    # the only cause, the other spikes' excess is as unexplained as below.
    recoverable = max((excess if causes else compiling) - min(compiling, recompiled_ns), 0) if explained else 0
    spike_steps = sp.spikes.get_column("step").to_list()
    grown = sl.spike_line(ctx, spike_steps, excess)
    contents, next_step = _spike_contents(parts, grown)
    return [Finding(
        code=Code.STEP_TIME_SPIKES, severity=Severity.MEDIUM if explained else Severity.LOW,
        statement=f"{sp.spikes.height} of {steady.height} steady steps run over {100 * (1 + sp.margin):.0f}% of the "
                  f"median ({ms(excess / sp.spikes.height)} extra each); {contents}",
        next_step=next_step,
        # Unexplained spikes are not recoverable by any change we can name; a line that takes the
        # extra time names where to look, not a change that recovers it.
        recoverable_ns_per_step=round(recoverable / max(steady.height, 1)),
        evidence={"spike_steps": spike_steps, "excess_ns": excess, "causes": causes, "compile_ns": compiling,
                  **({} if grown is None else {**sl.evidence(grown[0]), "line_extra_ns": grown[1]})},
        see=(Code.RECOMPILE,) if compiling else (),
    )]


def _spike_contents(parts: list[str], grown: tuple[SourceLine, int] | None) -> tuple[str, str]:
    """What the spikes contain that a median step lacks (events, compile work, the user line
    their extra time went to), and what to do about it."""
    events = f"they contain {', '.join(parts)} over a median step" if parts else ""
    next_step = ("Remove the per-step source of those events (recompiles: mark dynamic shapes or pad; allocator: "
                 "stable shapes; syncs: tracewhy gaps TRACE --class sync)." if parts else
                 "Rerun to see whether the spikes repeat; if they do, capture with with_stack=True around them.")
    if grown is None:
        return (events or "they contain nothing a median step lacks (machine noise, GC or I/O outside the trace)"
                ) + ".", next_step
    line, extra_ns = grown
    took = sl.named(line, after=f" takes {ms(extra_ns)} more in each than in the other steady steps.")
    if parts:
        return f"{events}; {took}", next_step
    return took, (f"See what {sl.where(line)} does differently in those steps (tracewhy lines TRACE lists its "
                  "time); rerun to see whether the spikes repeat.")


def _one_time_steps(ctx: Context) -> list[int]:
    """Indexes (in the steps table) of the steps the step account left out as one-time compiles."""
    account = ctx.account()
    if account is None or not account.one_time:
        return []
    names = {s.name for s in account.one_time}
    return [i for i, name in enumerate(ctx.steps().table.get_column(StepCol.NAME).cast(pl.String).to_list())
            if name in names]


def _recompile_steps(ctx: Context) -> list[int]:
    """Indexes (in the steps table) of the steps holding a recompile or a compile that gave up."""
    r = compile_result(ctx)
    if r.per_step.height != ctx.steps().table.height:
        return []
    names = r.per_step.get_column(CompileStepCol.STEP).to_list()
    marked = set(r.recompiles.get_column(RecompileCol.STEP).drop_nulls().to_list())
    marked |= set(r.fallbacks.get_column(FallbackCol.STEP).drop_nulls().to_list())
    return [i for i, name in enumerate(names) if name in marked]


def _compile_in_spikes(ctx: Context, spike_steps: list[int]) -> tuple[dict[str, int], int]:
    """Per spike step that compiles more than the steady median step, that extra torch.compile
    work (nested phases once, wherever they sit under the step); and the cost of the steady
    recompiles. The compile analysis' steps are the step windows, in the steps table's order."""
    r = compile_result(ctx)
    if r.compile_ns == 0 or r.per_step.height != ctx.steps().table.height:
        return {}, 0
    compile_ns = r.per_step.get_column(CompileStepCol.COMPILE_NS).to_list()
    names = r.per_step.get_column(CompileStepCol.STEP).to_list()
    median = r.per_step.filter(pl.col(CompileStepCol.STEADY)).get_column(CompileStepCol.COMPILE_NS).median()
    base = float(median) if isinstance(median, (int, float)) else 0.0
    extra = {str(names[i]): round(compile_ns[i] - base) for i in spike_steps if compile_ns[i] > base}
    recompiled = int(r.recompiles.filter(pl.col(RecompileCol.STEADY)).get_column(RecompileCol.COST_NS).sum())
    return extra, recompiled
