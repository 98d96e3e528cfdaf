"""``per-sample-loop``: a block (``record_function``) whose calls run the same ops once per item of
a tensor, a Python loop over the batch (``analyses/sample_loops``), priced by the step replayed
with the loop vectorised (``BatchLoop``, the edit ``bench/calibrate.py`` measures against real
pairs). It explains the block's host part (``host: <block>``)."""

from __future__ import annotations

import numpy as np

from tracewhy.analyses.sample_loops import SampleLoop, sample_loops
from tracewhy.analyses.what_if_host_edits import BatchLoop
from tracewhy.findings import source_line as sl
from tracewhy.findings.anti_patterns import prediction_evidence, priced, priced_severity
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding
from tracewhy.units import fmt_ns as ms

#: How the loop walks the tensor, as the user wrote it.
_WALKS = {"aten::unbind": "for x in batch", "aten::select": "batch[i]"}


def loops(ctx: Context) -> list[SampleLoop]:
    """The looping blocks of the steady steps, once per diagnosis (none without a step account)."""
    def compute() -> list[SampleLoop]:
        if ctx.account() is None:
            return []
        model = ctx.step_model()
        return sample_loops(ctx.trace, model.rules.ctx, model.rules.slice_ts, model.rules.slice_end,
                            ctx.steady_windows())
    return ctx.cached("sample_loops", compute)


def fix(ctx: Context) -> tuple[BatchLoop, ...]:
    """The fix the finding predicts with: the costliest looping block vectorised."""
    found = loops(ctx)
    return (BatchLoop(found[0].block),) if found else ()


def findings(ctx: Context) -> list[Finding]:
    found = loops(ctx)
    if not found:
        return []
    loop = found[0]
    line = sl.line_above(ctx, "sample_loops", lambda: np.asarray(loop.ids, dtype=np.int64))
    p, saving = priced(ctx, Code.PER_SAMPLE_LOOP, "with the loop vectorised (one call of each op)")
    share = f" ({loop.ns_per_step / p.measured_ns:.0%} of the step)" if p is not None and p.measured_ns else ""
    ops = ", ".join(loop.ops[:6]) + (f" and {len(loop.ops) - 6} more" if len(loop.ops) > 6 else "")
    walk = _WALKS.get(loop.walk, loop.walk)
    return [Finding(
        code=Code.PER_SAMPLE_LOOP, severity=priced_severity(p),
        statement=f"`{loop.block}` loops over a batch in Python{sl.named(line, ' (', ')')}: {loop.iterations:,.0f} "
                  f"iterations per call ({walk}: {loop.walk}), each running {ops}; {_calls(loop.calls_per_step)}, "
                  f"{ms(round(loop.ns_per_step))} per step{share}.{saving}",
        next_step=f"Vectorise `{loop.block}` over the batch: call each of its ops once on the whole batch (reductions "
                  "with dim=..., keepdim=True, elementwise ops broadcast) instead of once per item"
                  + sl.named(line, " at ", "") + "; where it prepares data, do it in the DataLoader's workers "
                  "(Dataset.__getitem__ or collate_fn) so it runs beside the step.",
        evidence={"block": loop.block, "iterations": loop.iterations, "ops": list(loop.ops), "walk": loop.walk,
                  "calls_per_step": loop.calls_per_step, "ns_per_step": loop.ns_per_step,
                  **prediction_evidence(p), **sl.evidence(line)},
    )]


def _calls(per_step: float) -> str:
    return "called once per step" if per_step == 1 else f"{per_step:g} calls per step"
