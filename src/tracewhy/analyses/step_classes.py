"""Inference steps classed prefill, decode or mixed (``step_verdicts`` says how each is decided):
per step, the evidence that decided and the tokens it handled where the trace says; per class,
the count, median time, share of the trace and tokens per second."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses.step_verdicts import ORDER, StepClass, StepOps, shape_verdict
from tracewhy.analyses.steps import StepCol, StepsResult, WindowCol, step_windows
from tracewhy.analyses.throughput import TOKENS, ThroughputOptions
from tracewhy.model.trace import Trace


class ClassCol:
    """Columns of ``StepClasses.steps``, one row per classed step."""

    STEP: Final = WindowCol.STEP
    NUMBER: Final = WindowCol.NUMBER
    START: Final = WindowCol.WINDOW_START
    WINDOW: Final = WindowCol.WINDOW
    #: Union of the GPU work the step launched (``StepCol.GPU_BUSY``): beside a window that also
    #: holds a wait on GPU work queued before the capture.
    GPU_BUSY: Final = StepCol.GPU_BUSY
    CLASS: Final = "step_class"
    EVIDENCE: Final = "evidence"
    TOKENS: Final = "tokens"
    DETAIL: Final = "detail"


STEP_CLASSES_SCHEMA: Final = pl.Schema({
    ClassCol.STEP: pl.String(), ClassCol.NUMBER: pl.Int64(), ClassCol.START: pl.Int64(), ClassCol.WINDOW: pl.Int64(),
    ClassCol.GPU_BUSY: pl.Int64(), ClassCol.CLASS: pl.String(), ClassCol.EVIDENCE: pl.String(),
    ClassCol.TOKENS: pl.Int64(), ClassCol.DETAIL: pl.String(),
})


@dataclass(frozen=True)
class ClassSummary:
    """One class over the trace: every step of it, warm-up included (a generate loop's prefill
    is its first step, not a warm-up)."""

    step_class: str
    count: int
    median_ns: int
    total_ns: int
    #: Its steps' windows over the trace's span.
    share: float
    #: The GPU work its steps launched (union per step), summed.
    gpu_busy_ns: int
    #: Summed over the class's steps, when every one of them says; with the rate over their time.
    tokens: int | None
    tokens_per_s: float | None


@dataclass(frozen=True)
class StepClasses:
    steps: pl.DataFrame  # STEP_CLASSES_SCHEMA, in time order
    classes: tuple[ClassSummary, ...]  # in ORDER, classes present only
    trace_span_ns: int


def step_classes(trace: Trace, steps_result: StepsResult, rate: ThroughputOptions | None = None) -> StepClasses | None:
    """Each step's class; None when no step could be classed (not an inference trace). A step
    whose tokens the trace does not record takes ``rate``'s items per step when its unit is tokens
    (``--tokens-per-step N``)."""
    trace.require_whole()
    windows = step_windows(trace, steps_result)
    if windows.height == 0:
        return None
    found = StepOps(trace)
    given = round(rate.items_per_step) if rate is not None and rate.unit == TOKENS else None
    busy = dict(steps_result.table.select(StepCol.TS, StepCol.GPU_BUSY).iter_rows())
    rows = []
    for w in windows.iter_rows(named=True):
        lo, hi, pid = w[WindowCol.WINDOW_START], w[WindowCol.WINDOW_END], w[WindowCol.PID]
        verdict = shape_verdict(found.queries(pid, lo, hi)) or found.annotation(pid, lo, hi)
        if verdict is not None:
            tokens = verdict.tokens if verdict.tokens is not None else given
            rows.append((w[WindowCol.STEP], w[WindowCol.NUMBER], lo, w[WindowCol.WINDOW], busy.get(lo, 0),
                         verdict.step_class, verdict.evidence, tokens, verdict.detail))
    if not rows:
        return None
    table = pl.DataFrame(rows, schema=STEP_CLASSES_SCHEMA, orient="row")
    span = trace.span_ns
    return StepClasses(table, tuple(_summary(table, c, span) for c in ORDER
                                    if (table.get_column(ClassCol.CLASS) == c).any()), span)


def _summary(table: pl.DataFrame, cls: str, span: int) -> ClassSummary:
    mine = table.filter(pl.col(ClassCol.CLASS) == cls)
    windows = mine.get_column(ClassCol.WINDOW).to_numpy()
    total = int(windows.sum())
    tokens_col = mine.get_column(ClassCol.TOKENS)
    tokens = None if tokens_col.null_count() else int(tokens_col.sum())
    return ClassSummary(cls, mine.height, round(float(np.median(windows))), total,
                        total / span if span else 0.0, int(mine.get_column(ClassCol.GPU_BUSY).sum()), tokens,
                        tokens * 1e9 / total if tokens is not None and total > 0 else None)


def prefill_warmup_reason(steps_result: StepsResult, classes: StepClasses) -> str | None:
    """What the leading steps left out as warm-up are when they are exactly the prefill steps and
    every steady step decodes (a generate loop's first step is its prompt, not a cold start); None
    otherwise."""
    n = steps_result.warmup
    t = classes.steps
    if n == 0 or t.height != steps_result.table.height:
        return None
    kinds = t.get_column(ClassCol.CLASS).to_list()
    if set(kinds[:n]) != {StepClass.PREFILL} or set(kinds[n:]) != {StepClass.DECODE}:
        return None
    return (f"the first {n} step(s) are the prefill (attention over the prompt) and the rest decode: the "
            "steady figures are the decode steps'")
