"""Where the step time changed between two runs, part by part: each run's step account (its mean
analysed step split into parts that add up to it) joined by part and kind, B minus A, largest
change first. The parts of both accounts add up to their mean steps, so the changes add up to
the change of the mean step: ``diff`` says what moved before the operator tables say which ops."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import polars as pl

if TYPE_CHECKING:  # (the comparison imports this module; the account's own modules load when an account exists)
    from tracewhy.analyses.account import AccountResult

#: The account's part columns (``account.AccountCol``: PART, KIND, NS_PER_STEP).
_PART, _KIND, _NS = "part", "kind", "ns_per_step"


class AccountDeltaCol:
    PART: Final = _PART
    KIND: Final = _KIND
    A: Final = "a_ns_per_step"
    B: Final = "b_ns_per_step"
    DELTA: Final = "delta_ns_per_step"


#: ``account_changes``: one row per part of either account.
ACCOUNT_DELTAS_SCHEMA: Final = pl.Schema({
    AccountDeltaCol.PART: pl.String(), AccountDeltaCol.KIND: pl.String(), AccountDeltaCol.A: pl.Int64(),
    AccountDeltaCol.B: pl.Int64(), AccountDeltaCol.DELTA: pl.Int64(),
})


def account_changes(a: AccountResult | None, b: AccountResult | None) -> pl.DataFrame:
    """Each part's time per step in A and in B (0 where a run has no such part) and the change,
    largest first (by size, ties by name); empty unless both runs have an account."""
    if a is None or b is None:
        return pl.DataFrame(schema=ACCOUNT_DELTAS_SCHEMA)

    def side(r: AccountResult, column: str) -> pl.DataFrame:
        return r.parts.select(pl.col(_PART).cast(pl.String), pl.col(_KIND).cast(pl.String),
                              pl.col(_NS).round().cast(pl.Int64).alias(column))

    joined = side(a, AccountDeltaCol.A).join(side(b, AccountDeltaCol.B), on=[_PART, _KIND], how="full",
                                             coalesce=True)
    return (joined.with_columns(pl.col(AccountDeltaCol.A).fill_null(0), pl.col(AccountDeltaCol.B).fill_null(0))
            .with_columns((pl.col(AccountDeltaCol.B) - pl.col(AccountDeltaCol.A)).alias(AccountDeltaCol.DELTA))
            .sort([pl.col(AccountDeltaCol.DELTA).abs(), AccountDeltaCol.PART], descending=[True, False])
            .select(list(ACCOUNT_DELTAS_SCHEMA)).cast(ACCOUNT_DELTAS_SCHEMA))
