"""The step marker of a PyTorch profiler trace captured without ``prof.step()`` (no
``ProfilerStep#N``): a repeated top-level ``record_function`` block whose spans tile the run, as
a training loop's iteration block does. The nsys counterpart is ``nvtx.nvtx_step_marker``."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.host_activity import HostIndex, build_host_index
from tracewhy.analyses.nvtx import PROFILER_STEP_PREFIX, TILING_SHARE, StepMarker
from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import KINETO_FORMAT, Trace

#: A loop runs at least this many iterations in a capture worth calling steps.
MIN_ITERATIONS: Final = 3


def annotation_step_marker(trace: Trace, host: Callable[[], HostIndex] | None = None) -> StepMarker | None:
    """The top-level annotation (no annotation or op above it; Python frames aside) repeated at
    least MIN_ITERATIONS times on one thread whose spans tile the run; most repeats, then most
    time. torch's own blocks are never the step: the DataLoader fetch and the optimizer's step
    are record_functions PyTorch opens inside the loop (api_names holds their names). ``host``
    gives the trace's host index (``host_index_once``), asked for only when annotations are searched."""
    if trace.meta.format != KINETO_FORMAT:
        return None
    names = trace.slices.get_column(Col.NAME).cast(pl.String)
    if names.str.starts_with(PROFILER_STEP_PREFIX).any():
        return None
    tops = top_level_annotations(trace, host() if host is not None else None)
    if tops is None:
        return None
    blocks = tops.drop(Col.ID).filter(~pl.col(Col.NAME).map_elements(_torch_block, return_dtype=pl.Boolean))
    per_thread = blocks.group_by(Col.NAME, Col.PID, Col.TID).agg(
        pl.len().alias("n"), (pl.col("end") - pl.col(Col.TS)).sum().alias("t"),
        (pl.col("end").max() - pl.col(Col.TS).min()).alias("span"),
    ).filter((pl.col("n") >= MIN_ITERATIONS) & (pl.col("t") >= TILING_SHARE * pl.col("span")))
    if per_thread.height == 0:
        return None
    ranked = per_thread.sort(["n", "t", Col.NAME], descending=[True, True, False])
    best = ranked.row(0, named=True)
    runner = (f"; runner-up {ranked.row(1, named=True)[Col.NAME]!r}" if ranked.height > 1 else "")
    note = (f"no ProfilerStep# markers: steps are the top-level block {best[Col.NAME]!r}, repeated {best['n']} "
            f"times on one thread with its spans tiling the run{runner}; choose another with --step NAME")
    return StepMarker(name=str(best[Col.NAME]), repeats=int(best["n"]), note=note)


def top_level_annotations(trace: Trace, host: HostIndex | None = None) -> pl.DataFrame | None:
    """The annotations with no annotation or op above them (Python frames aside): their slice id,
    name, process, thread, start and ``end``; None without annotations. ``host``: the trace's host
    index, when the caller has it."""
    host = host if host is not None else build_host_index(trace)
    rows = np.flatnonzero(host.is_kind(Kind.ANNOTATION))
    if rows.size == 0:
        return None
    top = host.top_level(rows)
    s = trace.slices
    ids = host.ids[top]
    return pl.DataFrame({
        Col.ID: ids, Col.NAME: s.get_column(Col.NAME).gather(ids).cast(pl.String),
        Col.PID: s.get_column(Col.PID).gather(ids), Col.TID: s.get_column(Col.TID).gather(ids),
        Col.TS: host.ts[top], "end": host.end[top],
    })


def _torch_block(name: str | None) -> bool:
    return name is None or api_names.is_dataloader(name) or api_names.is_optimizer(name)


def numbers_past_int64_note(names: list[str], numbers: list[int | None], pattern: re.Pattern[str]) -> str | None:
    """The note for step markers whose number no column holds (``ProfilerStep#99999999999999999999999``):
    read as unnumbered, so step #0 is not recognised and the steps are matched by time alone."""
    past = [n for n, k in zip(names, numbers, strict=True) if k is None and (m := pattern.match(n)) and m.group(1)]
    if not past:
        return None
    return (f"{len(past)} step marker(s) carry a number past int64 ({past[0][:48]}): their numbers "
            f"are unknown, so these steps are ordered by time and not matched by number")
