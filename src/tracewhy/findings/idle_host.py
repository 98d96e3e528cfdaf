"""``gpu-idle-host``: GPU idle while the host computes, told apart by how its gaps fall. Many
short gaps between the step's own launches, none holding most of their time, are the model's
op-by-op dispatch (each op's Python and dispatch outlast its kernel): cut the host's cost per op
as fits what already runs the step. Fewer, or one dominant, are a stretch of CPU work: move it off
the step (docs/decisions.md, "Why the GPU was idle")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracewhy.analyses.compile_slices import ROLE, Role
from tracewhy.analyses.gaps import GapClass, GapCol
from tracewhy.analyses.stats import max_of, sum_of
from tracewhy.analyses.steps import StepCol
from tracewhy.findings import source_line as sl
from tracewhy.findings import thresholds as th
from tracewhy.findings.basis import Basis
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.model.schema import Col, Kind
from tracewhy.units import fmt_ns as ms
from tracewhy.units import fmt_pct as pct


def host_finding(ctx: Context, b: Basis, ns: float, severity: Severity, ops: list[str], py: list[str],
                 ann: list[str]) -> Finding:
    """``gpu-idle-host``: ``ns`` of host-class idle (per step on the basis' footing), named by the
    gaps' top ops, Python frames and annotations."""
    where = py or ops or ann
    line = sl.host_line(ctx)
    spread = host_spread(ctx, b)
    dispatch = spread is not None and spread.dispatch
    how = ("" if spread is None or not dispatch else
           f", spread over {spread.gaps_per_step:,.0f} gaps {'per step' if b.per_steps else 'over the trace'} "
           f"between {spread.kernels_per_step:,.0f} kernel launches (median {ms(spread.median_gap_ns)}; the longest "
           f"holds {pct(spread.largest_share)} of their time): "
           "the host feeds the GPU op by op and each op's Python and dispatch outlast its kernels")
    next_step = (f"Cut the host's cost per op{sl.named(line, ' (', ')')}. {per_op_fix(ctx)}; a larger batch gives "
                 "each launch more work. tracewhy gaps TRACE --class host lists the gaps."
                 if dispatch else
                 f"Move that work{sl.named(line, ' (', ')')} off the critical path (precompute, do it on the GPU, "
                 "or overlap it with the next step); profile the Python with py-spy record -o host.svg -- python "
                 "train.py, and list the gaps with tracewhy gaps TRACE --class host.")
    return Finding(
        code=Code.GPU_IDLE_HOST, severity=severity,
        statement=f"The GPU waits while the host computes: {ms(ns)} {b.unit} ({b.of_window(ns)}) of idle time with "
                  "the host in Python or CPU ops and no launch in flight "
                  f"(mostly {', '.join(where) or 'unnamed code'}{sl.named(line, '; ')}){how}.",
        next_step=next_step,
        recoverable_ns_per_step=round(ns),
        evidence={"idle_host_ns": round(ns), "ops": ops, "python": py, "annotations": ann, **sl.evidence(line),
                  **({} if spread is None else {"host_gaps_per_step": round(spread.gaps_per_step, 2),
                                                "kernels_per_step": round(spread.kernels_per_step, 2),
                                                "median_host_gap_ns": spread.median_gap_ns,
                                                "largest_host_gap_share": round(spread.largest_share, 4),
                                                "op_by_op_dispatch": dispatch})},
    )


def per_op_fix(ctx: Context) -> str:
    """What cuts the host's cost per op, by what already runs the step (compile_slices' roles):
    graph launches already (capture more of the step), compiled regions already (their CUDA-graph
    mode, fewer regions), or eager code (a CUDA graph, or compile to fuse)."""
    roles = set(ctx.compile_marked().get_column(ROLE).unique().to_list())
    if Role.LAUNCH in roles:
        return ("The step already replays CUDA/HIP graphs: capture more of it in them, so that fewer ops run "
                "eagerly between the replays")
    if roles & {Role.REGION, Role.WRAPPER, Role.GRAPH_CALL}:
        return ("The step already runs torch.compile'd code: compile with mode='reduce-overhead' (CUDA graphs) "
                "and make fewer, larger compiled regions (remove graph breaks)")
    return ("Capture the step in a CUDA graph (torch.compile(mode='reduce-overhead'), or torch.cuda.CUDAGraph for a "
            "step of fixed shapes), or torch.compile it to fuse ops")


@dataclass(frozen=True)
class HostSpread:
    """How the basis device's host-class idle falls: gaps and kernel launches per step (steady
    steps, or the whole trace), the median gap, and the largest gap's share of their time."""

    gaps_per_step: float
    kernels_per_step: float
    median_gap_ns: int
    largest_share: float

    @property
    def dispatch(self) -> bool:
        """Many gaps, none holding most of the time: op-by-op dispatch (thresholds.DISPATCH_*)."""
        return self.gaps_per_step >= th.DISPATCH_MIN_GAPS and self.largest_share < th.DISPATCH_MAX_GAP_SHARE


def host_spread(ctx: Context, b: Basis) -> HostSpread | None:
    """The host-class gaps of the basis' device over the basis' steps (None: none)."""
    steps = ctx.steps().table.with_row_index("step")
    gaps = ctx.gaps().gaps.filter((pl.col(GapCol.DEVICE) == b.device)
                                  & (pl.col(GapCol.GAP_CLASS) == GapClass.HOST.value))
    kernels = float(ctx.trace.of_kind(Kind.KERNEL).filter(pl.col(Col.DEVICE) == b.device).height)
    if b.per_steps:
        steady = steps.filter(pl.col(StepCol.STEADY))
        gaps = gaps.filter(pl.col("step").is_in(steady.get_column("step").cast(pl.Int64).implode()))
        kernels = float(sum_of(steady.get_column(StepCol.KERNEL_COUNT)))
    if not gaps.height:
        return None
    dur = gaps.get_column(GapCol.DUR)
    total = max(float(sum_of(dur)), 1.0)
    return HostSpread(gaps_per_step=gaps.height / b.steps, kernels_per_step=kernels / b.steps,
                      median_gap_ns=round(float(np.median(dur.to_numpy()))), largest_share=float(max_of(dur)) / total)
