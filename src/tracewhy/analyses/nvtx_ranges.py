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
from tracewhy.model.schema import Col, NCol
from tracewhy.model.trace import NSYS_FORMAT, Trace

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


@dataclass(frozen=True)
class NvtxRangesResult:
    """``table``: one row per (name, style), by total range time, largest first, then name.

    Columns: name, style (PushPop or StartEnd), count, total_ns, mean_ns, median_ns, min_ns,
    max_ns, stddev_ns (sample), share (of all listed range time) as ``nvtx_sum``; then, null
    where no GPU work was projected onto the name, proj_instances (instances with GPU work),
    total_proj_ns, proj_mean_ns, proj_median_ns, proj_min_ns, proj_max_ns, proj_stddev_ns,
    total_gpu_ops as ``nvtx_gpu_proj_sum``, and our total_gpu_time_ns (summed op time) and
    total_gpu_busy_ns (their union per instance, summed).
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
        Col.NAME, NCol.STYLE, *[pl.col(src).alias(dst) for src, dst in _PROJECTION.items()]
    )
    table = (
        cpu.table.join(proj, on=[Col.NAME, NCol.STYLE], how="left")
        .select(Col.NAME, NCol.STYLE, *cpu.table.columns[2:], *_PROJECTION.values())
        .sort(["total_ns", Col.NAME, NCol.STYLE], descending=[True, False, False])
    )
    return NvtxRangesResult(
        source="nvtx" if trace.meta.format == NSYS_FORMAT else "user annotations",
        range_count=int(table.get_column("count").sum()) if table.height else 0,
        total_ns=cpu.total,
        table=table,
        unattributed=projection.unattributed,
        ops_without_launch=projection.ops_without_launch,
    )
