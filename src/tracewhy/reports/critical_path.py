"""``critical-path``: the critical path of each step (or of one window): what it is made of, what
lies on it, and what removing each of its top items would save (the path replayed without it);
per step, the step account's largest avoidable parts too, with the step time the fix ``diagnose``
predicts for each saves in that step (the same replay, so the two views give one number)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from tracewhy.analyses.account import AccountCol, AccountOptions, step_account, step_model
from tracewhy.analyses.critical_path import (
    MAX_PATH_STEPS,
    PART_GAIN_CATEGORY,
    CriticalPathOptions,
    CriticalPathResult,
    PathCol,
    critical_path,
)
from tracewhy.analyses.critical_path_graph import Graph, build_graph
from tracewhy.analyses.steps import StepsOptions, StepsResult, steps
from tracewhy.analyses.what_if import fix_for_part, part_gains
from tracewhy.model.schema import Col
from tracewhy.model.trace import Trace
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource


@dataclass(frozen=True)
class CriticalPathReportOptions:
    step_marker: str | None = None
    #: Per step, the items with most time on the path whose removal is replayed (and as many of
    #: the step account's avoidable parts, whose fix is replayed).
    gain_items: int = CriticalPathOptions().gain_items
    #: Analyse this one window (trace timestamps in ns) instead of the steps.
    window_ns: tuple[int, int] | None = None
    max_steps: int = MAX_PATH_STEPS


def critical_path_report(trace: TraceSource, options: CriticalPathReportOptions | None = None,
                         loader: Loader = PLAIN) -> CriticalPathResult:
    options = options or CriticalPathReportOptions()
    t = loader.trace(trace)
    t.require_whole()
    graph = build_graph(t)  # once, for the path and the account
    steps_result = steps(t, StepsOptions(marker=options.step_marker)) if options.window_ns is None else None
    r = critical_path(t, CriticalPathOptions(marker=options.step_marker, gain_items=options.gain_items,
                                             window_ns=options.window_ns, max_steps=options.max_steps),
                      steps_result, graph=graph)
    if r.steps.height < r.steps_total:
        cut = f"the path of {r.steps.height} of the {r.steps_total} steps (steady ones first)"
        r = replace(r, note=cut if r.note is None else f"{r.note}; {cut}")
    if steps_result is None or steps_result.table.height == 0:
        return r
    return replace(r, gains=pl.concat([r.gains, _part_gains(t, r, options, steps_result, graph)]))


def _part_gains(trace: Trace, r: CriticalPathResult, options: CriticalPathReportOptions,
                steps_result: StepsResult, graph: Graph) -> pl.DataFrame:
    """Rows of ``gains`` for the account's ``gain_items`` largest avoidable parts that a fix
    addresses (category PART_GAIN_CATEGORY, name the part), in the account's analysed steps."""
    model = step_model(trace, AccountOptions(marker=options.step_marker), steps_result=steps_result, graph=graph)
    account = step_account(trace, model=model)
    avoidable = account.parts.filter(~pl.col(AccountCol.ESSENTIAL)).select(AccountCol.PART, AccountCol.KIND).rows()
    chosen = [(part, kind) for part, kind in avoidable if fix_for_part(part, kind, essential=False) is not None]
    gains = part_gains(model, chosen[:options.gain_items]).filter(pl.col(PathCol.ON_PATH) > 0)
    return gains.select(
        PathCol.STEP, pl.lit(PART_GAIN_CATEGORY).alias(PathCol.CATEGORY), pl.col(AccountCol.PART).alias(Col.NAME),
        PathCol.COUNT, PathCol.ON_PATH, PathCol.GAIN).select(*r.gains.columns)
