"""Per-row answers about a categorical name column, decided once per distinct name.

The trace's name columns are categorical: a large nsys export has millions of slices but tens of
thousands of distinct names, so a name test (a pattern, a parse) runs once per distinct name and
every row takes its name's answer through its categorical code. ``distinct_names`` gives the
names to decide, ``decide`` decides them (a test's literal pre-test over all of them at once
first, where it has one); ``NameCodes.spread`` hands each row its name's answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]
T = TypeVar("T")


def distinct_names(names: pl.Series, rows: B | None = None) -> tuple[I64, list[str]]:
    """The distinct names of ``names`` (of the ``rows`` marked, when given; nulls aside): their
    categorical codes and their texts."""
    chosen = names if rows is None else names.filter(pl.Series(rows))
    unique = chosen.unique().drop_nulls()
    return unique.to_physical().to_numpy().astype(np.int64, copy=False), unique.cast(pl.String).to_list()


#: From this many names a column pre-test pays: each costs 0.05-0.3 ms however few the names, the
#: rules 0.2-0.7 µs a name (measured over the nsys export's names: even at 1,000-3,000).
PRETEST_MIN_NAMES: Final = 2_000


def decide(texts: list[str], test: Callable[[str], T], pretest: Callable[[pl.Series], pl.Series] | None,
           fill: T) -> list[T]:
    """``test`` of each text. With a ``pretest`` (a test of a whole column at once, which every
    text that ``test`` answers other than ``fill`` passes), ``test`` is asked only of the texts
    the pre-test passes, and the others get ``fill`` (one by one below ``PRETEST_MIN_NAMES``)."""
    if pretest is None or len(texts) < PRETEST_MIN_NAMES:
        return [test(text) for text in texts]
    out = [fill] * len(texts)
    for i in np.flatnonzero(pretest(pl.Series(texts, dtype=pl.String)).to_numpy()).tolist():
        out[i] = test(texts[i])
    return out


class NameCodes(msgspec.Struct, frozen=True):
    """Each row's name code (``row``), nulls at the last of ``size`` slots."""

    row: I64
    size: int

    @classmethod
    def of(cls, names: pl.Series) -> NameCodes:
        codes = names.to_physical()
        physical = codes.drop_nulls().to_numpy()
        size = int(physical.max()) + 2 if physical.size else 1  # (the last slot is null's)
        return cls(codes.cast(pl.Int64).fill_null(size - 1).to_numpy(), size)

    def spread(self, codes: I64, values: Any, fill: Any, dtype: npt.DTypeLike) -> npt.NDArray[Any]:
        """Per row, ``values[i]`` where its name's code is ``codes[i]``; ``fill`` for other names
        and for rows without one."""
        table = np.full(self.size, fill, dtype=dtype)
        table[codes] = values
        out: npt.NDArray[Any] = table[self.row]
        return out
