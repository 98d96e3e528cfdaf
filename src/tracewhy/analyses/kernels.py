"""Where GPU kernel time goes: per kernel name, per family, and the trace's totals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

from tracewhy.analyses.families import classify_kernels
from tracewhy.analyses.stats import whole_ns
from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows


class KernelCol:
    """Columns of the KernelsResult tables."""

    NAME: Final = Col.NAME
    FAMILY: Final = "family"
    #: What decided the family (families.Rule: collective args, collective op, comm-only stream,
    #: library, name).
    RULE: Final = "rule"
    COUNT: Final = "count"
    TOTAL: Final = "total_ns"
    MEAN: Final = "mean_ns"  # rounded to the nearest nanosecond, as is the median of an even count
    P50: Final = "p50_ns"
    MIN: Final = "min_ns"
    MAX: Final = "max_ns"
    SHARE: Final = "share"  # of all kernel time in the trace


KERNELS_BY_NAME_SCHEMA: Final = pl.Schema({
    KernelCol.NAME: pl.String(), KernelCol.FAMILY: pl.String(), KernelCol.RULE: pl.String(),
    KernelCol.COUNT: pl.Int64(), KernelCol.TOTAL: pl.Int64(), KernelCol.MEAN: pl.Int64(),
    KernelCol.P50: pl.Int64(), KernelCol.MIN: pl.Int64(), KernelCol.MAX: pl.Int64(), KernelCol.SHARE: pl.Float64(),
})
KERNELS_BY_FAMILY_SCHEMA: Final = pl.Schema({
    KernelCol.FAMILY: pl.String(), KernelCol.COUNT: pl.Int64(), KernelCol.TOTAL: pl.Int64(),
    KernelCol.SHARE: pl.Float64(),
})


@dataclass(frozen=True)
class KernelsResult(Rows, rows="by_name", key="name"):
    """Kernel time per name (``by_name``, KERNELS_BY_NAME_SCHEMA) and per family (``by_family``,
    KERNELS_BY_FAMILY_SCHEMA), largest first. A name whose launches were classified differently
    (a kernel launched under a collective op in one place and not in another) has a row per
    family and rule.
    """

    total_count: int
    total_time_ns: int
    by_name: pl.DataFrame
    by_family: pl.DataFrame


#: The slice kinds ``kernels`` reads: a partial Trace of these is enough.
KERNELS_NEED: Final = (Kind.KERNEL,)


def kernels(trace: Trace) -> KernelsResult:
    """Kernel time per name and family. On a Trace read with kernels only, the launch-based
    rule (collective op) has nothing to follow: families come from streams and names."""
    # Names stay categorical until aggregated: a million long templated names as strings cost
    # hundreds of MB and slow the group_by.
    k = trace.of_kind(Kind.KERNEL).select(Col.ID, Col.NAME, Col.DUR)
    k = k.join(classify_kernels(trace), on=Col.ID, how="left")
    total_ns = int(k.get_column(Col.DUR).sum()) if k.height else 0
    by_name = (
        k.group_by(KernelCol.NAME, KernelCol.FAMILY, KernelCol.RULE)
        .agg(
            pl.len().cast(pl.Int64).alias(KernelCol.COUNT),
            pl.col(Col.DUR).sum().alias(KernelCol.TOTAL),
            whole_ns(pl.col(Col.DUR).mean()).alias(KernelCol.MEAN),
            whole_ns(pl.col(Col.DUR).median()).alias(KernelCol.P50),
            pl.col(Col.DUR).min().alias(KernelCol.MIN),
            pl.col(Col.DUR).max().alias(KernelCol.MAX),
        )
        .with_columns(pl.col(KernelCol.NAME).cast(pl.String),
                      (pl.col(KernelCol.TOTAL) / max(total_ns, 1)).alias(KernelCol.SHARE))
    )
    by_name = (
        by_name.sort([KernelCol.TOTAL, KernelCol.NAME, KernelCol.FAMILY, KernelCol.RULE],
                     descending=[True, False, False, False])
        .select(*KERNELS_BY_NAME_SCHEMA)
    )
    by_family = (
        by_name.group_by(KernelCol.FAMILY)
        .agg(pl.col(KernelCol.COUNT).sum(), pl.col(KernelCol.TOTAL).sum())
        .with_columns((pl.col(KernelCol.TOTAL) / max(total_ns, 1)).alias(KernelCol.SHARE))
        .sort([KernelCol.TOTAL, KernelCol.FAMILY], descending=[True, False])
    )
    return KernelsResult(
        total_count=k.height, total_time_ns=total_ns, by_name=by_name, by_family=by_family
    )
