"""A first roofline for a PyTorch trace without ncu: ops placed by their recorded shapes.

For every CPU op instance that launched GPU work and whose shapes are modelled
(``analyses.shapes``), its FLOPs and minimum bytes over its GPU time give achieved FLOP/s and
bytes/s. Against the trace GPU's peaks (``analyses.peaks``) that yields a bound (memory or
compute, by arithmetic intensity against the ridge point; latency for short ops far below
their roof), the fraction of the roof reached, and the time lost to it. GPU time is the op's
own device work (kernels, copies, memsets launched with the op innermost on the stack), so
nested ops are never counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import polars as pl

from tracewhy.analyses import roofline_thresholds as th
from tracewhy.analyses.peaks import DevicePeaks, lookup_peaks
from tracewhy.analyses.roofline import COMPUTE_BOUND, LATENCY_BOUND, MEMORY_BOUND
from tracewhy.analyses.shapes import GEMM, OpInputs, estimate
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, DCol, Kind, OCol
from tracewhy.model.trace import Trace

#: Newer record_shapes traces carry scalar argument values ("Concrete Inputs"); a model
#: column for them is looked up by this name when present, so causal flags and conv strides
#: are used as soon as the reader keeps them.
CONCRETE_INPUTS_COLUMN: Final = getattr(OCol, "CONCRETE_INPUTS", "concrete_inputs")
#: fp32 GEMM kernels whose names say TF32 ran on tensor cores (cuBLAS/CUTLASS naming).
_TF32_HINTS: Final = ("tf32", "s1688", "s16816tf32")


@dataclass(frozen=True)
class OpRooflineOptions:
    device: str | None = None  # GPU name for the peak table when the trace does not name one


@dataclass(frozen=True)
class OpRooflineResult:
    """Shape-based roofline per op instance (``instances``) and per op name and shapes (``ops``).

    ``ops`` is sorted by GPU time; ``lost_ns`` (GPU time minus the time the op would take at
    its roof) ranks the ops furthest below their roof. ``covered_ns`` of ``gpu_time_ns`` is
    the device time whose op has an estimate.
    """

    device_name: str | None
    peaks: DevicePeaks | None
    instances: pl.DataFrame
    ops: pl.DataFrame
    gpu_time_ns: int
    covered_ns: int
    notes: tuple[str, ...]


_INSTANCE_SCHEMA: Final = {
    Col.ID: pl.Int64, Col.NAME: pl.String, "input_dims": pl.String, "category": pl.String,
    "dtype": pl.String, "precision": pl.String, "gpu_ns": pl.Int64, "kernel": pl.String,
    "flops": pl.Float64, "min_bytes": pl.Float64, "arithmetic_intensity": pl.Float64,
    "flop_per_s": pl.Float64, "bytes_per_s": pl.Float64, "peak_flop_per_s": pl.Float64,
    "peak_bytes_per_s": pl.Float64, "ridge_point": pl.Float64, "roof_flop_per_s": pl.Float64,
    "roof_fraction": pl.Float64, "roof_ns": pl.Float64, "lost_ns": pl.Float64, "bound": pl.String,
    "params": pl.String, "note": pl.String,
}


def _device_peaks(trace: Trace, options: OpRooflineOptions) -> tuple[str | None, DevicePeaks | None]:
    d = trace.devices
    name = options.device
    sms = None
    if name is None and d.height:
        first = d.filter(pl.col(DCol.NAME).is_not_null()).head(1)
        if first.height:
            name = first.get_column(DCol.NAME)[0]
            sms = first.get_column(DCol.NUM_SMS)[0]
    return name, lookup_peaks(name, int(sms) if sms is not None else None)


def _precision(cost_precision: str, category: str, kernel: str | None, peaks: DevicePeaks) -> str:
    if category == GEMM and cost_precision == "fp32" and kernel and any(h in kernel.lower() for h in _TF32_HINTS):
        return "tf32_tensor"
    if cost_precision == "fp64" and category == GEMM and peaks.flops("fp64_tensor"):
        return "fp64_tensor"  # DGEMM runs on FP64 tensor cores where they exist (A100 onward)
    return cost_precision


def _place(cost_flops: float, cost_bytes: float, gpu_ns: int, peak_flops: float | None,
           peak_bw: float | None) -> dict[str, Any]:
    seconds = gpu_ns / 1e9
    ai = cost_flops / cost_bytes if cost_bytes else None
    out: dict[str, Any] = {
        "arithmetic_intensity": ai,
        "flop_per_s": cost_flops / seconds if seconds else None,
        "bytes_per_s": cost_bytes / seconds if seconds else None,
        "peak_flop_per_s": peak_flops, "peak_bytes_per_s": peak_bw,
        "ridge_point": None, "roof_flop_per_s": None, "roof_fraction": None, "roof_ns": None,
        "lost_ns": None, "bound": None,
    }
    if not peak_bw or not seconds:
        return out
    memory_ns = cost_bytes / peak_bw * 1e9
    compute_ns = cost_flops / peak_flops * 1e9 if peak_flops and cost_flops else 0.0
    roof_ns = max(memory_ns, compute_ns)
    bound = COMPUTE_BOUND if compute_ns > memory_ns else MEMORY_BOUND
    fraction = roof_ns / gpu_ns if gpu_ns else None
    if (fraction is not None and gpu_ns < th.SHAPE_LATENCY_MAX_NS
            and fraction < th.SHAPE_LATENCY_EFFICIENCY):
        bound = LATENCY_BOUND
    out.update(
        ridge_point=peak_flops / peak_bw if peak_flops else None,
        roof_flop_per_s=(min(peak_flops, ai * peak_bw) if peak_flops and ai is not None else None),
        roof_fraction=fraction, roof_ns=roof_ns, lost_ns=max(gpu_ns - roof_ns, 0.0), bound=bound,
    )
    return out


def op_roofline(trace: Trace, options: OpRooflineOptions = OpRooflineOptions()) -> OpRooflineResult:
    trace.require_whole()
    device, peaks = _device_peaks(trace, options)
    s = trace.slices
    gpu = s.filter(pl.col(Col.KIND).is_in([k.value for k in GPU_ACTIVITY_KINDS]))
    gpu_time = int(gpu.get_column(Col.DUR).sum() or 0)
    kernels = gpu.filter(pl.col(Col.KIND) == Kind.KERNEL.value)
    per_op = (
        gpu.filter(pl.col(Col.OP).is_not_null())
        .group_by(Col.OP)
        .agg(pl.col(Col.DUR).sum().alias("gpu_ns"))
    )
    longest_kernel = (
        kernels.filter(pl.col(Col.OP).is_not_null())
        .sort(Col.DUR, descending=True)
        .group_by(Col.OP, maintain_order=True)
        .agg(pl.col(Col.NAME).first().cast(pl.String).alias("kernel"))
    )
    attrs = trace.op_attrs
    concrete = [CONCRETE_INPUTS_COLUMN] if CONCRETE_INPUTS_COLUMN in attrs.columns else []
    table = (
        per_op.join(longest_kernel, on=Col.OP, how="left")
        .join(s.select(Col.ID, pl.col(Col.NAME).cast(pl.String)), left_on=Col.OP, right_on=Col.ID)
        .join(attrs.select(Col.ID, OCol.INPUT_DIMS, OCol.INPUT_TYPES, *concrete),
              left_on=Col.OP, right_on=Col.ID, how="left")
        .sort(Col.OP)
    )
    rows: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    for r in table.iter_rows(named=True):
        inputs = OpInputs.parse(r[OCol.INPUT_DIMS], r[OCol.INPUT_TYPES], r.get(CONCRETE_INPUTS_COLUMN))
        cost = estimate(r[Col.NAME], inputs, kernel_name=r["kernel"]) if inputs else None
        if cost is None:
            skipped[r[Col.NAME]] = skipped.get(r[Col.NAME], 0) + r["gpu_ns"]
            continue
        precision = _precision(cost.precision, cost.category, r["kernel"], peaks) if peaks else cost.precision
        placed = _place(cost.flops, cost.min_bytes, r["gpu_ns"],
                        peaks.flops(precision) if peaks else None, peaks.dram_bytes_per_s if peaks else None)
        rows.append({
            Col.ID: r[Col.OP], Col.NAME: r[Col.NAME], "input_dims": _compact(r[OCol.INPUT_DIMS]),
            "category": cost.category, "dtype": cost.dtype, "precision": precision,
            "gpu_ns": r["gpu_ns"], "kernel": r["kernel"], "flops": cost.flops,
            "min_bytes": cost.min_bytes, **placed,
            "params": _compact_params(cost.params), "note": cost.note,
        })
    instances = pl.DataFrame(rows, schema=_INSTANCE_SCHEMA, strict=False)
    covered = int(instances.get_column("gpu_ns").sum() or 0)
    notes = _notes(trace, device, peaks, skipped, covered, gpu_time, instances)
    return OpRooflineResult(device, peaks, instances, _by_op(instances), gpu_time, covered, notes)


def _compact(dims_json: str | None) -> str | None:
    import json

    if dims_json is None:
        return None
    try:
        return json.dumps(json.loads(dims_json), separators=(",", ":"))
    except json.JSONDecodeError:
        return dims_json


def _compact_params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items() if v is not None)


def _by_op(instances: pl.DataFrame) -> pl.DataFrame:
    """Instances grouped by op name and shapes: totals, and the bound that takes most time."""
    keys = [Col.NAME, "input_dims", "dtype"]
    main_bound = (
        instances.group_by(*keys, "bound").agg(pl.col("gpu_ns").sum().alias("bound_ns"))
        .sort([*keys, "bound_ns"], descending=[False, False, False, True], nulls_last=True)
        .group_by(keys, maintain_order=True).first().select(*keys, "bound")
    )
    grouped = instances.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("calls"),
        pl.col("category").first(), pl.col("precision").first(),
        pl.col("kernel").first(), pl.col("params").first(), pl.col("note").first(),
        pl.col("gpu_ns").sum().alias("gpu_ns"),
        pl.col("flops").sum().alias("flops"), pl.col("min_bytes").sum().alias("min_bytes"),
        pl.col("roof_ns").sum().alias("roof_ns"), pl.col("lost_ns").sum().alias("lost_ns"),
        pl.col("peak_flop_per_s").first(), pl.col("peak_bytes_per_s").first(),
        pl.col("ridge_point").first(), pl.col("arithmetic_intensity").first(),
    )
    seconds = pl.col("gpu_ns") / 1e9
    return (
        grouped.join(main_bound, on=keys, how="left")
        .with_columns(
            (pl.col("flops") / seconds).alias("flop_per_s"),
            (pl.col("min_bytes") / seconds).alias("bytes_per_s"),
            (pl.col("roof_ns") / pl.col("gpu_ns")).alias("roof_fraction"),
        )
        .sort(["gpu_ns", Col.NAME, "input_dims"], descending=[True, False, False], nulls_last=True)
    )


def _notes(trace: Trace, device: str | None, peaks: DevicePeaks | None, skipped: dict[str, int],
           covered: int, gpu_time: int, instances: pl.DataFrame) -> tuple[str, ...]:
    notes: list[str] = []
    if trace.op_attrs.get_column(OCol.INPUT_DIMS).null_count() == trace.op_attrs.height:
        notes.append("the trace has no input shapes: capture with torch.profiler.profile(record_shapes=True)")
    if peaks is None:
        notes.append(f"no peaks for device {device!r}: pass --device NAME (one of the peak table's GPUs); "
                     "FLOP/s and bytes/s are shown without a verdict")
    else:
        notes.append(f"peaks: {peaks.name} ({peaks.source})"
                     + (f"; {peaks.scaled_note}" if peaks.scaled_note else "")
                     + ". Datasheet peaks at boost clock; a GPU running lower clocks has a lower roof.")
    if gpu_time:
        notes.append(f"estimates cover {covered / gpu_time:.0%} of GPU time; the rest is launched "
                     "outside any op (e.g. before the trace window) or by ops without a model")
    top_skipped = sorted(skipped.items(), key=lambda kv: -kv[1])[:3]
    if top_skipped:
        notes.append("not modelled (largest GPU time): " + ", ".join(f"{n}" for n, _ in top_skipped))
    assumed = instances.filter(pl.col("note").is_not_null()).get_column("note").unique().sort().to_list()
    notes.extend(f"assumption: {a}" for a in assumed)
    return tuple(notes)
