"""MFU per step and per annotated region (record_function and NVTX ranges, ``nn.Module`` frames
of ``with_modules`` traces), from the counted ops of ``analyses.mfu``.

A step's time is its window (its start to the next step's start in its process: the loop's
period), and its ops are those that start in it. A region's ops are those nested under one of
its instances on the host stack; its time, on a GPU trace, is the span of the device work
launched under each instance (first start to last end, summed over instances), since the host
range of an asynchronous launch says nothing of when the math ran; on a CPU trace, the
instances' host spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.mfu import MfuOp, MfuOps, ancestors, counted_ops, flop_source, parent_of, window_sums
from tracewhy.analyses.steps import StepsResult, WindowCol, step_windows
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, Kind
from tracewhy.model.trace import Trace

#: ``with_modules`` names each module's forward frame so (torch.profiler, PyTorch >= 1.13).
MODULE_PREFIX: Final = "nn.Module: "
REGION_ANNOTATION: Final = "annotation"
REGION_MODULE: Final = "module"
DEVICE_SPAN: Final = "device span"
HOST_SPAN: Final = "host span"


class MfuStepCol:
    """Columns of ``MfuResult.steps``: one row per step, in time order."""

    STEP: Final = "step"
    NUMBER: Final = "number"
    STEADY: Final = "steady"
    WINDOW_NS: Final = "window_ns"
    FLOPS: Final = "flops"
    FLOP_PER_S: Final = "flop_per_s"
    IDEAL_NS: Final = "ideal_ns"  # the step's FLOPs at peak (null without a peak)
    MFU: Final = "mfu"  # IDEAL_NS over WINDOW_NS
    SOURCE: Final = "flops_source"  # trace, shapes, trace+shapes; null without math


MFU_STEPS_SCHEMA: Final = pl.Schema({
    MfuStepCol.STEP: pl.String(), MfuStepCol.NUMBER: pl.Int64(), MfuStepCol.STEADY: pl.Boolean(),
    MfuStepCol.WINDOW_NS: pl.Int64(), MfuStepCol.FLOPS: pl.Float64(), MfuStepCol.FLOP_PER_S: pl.Float64(),
    MfuStepCol.IDEAL_NS: pl.Int64(), MfuStepCol.MFU: pl.Float64(), MfuStepCol.SOURCE: pl.String(),
})


class MfuRegionCol:
    """Columns of ``MfuResult.regions``: one row per region name with matrix math, most FLOPs first."""

    REGION: Final = "region"
    KIND: Final = "kind"  # REGION_ANNOTATION or REGION_MODULE
    INSTANCES: Final = "instances"
    TIME_NS: Final = "time_ns"
    TIME_BASIS: Final = "time_basis"  # DEVICE_SPAN or HOST_SPAN
    FLOPS: Final = "flops"
    FLOP_PER_S: Final = "flop_per_s"
    IDEAL_NS: Final = "ideal_ns"
    MFU: Final = "mfu"
    SOURCE: Final = "flops_source"


MFU_REGIONS_SCHEMA: Final = pl.Schema({
    MfuRegionCol.REGION: pl.String(), MfuRegionCol.KIND: pl.String(), MfuRegionCol.INSTANCES: pl.Int64(),
    MfuRegionCol.TIME_NS: pl.Int64(), MfuRegionCol.TIME_BASIS: pl.String(), MfuRegionCol.FLOPS: pl.Float64(),
    MfuRegionCol.FLOP_PER_S: pl.Float64(), MfuRegionCol.IDEAL_NS: pl.Int64(), MfuRegionCol.MFU: pl.Float64(),
    MfuRegionCol.SOURCE: pl.String(),
})


@dataclass(frozen=True)
class MfuResult:
    """MFU of each step and each region. ``steady_mfu`` and ``steady_flops_per_step`` are over the
    steady steps together (their ideal time over their windows); ``peak_note`` says why MFU is
    null, or that the peaks were scaled to a partition of the device."""

    device_name: str | None
    peak_name: str | None
    peak_note: str | None
    steps: pl.DataFrame
    regions: pl.DataFrame
    steady_mfu: float | None
    steady_flops_per_step: float | None
    #: Where the FLOPs come from over the whole trace: trace, shapes, trace+shapes; null without math.
    flops_source: str | None
    ops: pl.DataFrame


def measure_mfu(trace: Trace, steps_result: StepsResult, device: str | None = None) -> MfuResult:
    counted = counted_ops(trace, device)
    steps_table = _steps(trace, steps_result, counted)
    steady = steps_table.filter(pl.col(MfuStepCol.STEADY) & (pl.col(MfuStepCol.WINDOW_NS) > 0))
    steady_mfu = None
    steady_flops = None
    if steady.height:
        steady_flops = float(steady.select(pl.col(MfuStepCol.FLOPS).mean()).item())
        if counted.peaks is not None and steady.get_column(MfuStepCol.IDEAL_NS).null_count() < steady.height:
            # (from each step's MFU, not its ideal time rounded to whole ns)
            ideal, window = steady.select((pl.col(MfuStepCol.MFU) * pl.col(MfuStepCol.WINDOW_NS)).sum(),
                                          pl.col(MfuStepCol.WINDOW_NS).sum()).row(0)
            steady_mfu = float(ideal) / float(window)
    marker_ids = set(step_windows(trace, steps_result).get_column(WindowCol.STEP_ID).drop_nulls().to_list())
    return MfuResult(counted.device_name, counted.peaks.name if counted.peaks else None, counted.peak_note,
                     steps_table, _regions(trace, counted, marker_ids), steady_mfu, steady_flops,
                     flop_source(counted.ops), counted.ops)


def _steps(trace: Trace, steps_result: StepsResult, counted: MfuOps) -> pl.DataFrame:
    w = step_windows(trace, steps_result)
    if w.height == 0:
        return pl.DataFrame(schema=MFU_STEPS_SCHEMA)
    flops, ideal, sources = window_sums(counted.ops, w.get_column(WindowCol.PID).to_numpy(),
                                        w.get_column(WindowCol.WINDOW_START).to_numpy(),
                                        w.get_column(WindowCol.WINDOW_END).to_numpy())
    windows = w.get_column(WindowCol.WINDOW).to_list()
    return pl.DataFrame({
        MfuStepCol.STEP: w.get_column(WindowCol.STEP), MfuStepCol.NUMBER: w.get_column(WindowCol.NUMBER),
        MfuStepCol.STEADY: w.get_column(WindowCol.STEADY), MfuStepCol.WINDOW_NS: windows,
        MfuStepCol.FLOPS: flops,
        MfuStepCol.FLOP_PER_S: [f / n * 1e9 if n else None for f, n in zip(flops, windows, strict=True)],
        MfuStepCol.IDEAL_NS: [round(i) if i is not None else None for i in ideal],
        MfuStepCol.MFU: [i / n if i is not None and n else None for i, n in zip(ideal, windows, strict=True)],
        MfuStepCol.SOURCE: sources,
    }, schema=MFU_STEPS_SCHEMA)


def _regions(trace: Trace, counted: MfuOps, step_ids: set[int]) -> pl.DataFrame:
    s = trace.slices
    candidates = s.filter(
        ((pl.col(Col.KIND) == Kind.ANNOTATION.value)
         | ((pl.col(Col.KIND) == Kind.PYTHON.value) & pl.col(Col.NAME).cast(pl.String).str.starts_with(MODULE_PREFIX)))
        & ~pl.col(Col.ID).is_in(list(step_ids))
    ).select(Col.ID, pl.col(Col.NAME).cast(pl.String), pl.col(Col.KIND).cast(pl.String), Col.DUR)
    if candidates.height == 0 or counted.ops.height == 0:
        return pl.DataFrame(schema=MFU_REGIONS_SCHEMA)
    marked = np.zeros(s.height, dtype=np.bool_)
    marked[candidates.get_column(Col.ID).to_numpy()] = True
    regions = candidates.rename({Col.ID: "region_id", Col.NAME: "region"})
    op_rows = _outermost_instances(trace, counted.ops.get_column(MfuOp.ID).to_numpy(), marked, regions)
    if op_rows.height == 0:
        return pl.DataFrame(schema=MFU_REGIONS_SCHEMA)
    if counted.on_gpu:
        gpu = s.filter(pl.col(Col.KIND).is_in([k.value for k in GPU_ACTIVITY_KINDS]) & pl.col(Col.LAUNCH).is_not_null()
                       ).select(Col.LAUNCH, Col.TS, (pl.col(Col.TS) + pl.col(Col.DUR)).alias("end"))
        spans = (_outermost_instances(trace, gpu.get_column(Col.LAUNCH).to_numpy(), marked, regions)
                 .join(gpu.with_row_index("row").with_columns(pl.col("row").cast(pl.Int64)), on="row")
                 .group_by("region_id").agg((pl.col("end").max() - pl.col(Col.TS).min()).alias("time_ns")))
    else:
        spans = regions.select("region_id", pl.col(Col.DUR).alias("time_ns"))
    ops = counted.ops.with_row_index("row").with_columns(pl.col("row").cast(pl.Int64))
    # Sorted first: float sums in one order on every run (a join's output order is not fixed).
    by_ops = op_rows.join(ops, on="row").sort(["region", "row"]).group_by("region", maintain_order=True).agg(
        pl.col(MfuOp.FLOPS).sum().alias(MfuRegionCol.FLOPS),
        pl.when(pl.col(MfuOp.IDEAL_NS).is_not_null().any()).then(pl.col(MfuOp.IDEAL_NS).sum()).alias("ideal"),
        pl.col(MfuOp.SOURCE).unique().sort(descending=True).str.join("+").alias(MfuRegionCol.SOURCE))
    by_instances = (op_rows.select("region_id").unique()
                    .join(regions.select("region_id", "region", Col.KIND), on="region_id")
                    .join(spans, on="region_id", how="left")
                    .group_by("region").agg(pl.len().cast(pl.Int64).alias(MfuRegionCol.INSTANCES),
                                            pl.col("time_ns").fill_null(0).sum().cast(pl.Int64),
                                            pl.col(Col.KIND).first()))
    time, ideal = pl.col(MfuRegionCol.TIME_NS), pl.col("ideal")
    return (by_ops.join(by_instances, on="region")
            .select(
                pl.col("region").alias(MfuRegionCol.REGION),
                pl.when(pl.col(Col.KIND) == Kind.PYTHON.value).then(pl.lit(REGION_MODULE))
                .otherwise(pl.lit(REGION_ANNOTATION)).alias(MfuRegionCol.KIND),
                MfuRegionCol.INSTANCES, time.alias(MfuRegionCol.TIME_NS),
                pl.lit(DEVICE_SPAN if counted.on_gpu else HOST_SPAN).alias(MfuRegionCol.TIME_BASIS),
                MfuRegionCol.FLOPS,
                pl.when(time > 0).then(pl.col(MfuRegionCol.FLOPS) / time * 1e9).alias(MfuRegionCol.FLOP_PER_S),
                ideal.round().cast(pl.Int64).alias(MfuRegionCol.IDEAL_NS),
                pl.when(time > 0).then(ideal / time).alias(MfuRegionCol.MFU),
                MfuRegionCol.SOURCE)
            .cast(MFU_REGIONS_SCHEMA)
            .sort([MfuRegionCol.FLOPS, MfuRegionCol.REGION], descending=[True, False]))


def _outermost_instances(trace: Trace, rows: npt.NDArray[np.int64], marked: npt.NDArray[np.bool_],
                         regions: pl.DataFrame) -> pl.DataFrame:
    """Per row (its index in ``rows``), the region instances above it on its stack: of several
    instances of one name (a range nested in itself), the outermost, so nothing counts twice."""
    row, region_id, level = ancestors(parent_of(trace), rows, marked)
    return (pl.DataFrame({"row": row, "region_id": region_id, "level": level})
            .join(regions.select("region_id", "region"), on="region_id")
            .sort("level").group_by(["row", "region"]).last()
            .select("row", "region_id", "region"))
