"""The user source line behind a host, sync or input finding: which host slices
each finding is about, the line ``line_of`` names for them (once per diagnosis), and how a
finding words it: a line of a call, or the function when the trace has no line of the call.
Traces without Python frames (``with_stack``) or legacy ``Call stack`` args get no line, so
their findings read exactly as before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.gaps import GapClass, GapCol
from tracewhy.analyses.host_activity import Flag
from tracewhy.analyses.source_lines import (
    LineKind,
    SourceLine,
    WindowSelfCol,
    call_stacks,
    line_of,
    user_self_by_window,
)
from tracewhy.analyses.steps import StepCol
from tracewhy.findings import thresholds as th
from tracewhy.findings.context import Context
from tracewhy.model.schema import Col, Kind

I64 = npt.NDArray[np.int64]
#: How a finding introduces the line it names: a line of a call, else (a with_stack frame
#: names no calling line) the function.
USER_LINE: Final = "user line"
USER_FUNCTION: Final = "user function"


def has_stacks(ctx: Context) -> bool:
    """Whether the trace names Python lines at all: ``python_function`` frames or ``Call stack`` args."""
    def compute() -> bool:
        kinds = ctx.trace.slices.get_column(Col.KIND)
        return bool((kinds == Kind.PYTHON.value).any()) or call_stacks(ctx.trace).height > 0
    return ctx.cached("source_line:has_stacks", compute)


def _line(ctx: Context, key: str, ids: Callable[[], I64], within: bool) -> SourceLine | None:
    """``line_of`` these slices, once per diagnosis; None (nothing computed) without stacks."""
    if not has_stacks(ctx):
        return None
    return ctx.cached(f"source_line:{key}", lambda: line_of(ctx.trace, ids(), within=within, tree=ctx.host_tree()))


def scalar_read_line(ctx: Context) -> SourceLine | None:
    """The line above the training loop's scalar reads (``.item()``, ``nonzero``...): the reads
    made inside an optimizer's step are its own (its step counters), and the user line above
    them would only be the ``optimizer.step()`` call. Weighted by time, so on a GPU the reads
    that blocked lead."""
    def ids() -> I64:
        host = ctx.host()
        names = ctx.trace.slices.get_column(Col.NAME).gather(host.ids)
        reads = [n for n in names.unique().drop_nulls().cast(pl.String).to_list() if api_names.is_scalar_read(n)]
        if not reads:
            return np.zeros(0, dtype=np.int64)
        is_read = names.is_in(reads).to_numpy() & ~host.on_stack[Flag.OPTIMIZER]
        return host.ids[is_read]
    return _line(ctx, "scalar_reads", ids, within=False)


def line_above(ctx: Context, key: str, ids: Callable[[], I64]) -> SourceLine | None:
    """The user line above these host slices (an optimizer call, a convolution), once per
    diagnosis for ``key``: the innermost user frame above the most of their time."""
    return _line(ctx, key, ids, within=False)


def sync_line(ctx: Context) -> SourceLine | None:
    """The line above the blocking calls (synchronize, blocking copies, event waits)."""
    return _line(ctx, "syncs", lambda: ctx.syncs().calls.get_column(Col.ID).to_numpy(), within=False)


def input_line(ctx: Context) -> SourceLine | None:
    """The user line inside the DataLoader's fetches with the most time (a Dataset's
    ``__getitem__``, a collate function), else the line that iterates the loader."""
    def ids() -> I64:
        host = ctx.host()
        return host.ids[host.self_flag[Flag.DATALOADER]]
    return _line(ctx, "input", ids, within=True)


def host_line(ctx: Context) -> SourceLine | None:
    """The line above what the host ran in the middle of each host-bound gap (the sample the
    gaps table names its host op and frame from)."""
    def ids() -> I64:
        host = ctx.host()
        g = ctx.gaps().gaps.filter(pl.col(GapCol.GAP_CLASS) == GapClass.HOST.value)
        mid = (g.get_column(GapCol.START) + g.get_column(GapCol.DUR) // 2).to_numpy()
        pid, tid = g.get_column(GapCol.HOST_PID).to_numpy(), g.get_column(GapCol.HOST_TID).to_numpy()
        rows = np.full(mid.size, -1, dtype=np.int64)
        for p, t in set(zip(pid.tolist(), tid.tolist(), strict=True)):
            on = np.flatnonzero((pid == p) & (tid == t))
            rows[on] = host.innermost(p, t, mid[on])
        return np.unique(host.ids[rows[rows >= 0]])
    return _line(ctx, "host", ids, within=False)


def spike_line(ctx: Context, spike_steps: list[int], excess_ns: float) -> tuple[SourceLine, int] | None:
    """The user line whose self time grew the most in these spike steps over the other steady
    steps (means per step), with that growth, when it is at least ``SPIKE_LINE_MIN_SHARE`` of
    the spikes' mean ``excess_ns``: the line the extra time of a spike went to."""
    if not has_stacks(ctx) or not spike_steps:
        return None
    w = WindowSelfCol
    frame = [w.FILE, w.LINE, w.FUNCTION, w.KIND]

    def mean_self(table: pl.DataFrame, steps: list[int], alias: str) -> pl.DataFrame:
        return (table.filter(pl.col(w.WINDOW).is_in(steps)).group_by(frame)
                .agg((pl.col(w.SELF).sum() / len(steps)).alias(alias)))

    def compute() -> tuple[SourceLine, int] | None:
        steps_table = ctx.steps().table
        frames = user_self_by_window(ctx.trace, steps_table.get_column(StepCol.TS).to_numpy(),
                                     steps_table.get_column(StepCol.WINDOW_END).to_numpy())
        steady = steps_table.with_row_index("step").filter(pl.col(StepCol.STEADY)).get_column("step").to_list()
        base = sorted(set(steady) - set(spike_steps))
        if frames.height == 0 or not base:
            return None
        grown = (mean_self(frames, spike_steps, "spike").join(mean_self(frames, base, "base"), on=frame, how="left")
                 .with_columns((pl.col("spike") - pl.col("base").fill_null(0)).alias("extra"))
                 .sort(["extra", *frame], descending=[True, False, False, False, False]))
        top = grown.row(0, named=True) if grown.height else None
        if top is None or top["extra"] < th.SPIKE_LINE_MIN_SHARE * excess_ns / len(spike_steps):
            return None
        return (SourceLine(file=top[w.FILE], line=top[w.LINE], function=top[w.FUNCTION], kind=top[w.KIND]),
                round(top["extra"]))
    return ctx.cached(f"source_line:spikes:{spike_steps}", compute)


def named(line: SourceLine | None, before: str = "", after: str = "") -> str:
    """``user line train.py:52 in train_step`` (or ``user function ...`` when the trace has no
    line of the call) between ``before`` and ``after``; "" without a line, so a finding's text
    is unchanged on a trace without stacks."""
    if line is None:
        return ""
    return f"{before}{USER_LINE if line.kind == LineKind.CALL else USER_FUNCTION} {where(line)}{after}"


def where(line: SourceLine) -> str:
    """``train.py:52 in train_step`` for the line of a call. A with_stack frame entered while
    profiling names where its function starts: ``train_step defined at train.py:40``, never
    passed off as the calling line; a frame already running when profiling began names the line
    it ran then (the profiler's start), so only its function and file are named."""
    if line.kind == LineKind.DEF:
        return f"{line.function} defined at {line.file}:{line.line}"
    if line.kind == LineKind.AT_START:
        return f"{line.function} in {line.file}, running since before profiling began"
    return f"{line.file}:{line.line} in {line.function}"


def frame_name(line: SourceLine) -> str:
    """The line as a ``with_stack`` frame names it (``train.py(52): train_step``)."""
    return f"{line.file}({line.line}): {line.function}"


def evidence(line: SourceLine | None) -> dict[str, Any]:
    """The ``line`` entry of a finding's evidence (``kind``: a LineKind); nothing without a line."""
    return {} if line is None else {"line": {"file": line.file, "line": line.line, "function": line.function,
                                             "kind": line.kind}}
