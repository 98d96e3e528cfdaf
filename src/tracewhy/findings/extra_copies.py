"""Extra copies on the step's path (``analyses/extra_copies.py`` measures them): contiguous()
copies before an op that reads strided tensors, and dtype casts there and back. Stated with the
copies per step, the bytes they write, the user line when the trace has stacks, and priced by
the step replayed without the copy ops and all under them (``RemoveSlices``); a replay that
saves nothing means they are off the path, and nothing is said."""

from __future__ import annotations

import numpy as np

from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.extra_copies import CONTIGUOUS, ROUND_TRIP, ExtraCopiesResult, ExtraCopy, extra_copies
from tracewhy.analyses.steps import StepCol
from tracewhy.analyses.what_if_removals import RemoveSlices
from tracewhy.findings import source_line as sl
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.units import fmt_ns as ms
from tracewhy.units import fmt_pct


def extra_copies_result(ctx: Context) -> ExtraCopiesResult:
    table = ctx.steps().table
    steady = table.filter(table.get_column(StepCol.STEADY)) if table.height else table
    steps = steady if steady.height else table
    return ctx.cached("extra_copies", lambda: extra_copies(
        ctx.trace, steps.get_column(StepCol.TS).to_numpy(), steps.get_column(StepCol.WINDOW_END).to_numpy(),
        ctx.host_tree()))


def findings(ctx: Context) -> list[Finding]:
    r = extra_copies_result(ctx)
    table = ctx.steps().table
    steps = max(int(table.get_column(StepCol.STEADY).sum()) if table.height else 0, 1)
    every = [c for c in r.copies if c.calls >= steps]  # every step, not a one-off
    if not every or ctx.account() is None:
        return []
    p = ctx.predict((RemoveSlices(r.removed, kinds=(Edge.HOST, Edge.LAUNCH, Edge.GPU)),))
    if not p.changed or p.saved_ns <= 0:
        return []  # off the step's critical path: other work hides them
    ids = np.asarray([i for c in every for i in c.ids], dtype=np.int64)
    line = sl.line_above(ctx, "extra_copies", lambda: ids)
    written = sum(c.bytes for c in every) / steps
    claimed = p.saved_ns >= th.ANTI_PATTERN_MIN_SHARE * max(p.measured_ns, 1)
    said = "; ".join(_said(c, steps) for c in every[:4]) + (f"; {len(every) - 4} more" if len(every) > 4 else "")
    return [Finding(
        code=Code.EXTRA_COPIES, severity=_severity(p.saved_ns, p.measured_ns),
        statement=f"Extra copies on the step's path{sl.named(line, ' (', ')')}: {said}; "
                  f"{written / 2**20:,.1f} MiB written per step. Replayed without them, the step is predicted "
                  f"at {ms(p.predicted_ns)} against {ms(p.measured_ns)}: {ms(p.saved_ns)} "
                  f"({fmt_pct(p.saved_ns / max(p.measured_ns, 1))}) saved per step."
                  + ("" if claimed else f" Under {fmt_pct(th.ANTI_PATTERN_MIN_SHARE)} of the step, that is "
                                        "negligible here."),
        next_step=_advice({c.kind for c in every}) + sl.named(line, " at ", "") + ".",
        recoverable_ns_per_step=p.saved_ns if claimed else 0,
        predicted_step_ns=p.predicted_ns,
        evidence={"copies": [{"kind": c.kind, "shape": list(c.shape), "dtypes": list(c.dtypes),
                              "consumer": c.consumer, "calls": c.calls, "bytes": c.bytes, "host_ns": c.host_ns}
                             for c in every],
                  "calls_per_step": sum(c.calls for c in every) / steps, "bytes_per_step": written,
                  "predicted_step_ns": p.predicted_ns, "measured_step_ns": p.measured_ns, "saved_ns": p.saved_ns,
                  **sl.evidence(line)},
    )]


def _said(c: ExtraCopy, steps: int) -> str:
    shape = list(c.shape)
    if c.kind == CONTIGUOUS:
        return (f"contiguous() copying a {c.dtypes[0]} {shape} tensor before {c.consumer}, which reads strided "
                f"tensors itself, {c.calls / steps:g} per step")
    a, b = (d.removeprefix("c10::") for d in c.dtypes)
    return f"{a} -> {b} -> {a} casts of a {shape} tensor ({c.consumer}), {c.calls / steps:g} round trips per step"


def _severity(saved_ns: int, measured_ns: int) -> Severity:
    """Medium from the GPU idle classes' share of the step, info under ANTI_PATTERN_MIN_SHARE (as
    the other anti-patterns)."""
    if saved_ns >= th.ANTI_PATTERN_MEDIUM_SHARE * max(measured_ns, 1):
        return Severity.MEDIUM
    return Severity.LOW if saved_ns >= th.ANTI_PATTERN_MIN_SHARE * max(measured_ns, 1) else Severity.INFO


def _advice(kinds: set[str]) -> str:
    said = []
    if CONTIGUOUS in kinds:
        said.append("drop the .contiguous() before an op that takes the strided view (a matmul, elementwise work)")
    if ROUND_TRIP in kinds:
        said.append("keep the tensor in one dtype instead of casting it there and back (under autocast, let "
                    "autocast cast)")
    return "; ".join(said).capitalize()
