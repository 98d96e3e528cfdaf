"""Interval operations on host slices as polars frames, thread by thread: each row has
``pid``, ``tid``, ``ts_ns`` and an end column ``END``. Host slices nest properly on a thread, so a
running maximum of ends says what is inside what, without walking parent links."""

from __future__ import annotations

from typing import Final

import polars as pl

from tracewhy.model.schema import Col

#: The end column (``ts_ns + dur_ns``) every frame here carries.
END: Final = "_end"


def union_per_thread(rows: pl.DataFrame) -> pl.DataFrame:
    """Merge each thread's intervals (ts, _end) into disjoint ones."""
    if rows.height == 0:
        return rows.select(Col.PID, Col.TID, Col.TS, END)
    prev = pl.col(END).cum_max().shift(1).over([Col.PID, Col.TID])
    return (
        rows.sort([Col.PID, Col.TID, Col.TS])
        .with_columns((prev.is_null() | (pl.col(Col.TS) > prev)).cum_sum().alias("_group"))
        .group_by("_group", maintain_order=True)
        .agg(pl.col(Col.PID).first(), pl.col(Col.TID).first(), pl.col(Col.TS).min(), pl.col(END).max())
        .drop("_group")
    )


def inside(points: pl.DataFrame, intervals: pl.DataFrame, label: str) -> pl.DataFrame:
    """``points`` (ts, _end per thread) with a boolean ``label``: inside one of ``intervals``
    (disjoint per thread) on the same thread."""
    if intervals.height == 0 or points.height == 0:
        return points.with_columns(pl.lit(False).alias(label))
    iv = intervals.select(Col.PID, Col.TID, pl.col(Col.TS).alias("_iv_ts"), pl.col(END).alias("_iv_end"))
    return (
        points.sort(Col.TS)
        .join_asof(iv.sort("_iv_ts"), left_on=Col.TS, right_on="_iv_ts", by=[Col.PID, Col.TID], strategy="backward",
                   check_sortedness=False)
        .with_columns((pl.col("_iv_end").is_not_null() & (pl.col(END) <= pl.col("_iv_end"))).alias(label))
        .drop("_iv_ts", "_iv_end")
    )
