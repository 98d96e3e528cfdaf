"""What compiled code issued: GPU kernels (by their launch call; a kernel replayed from a CUDA
graph lands where the graph was replayed), CUDA graph launches and inductor CPU kernel frames,
each attributed to the region run that holds it on its thread.
"""

from __future__ import annotations

import polars as pl

from tracewhy.analyses import compile_markers as M
from tracewhy.analyses.compile_slices import ROLE, Role
from tracewhy.analyses.thread_intervals import END
from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import Trace


def has_triton_kernels(trace: Trace) -> bool:
    """Whether a launched kernel is Triton's (``kernel_items`` counts those wherever launched)."""
    names = trace.of_kind(Kind.KERNEL).filter(pl.col(Col.LAUNCH).is_not_null()).get_column(Col.NAME).unique()
    return any(n and M.TRITON_KERNEL.match(n) for n in names.to_list())


def kernel_items(trace: Trace, marked: pl.DataFrame) -> pl.DataFrame:
    """CUDA graph launches and kernels as host-side points (thread, ts, _end): GPU kernels by
    their launch call (a kernel replayed from a CUDA graph carries the graph launch's
    correlation, so it lands where the graph was replayed), inductor CPU kernels by frame.
    Columns: pid, tid, ts_ns, _end, _launch and _kernel (1 for a graph launch, a kernel),
    _triton (a Triton kernel)."""
    items = [
        marked.filter(pl.col(ROLE) == Role.LAUNCH).select(
            Col.PID, Col.TID, Col.TS, END, pl.lit(1).alias("_launch"), pl.lit(0).alias("_kernel"),
            pl.lit(False).alias("_triton")),
        marked.filter(pl.col(ROLE) == Role.CPU_KERNEL).select(
            Col.PID, Col.TID, Col.TS, END, pl.lit(0).alias("_launch"), pl.lit(1).alias("_kernel"),
            pl.lit(False).alias("_triton")),
    ]
    kernels = trace.of_kind(Kind.KERNEL).filter(pl.col(Col.LAUNCH).is_not_null())
    if kernels.height:
        names = [n for n in kernels.get_column(Col.NAME).unique().to_list() if n and M.TRITON_KERNEL.match(n)]
        launch = kernels.get_column(Col.LAUNCH)
        s = trace.slices
        ts = s.get_column(Col.TS).gather(launch)
        items.append(pl.DataFrame({
            Col.PID: s.get_column(Col.PID).gather(launch), Col.TID: s.get_column(Col.TID).gather(launch),
            Col.TS: ts, END: ts + s.get_column(Col.DUR).gather(launch),
            "_triton": kernels.get_column(Col.NAME).is_in(names),
        }).with_columns(pl.lit(0).alias("_launch"), pl.lit(1).alias("_kernel")))
    return pl.concat(items, how="diagonal_relaxed").with_columns(pl.col("_launch", "_kernel").cast(pl.Int64))


def _innermost_region(items: pl.DataFrame, regions: pl.DataFrame) -> pl.DataFrame:
    """``items`` (ts, _end per thread) with ``_region_id``: the latest-started region that
    holds it, else the outermost one that does (a launch after a nested region ended)."""
    all_runs = regions.select(Col.PID, Col.TID, pl.col(Col.TS).alias("_r_ts"), pl.col(END).alias("_r_end"),
                              pl.col(Col.ID).alias("_r_id")).sort("_r_ts")
    outer = regions.filter(~pl.col("_nested")).select(
        Col.PID, Col.TID, pl.col(Col.TS).alias("_o_ts"), pl.col(END).alias("_o_end"), pl.col(Col.ID).alias("_o_id")
    ).sort("_o_ts")
    j = (
        items.sort(Col.TS)
        .join_asof(all_runs, left_on=Col.TS, right_on="_r_ts", by=[Col.PID, Col.TID], strategy="backward",
                   check_sortedness=False)
        .join_asof(outer, left_on=Col.TS, right_on="_o_ts", by=[Col.PID, Col.TID], strategy="backward",
                   check_sortedness=False)
    )
    return j.with_columns(
        pl.when(pl.col(END) <= pl.col("_r_end")).then("_r_id")
        .when(pl.col(END) <= pl.col("_o_end")).then("_o_id").alias("_region_id")
    ).select(pl.exclude("_r_ts", "_r_end", "_r_id", "_o_ts", "_o_end", "_o_id"))


def region_work(items: pl.DataFrame, regions: pl.DataFrame) -> pl.DataFrame:
    """Per region run (its slice id): the CUDA graph launches and kernels it issued.
    ``regions``: the region runs, each with ``_nested`` (it started inside another on its
    thread). Columns: _region_id, _launches, _kernels."""
    if items.height == 0 or regions.height == 0:
        return pl.DataFrame(schema={"_region_id": pl.Int64, "_launches": pl.Int64, "_kernels": pl.Int64})
    return (
        _innermost_region(items, regions).drop_nulls("_region_id")
        .group_by("_region_id")
        .agg(pl.col("_launch").sum().alias("_launches"), pl.col("_kernel").sum().alias("_kernels"))
    )
