"""``autograd-in-inference``: a loop that never runs backward, whose forward ops autograd records
anyway. Each recorded op builds a graph node and keeps the tensors backward would read, for a
backward that never comes: time in every op and memory held until the outputs go. Decided from
structure: the ops carry autograd's sequence numbers (``OpAttrCol.SEQUENCE``, the step account's
``forward`` part), and nothing in the trace runs under the autograd engine
(``HostContext.in_backward``) or is a backward node. The trace holds no op run without recording
to price the time from, so the finding names the cost's place and share, and recovers none (it
predicts with no fix: ``anti_patterns.own_fixes`` gives it none). Only with two steps or more: a
capture of one window may hold a forward whose backward it missed.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.account import AccountCol
from tracewhy.analyses.account_names import PartName
from tracewhy.analyses.iterations import WindowSource
from tracewhy.findings import source_line as sl
from tracewhy.findings import thresholds as th
from tracewhy.findings.applicability import slice_names
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.model.schema import OpAttrCol
from tracewhy.units import fmt_ns as ms
from tracewhy.units import fmt_pct


def findings(ctx: Context) -> list[Finding]:
    account = ctx.account()
    if account is None or account.steps_analysed < 2 or account.source == WindowSource.WHOLE_TRACE:
        return []  # "no step runs backward" needs steps: one window may be a slice of a training step
    forward = account.parts.filter(pl.col(AccountCol.PART) == PartName.FORWARD)
    if forward.height == 0 or float(forward.get_column(AccountCol.SHARE)[0]) < th.INFERENCE_AUTOGRAD_MIN_SHARE:
        return []
    model = ctx.step_model()
    if model.rules.ctx.in_backward.any() or _backward_nodes(ctx):
        return []  # a training loop (or one that runs backward somewhere in the capture)
    recorded = ctx.trace.op_attrs.filter(pl.col(OpAttrCol.SEQUENCE).is_not_null()).get_column(OpAttrCol.ID).to_numpy()
    ts = model.rules.slice_ts[recorded]
    per_step = sum(int(np.count_nonzero((ts >= p.window_start) & (ts < p.window_end))) for p in model.paths)
    n = max(len(model.paths), 1)
    if per_step == 0:
        return []  # a forward block with no op autograd records
    ns, share = int(forward.get_column(AccountCol.NS_PER_STEP)[0]), float(forward.get_column(AccountCol.SHARE)[0])
    line = sl.line_above(ctx, "inference_autograd", lambda: recorded)
    return [Finding(
        code=Code.AUTOGRAD_IN_INFERENCE, severity=Severity.LOW,
        statement=f"No step runs backward, yet autograd records the forward: {per_step / n:,.0f} ops per step carry "
                  f"its sequence numbers{sl.named(line, ' (under ', ')')} ({ms(ns)} per step, {fmt_pct(share)} of "
                  "the step). Each builds a graph node and keeps the tensors a backward would read, for a backward "
                  "that never runs: time in every op, and memory held until the outputs go. The trace has no op run "
                  "without recording to price that time from.",
        next_step="Run the loop under torch.inference_mode() (or torch.no_grad() where its tensors are used in "
                  "autograd later)" + sl.named(line, " at ", "") + ": the ops then record nothing and free their "
                  "inputs as soon as they are done.",
        part=PartName.FORWARD,
        evidence={"recorded_ops_per_step": round(per_step / n, 2), "forward_ns_per_step": ns,
                  "forward_share": round(share, 4), **sl.evidence(line)},
    )]


def _backward_nodes(ctx: Context) -> bool:
    """Whether any slice is an autograd node of backward by the name torch gives it
    (``api_names.BACKWARD_NODE``: ``XxxBackward0``): the structural test's safety net for a
    capture whose engine marks are not where ``in_backward`` looks."""
    return any(api_names.is_backward_node(n) for n in slice_names(ctx))
