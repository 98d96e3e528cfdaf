"""Where GPU kernel time goes: per kernel name, per family, and the trace's totals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

from tracewhy.analyses.families import classify_kernels
from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import Trace


@dataclass(frozen=True)
class KernelsResult:
    """Kernel time per name (``by_name``) and per family (``by_family``), largest first.

    ``by_name`` columns: name, family, rule, count, total_ns, mean_ns, p50_ns, min_ns, max_ns,
    share. ``rule`` says what decided the family (families.Rule: collective op, comm-only
    stream, library, name); a name whose launches were classified differently (a kernel
    launched under a collective op in one place and not in another) has a row per family and
    rule. ``share`` is the fraction of all kernel time in the trace. ``by_family``: family,
    count, total_ns, share.
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
    k = trace.of_kind(Kind.KERNEL).select(Col.ID, pl.col(Col.NAME).cast(pl.String), Col.DUR)
    k = k.join(classify_kernels(trace), on=Col.ID, how="left")
    total_ns = int(k.get_column(Col.DUR).sum()) if k.height else 0
    by_name = (
        k.group_by(Col.NAME, "family", "rule")
        .agg(
            pl.len().cast(pl.Int64).alias("count"),
            pl.col(Col.DUR).sum().alias("total_ns"),
            pl.col(Col.DUR).mean().alias("mean_ns"),
            pl.col(Col.DUR).median().alias("p50_ns"),
            pl.col(Col.DUR).min().alias("min_ns"),
            pl.col(Col.DUR).max().alias("max_ns"),
        )
        .with_columns((pl.col("total_ns") / max(total_ns, 1)).alias("share"))
    )
    by_name = (
        by_name.sort(["total_ns", Col.NAME, "family", "rule"], descending=[True, False, False, False])
        .select(Col.NAME, "family", "rule", "count", "total_ns", "mean_ns", "p50_ns", "min_ns", "max_ns", "share")
    )
    by_family = (
        by_name.group_by("family")
        .agg(pl.col("count").sum(), pl.col("total_ns").sum())
        .with_columns((pl.col("total_ns") / max(total_ns, 1)).alias("share"))
        .sort(["total_ns", "family"], descending=[True, False])
    )
    return KernelsResult(
        total_count=k.height, total_time_ns=total_ns, by_name=by_name, by_family=by_family
    )
