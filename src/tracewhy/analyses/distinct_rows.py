"""The distinct rows of integer columns, found by hashing: which rows are alike, and the first of
each kind. The step account decides each distinct edge key once (``account_parts``)."""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

I64 = npt.NDArray[np.int64]


def distinct_rows(columns: list[I64]) -> tuple[I64, I64]:
    """The first row of each distinct row of these columns, and each row's distinct index (a
    hash grouping: numpy's unique over rows sorts them whole, 0.5 s on 100 k edges). Each row
    is numbered by the first row like it; the rows that are their own first, in order, are the
    distinct ones. The columns are packed into as few integers as hold them (a unique and a join
    back on 13 columns held the rows three times over: 2 GB for the 6.7 M edges of a large
    export's whole-trace window, and more for its 17 M edges a what-if edits)."""
    keys = _packed(columns)
    names = [str(i) for i in range(len(keys))]
    rows = pl.DataFrame(dict(zip(names, keys, strict=True)))
    del keys
    first_like = rows.with_row_index("_row").select(
        pl.col("_row").first().over(names)).to_series().to_numpy().astype(np.int64)
    del rows
    first = np.flatnonzero(first_like == np.arange(first_like.size))
    return first, np.searchsorted(first, first_like).astype(np.int64)


#: Packed keys stay under this, so no digit can overflow an int64.
PACKED_ROOM: Final = 2**62


def _packed(columns: list[I64]) -> list[I64]:
    """The columns as fewer integer columns, equal rows staying equal and different ones
    different: each column, less its least value, is a digit of a mixed-radix number kept under
    2^62."""
    keys: list[I64] = []
    key: I64 | None = None
    room = 1
    for narrow_or_not in columns:
        column = narrow_or_not.astype(np.int64, copy=False)  # (digits multiply: never in int32)
        lo = int(column.min()) if column.size else 0
        span = int(column.max()) - lo + 1 if column.size else 1
        if key is not None and room * span < PACKED_ROOM:
            key = key * span + (column - lo)
            room *= span
        else:
            if key is not None:
                keys.append(key)
            key, room = column - lo, span
    if key is not None:
        keys.append(key)
    return keys
