"""Duration summaries per name, with the statistics ``nsys stats`` prints.

Kernels, CUDA API calls and GPU memory operations, from any input format. Each row has count,
total, mean, median (the mean of the two middle values for an even count), min, max, sample
standard deviation (n - 1; 0 for a single instance, as nsys prints it) and the share of the
listed total. Tables are sorted by total time, largest first, then by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

from tracewhy.model.schema import Col, CopyAttrCol, Kind
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows

#: Columns of every summary table after its key column(s).
STAT_COLUMNS: Final = ("count", "total_ns", "mean_ns", "median_ns", "min_ns", "max_ns",
                       "stddev_ns", "share")
MEMSET_OPERATION: Final = "memset"


@dataclass(frozen=True)
class Summary(Rows, rows="table"):
    """One row per key; ``value`` names what was summarized (``dur_ns`` or ``bytes``)."""

    table: pl.DataFrame
    value: str
    total: int


def summarize(frame: pl.DataFrame, key: str, value: str = Col.DUR) -> Summary:
    """Summarize ``value`` per ``key`` with nsys's statistics."""
    v = pl.col(value)
    total = int(frame.get_column(value).sum()) if frame.height else 0
    table = (
        frame.group_by(key)
        .agg(
            pl.len().cast(pl.Int64).alias("count"),
            v.sum().cast(pl.Int64).alias("total_ns"),
            v.mean().alias("mean_ns"),
            v.median().alias("median_ns"),
            v.min().cast(pl.Int64).alias("min_ns"),
            v.max().cast(pl.Int64).alias("max_ns"),
            v.std(ddof=1).fill_null(0.0).alias("stddev_ns"),
        )
        .with_columns((pl.col("total_ns") / max(total, 1)).alias("share"))
        .sort(["total_ns", key], descending=[True, False])
        .select(key, *STAT_COLUMNS)
    )
    if value != Col.DUR:
        table = table.rename({c: c.replace("_ns", "_" + value) for c in STAT_COLUMNS if c.endswith("_ns")})
    return Summary(table=table, value=value, total=total)


def kernel_summary(trace: Trace) -> Summary:
    """Kernel time per kernel name (nsys ``cuda_gpu_kern_sum``)."""
    k = trace.of_kind(Kind.KERNEL).select(pl.col(Col.NAME).cast(pl.String), Col.DUR)
    return summarize(k, Col.NAME)


def api_summary(trace: Trace) -> Summary:
    """CUDA runtime and driver API time per call name (nsys ``cuda_api_sum``)."""
    calls = trace.kind_columns((Kind.RUNTIME, Kind.DRIVER), pl.col(Col.NAME).cast(pl.String), Col.DUR)
    return summarize(calls, Col.NAME)


def memory_ops(trace: Trace) -> pl.DataFrame:
    """Memcpy and memset slices with ``operation`` (copy kind, or "memset") and ``bytes``."""
    ops = trace.of_kind(Kind.MEMCPY, Kind.MEMSET).select(Col.ID, Col.KIND, Col.DUR)
    attrs = trace.copy_attrs.select(Col.ID, CopyAttrCol.BYTES, pl.col(CopyAttrCol.COPY_KIND).cast(pl.String))
    return ops.join(attrs, on=Col.ID, how="left").select(
        Col.ID,
        pl.when(pl.col(Col.KIND) == Kind.MEMSET.value)
        .then(pl.lit(MEMSET_OPERATION))
        .otherwise(pl.col(CopyAttrCol.COPY_KIND).fill_null("unknown"))
        .alias("operation"),
        Col.DUR,
        CopyAttrCol.BYTES,
    )


def memory_time_summary(trace: Trace) -> Summary:
    """GPU time per memory operation (nsys ``cuda_gpu_mem_time_sum``)."""
    return summarize(memory_ops(trace), "operation")


def memory_size_summary(trace: Trace) -> Summary:
    """Bytes per memory operation (nsys ``cuda_gpu_mem_size_sum``, which prints MB = 1e6 B)."""
    ops = memory_ops(trace).filter(pl.col(CopyAttrCol.BYTES).is_not_null())
    return summarize(ops, "operation", CopyAttrCol.BYTES)
