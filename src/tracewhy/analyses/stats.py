"""Typed scalar reductions of polars columns (polars' own return a union of every scalar type)."""

from __future__ import annotations

import polars as pl


def mean_of(column: pl.Series) -> float | None:
    """Mean of a numeric column, None when it is empty or all null."""
    value = column.mean()
    return None if value is None else float(value)  # type: ignore[arg-type]


def sum_of(column: pl.Series) -> float:
    """Sum of a numeric column (0 when empty)."""
    value = column.sum()
    return float(value) if value is not None else 0.0


def max_of(column: pl.Series) -> float:
    """Largest value of a numeric column (0 when empty or all null)."""
    value = column.max()
    return float(value) if value is not None else 0.0  # type: ignore[arg-type]


# Time is whole nanoseconds everywhere: a statistic that lands between two (a mean, the median of
# an even count, an interpolated percentile) is rounded to the nearest one, ties to even, as
# Python's round() and polars' round() both do, so that a table and a scalar of the same
# statistic agree.


def nearest_ns(value: float) -> int:
    """A fractional nanosecond statistic as whole nanoseconds (the nearest; ties to even)."""
    return round(value)


def whole_ns(expr: pl.Expr) -> pl.Expr:
    """A nanosecond column of fractional statistics as Int64, each the nearest whole nanosecond
    (NaN, which a statistic of nothing can be, becomes null)."""
    return expr.fill_nan(None).round(0).cast(pl.Int64)
