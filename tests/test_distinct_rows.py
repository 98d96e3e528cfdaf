"""distinct_rows: the first row of each distinct row and each row's group, by first appearance,
checked against numpy's sort-based unique over rows."""

from __future__ import annotations

import numpy as np
import pytest

from tracewhy.analyses.distinct_rows import _packed, distinct_rows


def _by_sorting(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The same answer from np.unique over rows: groups renumbered in order of first appearance."""
    table = np.stack(columns, axis=1)
    _, first, inverse = np.unique(table, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return first[order], rank[inverse.reshape(-1)]


@pytest.mark.parametrize(("rows", "width", "low", "high"), [
    (1, 3, 0, 5),
    (200, 4, -1, 3),  # few distinct rows, negative codes (-1: none)
    (5_000, 13, -2, 40),  # the step account's 13 key columns, packed into one or two integers
    (5_000, 5, -(2**40), 2**40),  # spans too wide to pack: one integer per column
])
def test_distinct_rows_match_a_sort_over_rows(rows: int, width: int, low: int, high: int) -> None:
    rng = np.random.default_rng(rows + width)
    columns = [rng.integers(low, high, rows, dtype=np.int64) for _ in range(width)]
    first, group = distinct_rows(columns)
    want_first, want_group = _by_sorting(columns)
    assert first.tolist() == want_first.tolist()
    assert group.tolist() == want_group.tolist()


def test_packing_keeps_rows_apart_and_under_the_room() -> None:
    rng = np.random.default_rng(7)
    columns = [rng.integers(-1, 1000, 3_000, dtype=np.int64) for _ in range(13)]
    keys = _packed(columns)
    assert 1 < len(keys) < 13  # three columns of ~1000 values fit one int64 key, 13 do not
    assert all(int(k.min()) >= 0 and int(k.max()) < 2**62 for k in keys)
    packed_rows = {tuple(r) for r in np.stack(keys, axis=1).tolist()}
    assert len(packed_rows) == len({tuple(r) for r in np.stack(columns, axis=1).tolist()})


def test_no_rows() -> None:
    first, group = distinct_rows([np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)])
    assert first.size == 0 and group.size == 0
