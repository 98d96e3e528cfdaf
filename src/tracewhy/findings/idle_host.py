"""How the idle findings (``findings/idle.py``) read the gaps beyond their classes. For
``gpu-idle-host``, how its gaps fall: many short ones between the step's own launches, none
holding most of their time, are the model's op-by-op dispatch (each op's Python and dispatch
outlast its kernel): cut the host's cost per op as fits what already runs the step; fewer, or one
dominant, are a stretch of CPU work: move it off the step (docs/decisions.md, "Why the GPU was
idle"). For the dependency class, the part that is the wait on GPU work the trace did not record
(docs/decisions.md, "A launch delay the trace cannot explain")."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import polars as pl

from tracewhy.analyses.compile_slices import ROLE, Role
from tracewhy.analyses.gaps import GapClass, GapCol
from tracewhy.analyses.source_lines import SourceLine
from tracewhy.analyses.stats import max_of, sum_of
from tracewhy.analyses.steps import StepCol
from tracewhy.findings import source_line as sl
from tracewhy.findings import thresholds as th
from tracewhy.findings.basis import Basis
from tracewhy.findings.context import Context
from tracewhy.model.schema import Col, Kind
from tracewhy.units import fmt_ns as ms
from tracewhy.units import fmt_pct as pct


class HostReading(msgspec.Struct, frozen=True):
    """What the host-class gaps say for ``gpu-idle-host``: the clause that says how they fall
    (empty unless they are op-by-op dispatch), the next step that fits, and the evidence."""

    clause: str
    next_step: str
    evidence: dict[str, Any]


def host_reading(ctx: Context, b: Basis, line: SourceLine | None) -> HostReading:
    """The gaps' spread read (``host_spread``) into the finding's words (``idle._host``), naming
    ``line``, the user line above the host work."""
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
    evidence: dict[str, Any] = {} if spread is None else {
        "host_gaps_per_step": round(spread.gaps_per_step, 2), "kernels_per_step": round(spread.kernels_per_step, 2),
        "median_host_gap_ns": spread.median_gap_ns, "largest_host_gap_share": round(spread.largest_share, 4),
        "op_by_op_dispatch": dispatch}
    return HostReading(how, next_step, evidence)


def before_trace_ns(ctx: Context, b: Basis) -> int:
    """The basis device's dependency idle (per step, on the basis' footing) inside the wait of the
    window's first launch on GPU work the trace did not record: from that launch to the device's
    first recorded work, where the account found one (0 elsewhere)."""
    account = ctx.account()
    u = account.unrecorded if account is not None else None
    if u is None or u.device != b.device:
        return 0
    gaps = ctx.gaps().gaps.filter((pl.col(GapCol.DEVICE) == b.device)
                                  & (pl.col(GapCol.GAP_CLASS) == GapClass.DEPENDENCY.value))
    starts = gaps.get_column(GapCol.START).to_numpy()
    ends = starts + gaps.get_column(GapCol.DUR).to_numpy()
    inside = int(np.clip(np.minimum(ends, u.first_gpu_ns) - np.maximum(starts, u.launch_ns), 0, None).sum())
    return min(round(inside / b.steps), b.class_ns[GapClass.DEPENDENCY.value])


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


class HostSpread(msgspec.Struct, frozen=True):
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
    gaps = ctx.gaps().gaps.filter((pl.col(GapCol.DEVICE) == b.device)
                                  & (pl.col(GapCol.GAP_CLASS) == GapClass.HOST.value))
    if b.per_steps:  # a gap's step is its step's row in the steps table
        steady = ctx.steps().table.with_row_index(GapCol.STEP).filter(pl.col(StepCol.STEADY))
        gaps = gaps.filter(pl.col(GapCol.STEP).is_in(steady.get_column(GapCol.STEP).cast(pl.Int64).implode()))
        kernels = float(sum_of(steady.get_column(StepCol.KERNEL_COUNT)))
    else:
        kernels = float(ctx.trace.of_kind(Kind.KERNEL).filter(pl.col(Col.DEVICE) == b.device).height)
    if not gaps.height:
        return None
    dur = gaps.get_column(GapCol.DUR)
    total = max(float(sum_of(dur)), 1.0)
    return HostSpread(gaps_per_step=gaps.height / b.steps, kernels_per_step=kernels / b.steps,
                      median_gap_ns=round(float(np.median(dur.to_numpy()))), largest_share=float(max_of(dur)) / total)
