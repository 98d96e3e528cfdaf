"""The step account per inference step class: where a prefill step goes and where a decode step
goes, each part's mean over the analysed steps of that class (a trace mixing them has one mean
step that is neither)."""

from __future__ import annotations

from typing import Final

import polars as pl

from tracewhy.analyses.account import AccountCol, AccountResult
from tracewhy.analyses.step_classes import ClassCol, StepClasses
from tracewhy.analyses.step_verdicts import ORDER

STEPS: Final = "steps"  # analysed steps of the class

PARTS_BY_CLASS_SCHEMA: Final = pl.Schema({
    ClassCol.CLASS: pl.String(), STEPS: pl.Int64(), AccountCol.PART: pl.String(), AccountCol.NS_PER_STEP: pl.Int64(),
    AccountCol.SHARE: pl.Float64(),
})


def parts_by_class(account: AccountResult, classes: StepClasses) -> pl.DataFrame:
    """PARTS_BY_CLASS_SCHEMA rows: per class (in ``step_verdicts.ORDER``), its parts, largest first;
    ``share`` is of the class's mean analysed step. A window is a step of a class when they start
    together (both come from the same steps)."""
    windows = account.windows.select(AccountCol.STEP, AccountCol.WINDOW_START).join(
        classes.steps.select(pl.col(ClassCol.START).alias(AccountCol.WINDOW_START), ClassCol.CLASS),
        on=AccountCol.WINDOW_START, how="inner")
    if windows.height == 0:
        return pl.DataFrame(schema=PARTS_BY_CLASS_SCHEMA)
    per_step = account.per_step.join(windows.select(AccountCol.STEP, ClassCol.CLASS), on=AccountCol.STEP)
    counts = windows.group_by(ClassCol.CLASS).agg(pl.len().cast(pl.Int64).alias(STEPS))
    table = (
        per_step.group_by(ClassCol.CLASS, AccountCol.PART).agg(pl.col(AccountCol.NS).sum().alias("_ns"))
        .join(counts, on=ClassCol.CLASS)
        .with_columns((pl.col("_ns") / pl.col(STEPS)).round().cast(pl.Int64).alias(AccountCol.NS_PER_STEP))
        .with_columns((pl.col(AccountCol.NS_PER_STEP) / pl.col(AccountCol.NS_PER_STEP).sum().over(ClassCol.CLASS))
                      .alias(AccountCol.SHARE))
        .with_columns(pl.col(ClassCol.CLASS).replace_strict({c: i for i, c in enumerate(ORDER)},
                                                             return_dtype=pl.Int64).alias("_order"))
        .sort(["_order", AccountCol.NS_PER_STEP, AccountCol.PART], descending=[False, True, False])
    )
    return table.select(PARTS_BY_CLASS_SCHEMA.names()).cast(PARTS_BY_CLASS_SCHEMA)
