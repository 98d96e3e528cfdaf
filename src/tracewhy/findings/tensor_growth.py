"""``tensor-grown-by-concat``: a tensor grown one piece at a time by ``torch.cat``, found in the
steady steps from the calls' shapes (one call's output is the next one's input) or, without
shapes, from their durations rising along the step (``analyses/tensor_growth``), priced by the
step replayed with a buffer allocated once and written in place (``Preallocate`` on the growing
calls, the edit ``bench/calibrate.py`` measures against real pairs). It explains the part that
holds the op's time (``host: aten::cat`` where the account names host work by op).
"""

from __future__ import annotations

import numpy as np

from tracewhy.analyses.tensor_growth import GrownTensors, tensor_growth
from tracewhy.analyses.what_if_host_edits import Preallocate
from tracewhy.findings import source_line as sl
from tracewhy.findings.anti_patterns import prediction_evidence, priced, priced_severity
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding
from tracewhy.units import fmt_ns as ms


def grown(ctx: Context) -> list[GrownTensors]:
    """The growing concatenations of the steady steps, once per diagnosis."""
    return ctx.cached("tensor_growth", lambda: tensor_growth(ctx.trace, ctx.steady_windows()))


def fix(ctx: Context) -> tuple[Preallocate, ...]:
    """The fix the finding predicts with: the largest growing op's calls preallocated."""
    found = grown(ctx)
    return (Preallocate(found[0].op, found[0].ids),) if found else ()


def findings(ctx: Context) -> list[Finding]:
    found = grown(ctx)
    if not found:
        return []
    g = found[0]
    line = sl.line_above(ctx, "tensor_growth", lambda: np.asarray(g.ids, dtype=np.int64))
    p, saving = priced(ctx, Code.TENSOR_GROWN_BY_CONCAT, "with a buffer allocated once and written in place")
    step_ns = p.measured_ns if p is not None else 0
    share = f" ({g.ns_per_step / step_ns:.0%} of the step)" if step_ns else ""
    rising = f"its calls' time rising from {ms(round(g.early_ns))} early in the step to {ms(round(g.late_ns))} late"
    if g.evidence == "shapes":
        tensors = "a tensor" if g.tensors <= 1 else f"{g.tensors} tensors side by side"
        what = (f"{g.op} grows {tensors} one piece at a time{sl.named(line, ' (', ')')}: "
                f"{g.calls_per_step:,.0f} calls per step along dim {g.axis}, from {_shapes(g.first_shapes)} to "
                f"{_shapes(g.last_shapes)}, each output the next call's input. Each call copies everything grown "
                f"so far into a new tensor: {_count(g.copied_per_step)} elements written per step for "
                f"{_count(g.new_per_step)} new ({g.copied_per_step / max(g.new_per_step, 1):,.0f}x); "
                f"{ms(round(g.ns_per_step))} per step{share}, {rising}.")
    else:
        what = (f"{g.op} runs {g.calls_per_step:,.0f} times per step{sl.named(line, ' (', ')')} and its calls take "
                f"longer the later they run ({rising}; rank correlation {g.rank_correlation:.2f} with call order): "
                f"one tensor grown by every call, each copying everything grown so far, fits that; "
                f"{ms(round(g.ns_per_step))} per step{share}. The trace records no shapes to confirm it.")
    shapes_hint = "" if g.evidence == "shapes" else " Capture with record_shapes=True to see the shapes."
    return [Finding(
        code=Code.TENSOR_GROWN_BY_CONCAT, severity=priced_severity(p), statement=what + saving,
        next_step="Allocate the tensor once at its final size and write each piece in place (buf[:, t] = new, "
                  "or buf.narrow(dim, start, n).copy_(new)); where the final size is not known in advance, "
                  f"append the pieces to a Python list and call {_python_call(g.op)} once at the end"
                  + sl.named(line, " (", ")") + ". A key/value cache grown token by token is the usual case: "
                  "a static, preallocated cache does this." + shapes_hint,
        evidence={"op": g.op, "evidence": g.evidence, "calls_per_step": g.calls_per_step,
                  "ns_per_step": g.ns_per_step, "early_call_ns": g.early_ns, "late_call_ns": g.late_ns,
                  "rank_correlation": g.rank_correlation, "tensors": g.tensors or None,
                  "axis": g.axis if g.evidence == "shapes" else None,
                  "first_shapes": [list(s) for s in g.first_shapes] or None,
                  "last_shapes": [list(s) for s in g.last_shapes] or None,
                  "elements_written_per_step": g.copied_per_step or None,
                  "elements_new_per_step": g.new_per_step or None,
                  **prediction_evidence(p), **sl.evidence(line)},
    )]


def _shapes(shapes: tuple[tuple[int, ...], ...]) -> str:
    return " + ".join(str(list(s)) for s in shapes)


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:,.0f}"


def _python_call(op: str) -> str:
    """``torch.cat`` for ``aten::cat``: the call a user writes."""
    return "torch." + op.removeprefix("aten::").lstrip("_")
