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
