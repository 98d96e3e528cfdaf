"""Per range name: the CPU-side statistics of nsys ``nvtx_sum`` beside the GPU projection of
``nvtx_gpu_proj_sum``, in one table (the ``nvtx`` command's answer).

On nsys input the ranges are NVTX ranges; on Kineto input they are the user annotations
(``record_function`` scopes, ``ProfilerStep#N``), which ``analyses.nvtx`` treats as push/pop
ranges and projects the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

from tracewhy.analyses.nvtx import gpu_projection, nvtx_summary
from tracewhy.analyses.nvtx_work import Unattributed
from tracewhy.analyses.stats import whole_ns
from tracewhy.model.schema import Col, NvtxCol
from tracewhy.model.trace import NSYS_FORMAT, Trace
from tracewhy.rows import Rows

#: Projection columns of ``nvtx_gpu_proj_sum`` kept per (name, style), renamed where the
#: plain name would clash with the CPU-side statistics.
_PROJECTION: Final = {
    "instances": "proj_instances",
    "total_proj_ns": "total_proj_ns",
    "proj_mean_ns": "proj_mean_ns",
    "proj_median_ns": "proj_median_ns",
    "proj_min_ns": "proj_min_ns",
    "proj_max_ns": "proj_max_ns",
    "proj_stddev_ns": "proj_stddev_ns",
    "total_gpu_ops": "total_gpu_ops",
    "total_gpu_time_ns": "total_gpu_time_ns",
    "total_gpu_busy_ns": "total_gpu_busy_ns",
}


class RangeCol:
    """Columns of ``NvtxRangesResult.table``: the CPU-side statistics as ``nvtx_sum``, then the GPU
    projection as ``nvtx_gpu_proj_sum`` (null where no GPU work was projected onto the name)."""

    NAME: Final = Col.NAME
    STYLE: Final = NvtxCol.STYLE  # PushPop or StartEnd
    COUNT: Final = "count"
    TOTAL: Final = "total_ns"
    #: The mean, median and sample standard deviation are rounded to the nearest nanosecond here
    #: (nsys prints them to a tenth); ``tracewhy.nsys_stats`` keeps nsys's fractions.
    MEAN: Final = "mean_ns"
    MEDIAN: Final = "median_ns"
    MIN: Final = "min_ns"
    MAX: Final = "max_ns"
    STDDEV: Final = "stddev_ns"
    SHARE: Final = "share"  # of all listed range time
    PROJ_INSTANCES: Final = "proj_instances"  # instances with GPU work
    TOTAL_PROJ: Final = "total_proj_ns"
    PROJ_MEAN: Final = "proj_mean_ns"
    PROJ_MEDIAN: Final = "proj_median_ns"
    PROJ_MIN: Final = "proj_min_ns"
    PROJ_MAX: Final = "proj_max_ns"
    PROJ_STDDEV: Final = "proj_stddev_ns"
    TOTAL_GPU_OPS: Final = "total_gpu_ops"
    TOTAL_GPU_TIME: Final = "total_gpu_time_ns"  # the projected operations' summed time
    TOTAL_GPU_BUSY: Final = "total_gpu_busy_ns"  # their union per instance, summed


NVTX_RANGES_SCHEMA: Final = pl.Schema({
    RangeCol.NAME: pl.String(), RangeCol.STYLE: pl.String(), RangeCol.COUNT: pl.Int64(), RangeCol.TOTAL: pl.Int64(),
    RangeCol.MEAN: pl.Int64(), RangeCol.MEDIAN: pl.Int64(), RangeCol.MIN: pl.Int64(), RangeCol.MAX: pl.Int64(),
    RangeCol.STDDEV: pl.Int64(), RangeCol.SHARE: pl.Float64(), RangeCol.PROJ_INSTANCES: pl.Int64(),
    RangeCol.TOTAL_PROJ: pl.Int64(), RangeCol.PROJ_MEAN: pl.Int64(), RangeCol.PROJ_MEDIAN: pl.Int64(),
    RangeCol.PROJ_MIN: pl.Int64(), RangeCol.PROJ_MAX: pl.Int64(), RangeCol.PROJ_STDDEV: pl.Int64(),
    RangeCol.TOTAL_GPU_OPS: pl.Int64(), RangeCol.TOTAL_GPU_TIME: pl.Int64(), RangeCol.TOTAL_GPU_BUSY: pl.Int64(),
})
#: The fractional statistics, rounded to whole nanoseconds in the table.
_ROUNDED: Final = (RangeCol.MEAN, RangeCol.MEDIAN, RangeCol.STDDEV, RangeCol.PROJ_MEAN, RangeCol.PROJ_MEDIAN,
                   RangeCol.PROJ_STDDEV)


@dataclass(frozen=True)
class NvtxRangesResult(Rows, rows="table", key="name"):
    """``table``: one row per (name, style), by total range time, largest first, then name, with
    NVTX_RANGES_SCHEMA (see RangeCol).
    ``source``: "nvtx" or "user annotations". ``unattributed``: GPU work launched outside
    every range; ``ops_without_launch``: GPU operations with no launching call in the trace.
    """

    source: str
    range_count: int
    total_ns: int
    table: pl.DataFrame
    unattributed: Unattributed | None
    ops_without_launch: int


def nvtx_ranges(trace: Trace) -> NvtxRangesResult:
    cpu = nvtx_summary(trace)
    projection = gpu_projection(trace)
    proj = projection.summary.select(
        Col.NAME, NvtxCol.STYLE, *[pl.col(src).alias(dst) for src, dst in _PROJECTION.items()]
    )
    table = (
        cpu.table.join(proj, on=[Col.NAME, NvtxCol.STYLE], how="left")
        .select(Col.NAME, NvtxCol.STYLE, *cpu.table.columns[2:], *_PROJECTION.values())
        .sort([RangeCol.TOTAL, Col.NAME, NvtxCol.STYLE], descending=[True, False, False])
        .with_columns(whole_ns(pl.col(c)) for c in _ROUNDED)
        .select(*NVTX_RANGES_SCHEMA)
    )
    return NvtxRangesResult(
        source="nvtx" if trace.meta.format == NSYS_FORMAT else "user annotations",
        range_count=int(table.get_column(RangeCol.COUNT).sum()) if table.height else 0,
        total_ns=cpu.total,
        table=table,
        unattributed=projection.unattributed,
        ops_without_launch=projection.ops_without_launch,
    )
