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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import polars as pl

from tracewhy.analyses.mfu import MfuOp, MfuOps, counted_ops, flop_source, window_sums
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
    ).select(Col.ID, pl.col(Col.NAME).cast(pl.String), Col.KIND, Col.DUR)
    if candidates.height == 0 or counted.ops.height == 0:
        return pl.DataFrame(schema=MFU_REGIONS_SCHEMA)
    region_name = dict(zip(candidates.get_column(Col.ID).to_list(), candidates.get_column(Col.NAME).to_list(),
                           strict=True))
    parents: dict[int, int] = trace.__dict__["_mfu_parents"]  # filled by counted_ops
    memo: dict[int, tuple[int, ...]] = {}

    def above(host_id: int) -> tuple[int, ...]:
        """Region instances at or above a host slice, each name once (the outermost instance)."""
        chain: list[int] = []
        cur: int | None = host_id
        while cur is not None and cur not in memo:
            chain.append(cur)
            cur = parents.get(cur)
        found = memo[cur] if cur is not None else ()
        for node in reversed(chain):
            name = region_name.get(node)
            if name is not None and all(region_name[r] != name for r in found):
                found = (*found, node)
            memo[node] = found
        return found

    per_instance_ops: dict[int, list[int]] = {}
    for i, op_id in enumerate(counted.ops.get_column(MfuOp.ID).to_list()):
        for inst in above(op_id):
            per_instance_ops.setdefault(inst, []).append(i)
    times = _device_spans(trace, above, per_instance_ops) if counted.on_gpu else {
        inst: int(d) for inst, d in zip(candidates.get_column(Col.ID).to_list(),
                                        candidates.get_column(Col.DUR).to_list(), strict=True)
        if inst in per_instance_ops}
    kinds = dict(zip(candidates.get_column(Col.ID).to_list(), candidates.get_column(Col.KIND).cast(pl.String).to_list(),
                     strict=True))
    by_name: dict[str, tuple[str, list[int], list[int]]] = {}
    for inst, rows in per_instance_ops.items():
        kind, instances, op_rows = by_name.setdefault(region_name[inst], (
            REGION_MODULE if kinds[inst] == Kind.PYTHON.value else REGION_ANNOTATION, [], []))
        instances.append(inst)
        op_rows.extend(rows)
    out = []
    for name, (kind, instances, op_rows) in by_name.items():
        ops = counted.ops[sorted(set(op_rows))]
        total = float(ops.get_column(MfuOp.FLOPS).sum() or 0.0)
        known = ops.get_column(MfuOp.IDEAL_NS).drop_nulls()
        ideal = float(known.sum()) if known.len() else None
        time_ns = sum(times.get(i, 0) for i in instances)
        out.append({
            MfuRegionCol.REGION: name, MfuRegionCol.KIND: kind, MfuRegionCol.INSTANCES: len(instances),
            MfuRegionCol.TIME_NS: time_ns, MfuRegionCol.TIME_BASIS: DEVICE_SPAN if counted.on_gpu else HOST_SPAN,
            MfuRegionCol.FLOPS: total, MfuRegionCol.FLOP_PER_S: total / time_ns * 1e9 if time_ns else None,
            MfuRegionCol.IDEAL_NS: round(ideal) if ideal is not None else None,
            MfuRegionCol.MFU: ideal / time_ns if ideal is not None and time_ns else None,
            MfuRegionCol.SOURCE: flop_source(ops),
        })
    return (pl.DataFrame(out, schema=MFU_REGIONS_SCHEMA)
            .sort([MfuRegionCol.FLOPS, MfuRegionCol.REGION], descending=[True, False]))


def _device_spans(trace: Trace, above: Callable[[int], tuple[int, ...]],
                  instances: dict[int, list[int]]) -> dict[int, int]:
    """Per region instance, first start to last end of the device work launched under it."""
    gpu = trace.slices.filter(pl.col(Col.KIND).is_in([k.value for k in GPU_ACTIVITY_KINDS])
                              & pl.col(Col.LAUNCH).is_not_null()).select(Col.LAUNCH, Col.TS, Col.DUR)
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    ts = gpu.get_column(Col.TS).to_list()
    ends = (gpu.get_column(Col.TS) + gpu.get_column(Col.DUR)).to_list()
    for li, t0, t1 in zip(gpu.get_column(Col.LAUNCH).to_list(), ts, ends, strict=True):
        for inst in above(li):
            if inst in instances:
                lo[inst] = min(lo.get(inst, t0), t0)
                hi[inst] = max(hi.get(inst, t1), t1)
    return {inst: hi[inst] - lo[inst] for inst in lo}
