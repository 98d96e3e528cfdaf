"""Frames torch.compile gave up on: Dynamo compiled a frame (compile work with its id ``F/C``)
and no compiled region of that compile ever ran, nor any region of frame F after it. Either the
frame never ran compiled at all (Dynamo skipped it, e.g. a graph break inside a loop) or it ran
compiled until one compile produced nothing (the recompile limit), and ran eagerly from then on.

Structure decides: the compile ids of the ``*_data: compile_id=`` annotations, the
``Torch-Compiled Region: F/C`` runs, their step windows, whether a frame was first compiled
inside another frame's region (then the outer frame is compiled: not "no effect"), and the call
site, the nearest enclosing slice of the compile work that is not itself compile work. The call
site's later runs (the same name at the same depth on the same thread) are the eager time; the
reason (which limit, which break) is only in the logs, read by ``readers/torch_logs``.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses import compile_markers as M
from tracewhy.analyses.compile_slices import ROLE, STEP_INDEX, Role, step_of
from tracewhy.analyses.steps import WindowCol
from tracewhy.analyses.thread_intervals import inside, union_per_thread
from tracewhy.model.schema import Col
from tracewhy.model.trace import Trace


class FallbackCol:
    """Columns of ``CompileResult.fallbacks``, one row per frame that stopped running compiled."""

    FRAME: Final = "frame"
    COMPILE: Final = "compile"  # the compile id C whose compile produced no region
    REGION: Final = "region"  # "F/C" of that compile
    STEP: Final = "step"  # the step it was made in
    STEADY: Final = "steady"
    COMPILED_BEFORE: Final = "compiled_before"  # compile ids of the frame whose regions did run
    COMPILE_NS: Final = "compile_ns"  # all compile work of the frame (every id, forward and backward)
    CALL_SITE: Final = "call_site"  # the slice the compile work ran in (null at top level)
    EAGER_STEPS: Final = "eager_steps"  # later steps in which the call site ran without a region of F
    EAGER_NS_PER_STEP: Final = "eager_ns_per_step"  # median call-site time over those steps


FALLBACKS_SCHEMA: Final = pl.Schema({
    FallbackCol.FRAME: pl.Int64(), FallbackCol.COMPILE: pl.Int64(), FallbackCol.REGION: pl.String(),
    FallbackCol.STEP: pl.String(), FallbackCol.STEADY: pl.Boolean(), FallbackCol.COMPILED_BEFORE: pl.Int64(),
    FallbackCol.COMPILE_NS: pl.Int64(), FallbackCol.CALL_SITE: pl.String(), FallbackCol.EAGER_STEPS: pl.Int64(),
    FallbackCol.EAGER_NS_PER_STEP: pl.Int64(),
})


def _tops(trace: Trace, ids: np.ndarray, compile_ids: np.ndarray) -> np.ndarray:
    """For each slice id, the outermost compile slice of the chain of compile work it sits in."""
    parent = trace.slices.get_column(Col.PARENT).fill_null(-1).to_numpy()
    is_compile = np.zeros(parent.size, dtype=bool)
    is_compile[compile_ids] = True
    cur: np.ndarray = ids.copy()
    while True:
        up = parent[cur]
        step_up = (up >= 0) & is_compile[np.clip(up, 0, None)]
        if not step_up.any():
            return cur
        cur = np.where(step_up, up, cur)


def compile_fallbacks(trace: Trace, marked: pl.DataFrame, regions: pl.DataFrame,
                      windows: pl.DataFrame) -> pl.DataFrame:
    """One row per frame whose last compile in the trace ran no region and after which no
    region of the frame ran (see the module docstring); FALLBACKS_SCHEMA."""
    compiles = marked.filter(pl.col(ROLE) == Role.COMPILE)
    data = compiles.filter(pl.col(Col.NAME).str.contains(M.COMPILE_DATA.pattern))
    if data.height == 0:  # torch before 2.6 names no compile id: nothing to tell apart
        return pl.DataFrame(schema=FALLBACKS_SCHEMA)
    ids = data.get_column(Col.NAME).str.extract_groups(M.COMPILE_DATA.pattern)
    tops = _tops(trace, data.get_column(Col.ID).to_numpy(), compiles.get_column(Col.ID).to_numpy())
    s = trace.slices
    data = data.with_columns(
        ids.struct.field("2").cast(pl.Int64).alias(FallbackCol.FRAME),
        ids.struct.field("3").cast(pl.Int64).alias(FallbackCol.COMPILE),
        pl.Series("_top", tops), step_of(data.get_column(Col.TS), windows),
    )
    top_dur = s.get_column(Col.DUR).gather(tops)
    per_frame_ns = data.with_columns(top_dur.alias("_top_dur")).unique("_top").group_by(FallbackCol.FRAME).agg(
        pl.col("_top_dur").sum().alias(FallbackCol.COMPILE_NS))
    # A frame first compiled inside another frame's region (a function called from a broken
    # frame, compiled on its own) leaves the outer frame compiled: only a give-up after it ran
    # compiled counts there.
    data = inside(data, union_per_thread(regions), "_in_region")
    attempts = data.sort(Col.TS).group_by(FallbackCol.FRAME, FallbackCol.COMPILE).agg(
        pl.col(Col.TS).first(), pl.col(STEP_INDEX).first(), pl.col("_top").first(), pl.col("_in_region").first())
    ran = regions.group_by(FallbackCol.FRAME, FallbackCol.COMPILE).agg(pl.col(Col.TS).max().alias("_last_run"))
    last_run = regions.group_by(FallbackCol.FRAME).agg(pl.col(Col.TS).max().alias("_frame_last_run"))
    empty = attempts.join(ran, on=[FallbackCol.FRAME, FallbackCol.COMPILE], how="anti")
    failed = (
        empty.sort(Col.TS).group_by(FallbackCol.FRAME).agg(pl.all().last())
        .join(last_run, on=FallbackCol.FRAME, how="left")
        .filter(pl.col("_frame_last_run").is_null() | (pl.col("_frame_last_run") < pl.col(Col.TS)))
        .join(ran.group_by(FallbackCol.FRAME).agg(pl.len().cast(pl.Int64).alias(FallbackCol.COMPILED_BEFORE)),
              on=FallbackCol.FRAME, how="left")
        .join(per_frame_ns, on=FallbackCol.FRAME, how="left")
        .filter(pl.col(FallbackCol.COMPILED_BEFORE).is_not_null() | ~pl.col("_in_region"))
        .sort(FallbackCol.FRAME)
    )
    if failed.height == 0:
        return pl.DataFrame(schema=FALLBACKS_SCHEMA)
    rows = [_eager_after(trace, row, windows) for row in failed.iter_rows(named=True)]
    return pl.DataFrame(rows, schema=FALLBACKS_SCHEMA, orient="row")


def _eager_after(trace: Trace, row: dict[str, object], windows: pl.DataFrame) -> dict[str, object]:
    """The fallback's row: its step, and its call site's runs in the steps after it."""
    s = trace.slices
    top = int(row["_top"])  # type: ignore[call-overload]
    site = s.row(top, named=True)[Col.PARENT]
    step_index = row[STEP_INDEX]
    step_names = windows.get_column(WindowCol.STEP).to_list()
    steady = windows.get_column(WindowCol.STEADY).to_list()
    name: str | None = None
    eager_steps, eager_ns = 0, None
    if site is not None and s.row(site, named=True)[Col.PARENT] is not None:
        site_row = s.row(site, named=True)
        name = str(site_row[Col.NAME])
        later = trace.slices_where(
            (pl.col(Col.NAME) == name) & (pl.col(Col.PID) == site_row[Col.PID]) & (pl.col(Col.TID) == site_row[Col.TID])
            & (pl.col(Col.DEPTH) == site_row[Col.DEPTH]) & (pl.col(Col.TS) > site_row[Col.TS]), Col.TS, Col.DUR)
        later = later.with_columns(step_of(later.get_column(Col.TS), windows)).drop_nulls(STEP_INDEX)
        per_step = later.group_by(STEP_INDEX).agg(pl.col(Col.DUR).sum())
        eager_steps = per_step.height
        if eager_steps:
            eager_ns = round(float(per_step.get_column(Col.DUR).median()))  # type: ignore[arg-type]
    index = int(step_index) if isinstance(step_index, int) else None
    return {
        FallbackCol.FRAME: row[FallbackCol.FRAME], FallbackCol.COMPILE: row[FallbackCol.COMPILE],
        FallbackCol.REGION: f"{row[FallbackCol.FRAME]}/{row[FallbackCol.COMPILE]}",
        FallbackCol.STEP: None if index is None else str(step_names[index]),
        FallbackCol.STEADY: False if index is None else bool(steady[index]),
        FallbackCol.COMPILED_BEFORE: row[FallbackCol.COMPILED_BEFORE] or 0,
        FallbackCol.COMPILE_NS: row[FallbackCol.COMPILE_NS], FallbackCol.CALL_SITE: name,
        FallbackCol.EAGER_STEPS: eager_steps, FallbackCol.EAGER_NS_PER_STEP: eager_ns,
    }
