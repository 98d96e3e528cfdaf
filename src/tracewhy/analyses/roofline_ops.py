"""A first roofline for a PyTorch trace without ncu: ops placed by their recorded shapes.

For every CPU op instance that launched GPU work and whose shapes are modelled
(``analyses.shapes``), its FLOPs and minimum bytes over its GPU time give achieved FLOP/s and
bytes/s. Against the trace GPU's peaks (``analyses.peaks``) that yields the time the op would
take at its compute and at its memory roof, the fraction of the roof reached, and the time
lost to it (``findings.roofline`` names the bound). GPU time is the op's own device work
(kernels, copies, memsets launched with the op innermost on the stack), so nested ops are
never counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import polars as pl

from tracewhy.analyses.op_inputs import OpInputs
from tracewhy.analyses.peaks import DevicePeaks, lookup_peaks
from tracewhy.analyses.shapes import GEMM, estimate
from tracewhy.analyses.stats import whole_ns
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, DeviceCol, Kind, OpAttrCol
from tracewhy.model.trace import Trace

#: Newer record_shapes traces carry scalar argument values ("Concrete Inputs"); a model
#: column for them is looked up by this name when present, so causal flags and conv strides
#: are used as soon as the reader keeps them.
CONCRETE_INPUTS_COLUMN: Final = getattr(OpAttrCol, "CONCRETE_INPUTS", "concrete_inputs")
#: fp32 GEMM kernels whose names say TF32 ran on tensor cores (cuBLAS/CUTLASS naming).
_TF32_HINTS: Final = ("tf32", "s1688", "s16816tf32")


class OpRoofCol:
    """Columns of the instance and op tables that other modules read (beside ``Col.NAME``)."""

    INPUT_DIMS: Final = "input_dims"
    DTYPE: Final = "dtype"
    GPU_NS: Final = "gpu_ns"
    ROOF_NS: Final = "roof_ns"  # the longer of MEMORY_NS and COMPUTE_NS: the op's time at its roof
    MEMORY_NS: Final = "memory_ns"  # minimum bytes at peak DRAM bandwidth
    COMPUTE_NS: Final = "compute_ns"  # FLOPs at peak FLOP/s of the op's precision (0 without a peak)
    ROOF_FRACTION: Final = "roof_fraction"
    ARITHMETIC_INTENSITY: Final = "arithmetic_intensity"
    LOST_NS: Final = "lost_ns"
    NOTE: Final = "note"


@dataclass(frozen=True)
class OpRooflineOptions:
    device: str | None = None  # GPU name for the peak table when the trace does not name one


@dataclass(frozen=True)
class OpRooflineMeasures:
    """Shape-based roofline per op instance (``instances``) and per op name and shapes (``ops``).

    ``ops`` is sorted by GPU time; ``lost_ns`` (GPU time minus the time the op would take at
    its roof) ranks the ops furthest below their roof. ``covered_ns`` of ``gpu_time_ns`` is
    the device time whose op has an estimate; ``unmodelled_ns`` the GPU time of each op name
    that has none. ``has_input_shapes`` is false when the trace was captured without them.
    """

    device_name: str | None
    peaks: DevicePeaks | None
    instances: pl.DataFrame
    ops: pl.DataFrame
    gpu_time_ns: int
    covered_ns: int
    has_input_shapes: bool
    unmodelled_ns: dict[str, int]


#: What one row of ``ops`` stands for: an op name called with the same shapes and dtype.
OP_KEYS: Final = (Col.NAME, OpRoofCol.INPUT_DIMS, OpRoofCol.DTYPE)

_INSTANCE_SCHEMA: Final = {
    Col.ID: pl.Int64, Col.NAME: pl.String, "input_dims": pl.String, "category": pl.String,
    "dtype": pl.String, "precision": pl.String, "gpu_ns": pl.Int64, "kernel": pl.String,
    "flops": pl.Float64, "min_bytes": pl.Float64, "arithmetic_intensity": pl.Float64,
    "flop_per_s": pl.Float64, "bytes_per_s": pl.Float64, "peak_flop_per_s": pl.Float64,
    "peak_bytes_per_s": pl.Float64, "ridge_point": pl.Float64, "roof_flop_per_s": pl.Float64,
    "roof_fraction": pl.Float64, "roof_ns": pl.Float64, "lost_ns": pl.Float64,
    OpRoofCol.MEMORY_NS: pl.Float64, OpRoofCol.COMPUTE_NS: pl.Float64, "params": pl.String, "note": pl.String,
}


def device_peaks(trace: Trace, options: OpRooflineOptions) -> tuple[str | None, DevicePeaks | None]:
    d = trace.devices
    name = options.device
    sms = None
    if name is None and d.height:
        first = d.filter(pl.col(DeviceCol.NAME).is_not_null()).head(1)
        if first.height:
            name = first.get_column(DeviceCol.NAME)[0]
            sms = first.get_column(DeviceCol.NUM_SMS)[0]
    return name, lookup_peaks(name, int(sms) if sms is not None else None)


def op_precision(cost_precision: str, category: str, kernel: str | None, peaks: DevicePeaks) -> str:
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
        "lost_ns": None, OpRoofCol.MEMORY_NS: None, OpRoofCol.COMPUTE_NS: None,
    }
    if not peak_bw or not seconds:
        return out
    memory_ns = cost_bytes / peak_bw * 1e9
    compute_ns = cost_flops / peak_flops * 1e9 if peak_flops and cost_flops else 0.0
    roof_ns = max(memory_ns, compute_ns)
    out.update({
        "ridge_point": peak_flops / peak_bw if peak_flops else None,
        "roof_flop_per_s": (min(peak_flops, ai * peak_bw) if peak_flops and ai is not None else None),
        OpRoofCol.ROOF_FRACTION: roof_ns / gpu_ns if gpu_ns else None, OpRoofCol.ROOF_NS: roof_ns,
        OpRoofCol.LOST_NS: max(gpu_ns - roof_ns, 0.0), OpRoofCol.MEMORY_NS: memory_ns, OpRoofCol.COMPUTE_NS: compute_ns,
    })
    return out


def measure_op_roofline(trace: Trace, options: OpRooflineOptions = OpRooflineOptions()) -> OpRooflineMeasures:
    trace.require_whole()
    device, peaks = device_peaks(trace, options)
    s = trace.slices
    gpu = s.filter(pl.col(Col.KIND).is_in([k.value for k in GPU_ACTIVITY_KINDS]))
    gpu_time = int(gpu.get_column(Col.DUR).sum() or 0)
    kernels = gpu.filter(pl.col(Col.KIND) == Kind.KERNEL.value)
    per_op = (
        gpu.filter(pl.col(Col.OP).is_not_null())
        .group_by(Col.OP)
        .agg(pl.col(Col.DUR).sum().alias("gpu_ns"))
    )
    # Stable: of kernels equally long, the first launched names the op on every run (an unstable
    # sort picked either, and the precision read from the name, and the op's bound, with it).
    longest_kernel = (
        kernels.filter(pl.col(Col.OP).is_not_null())
        .sort(Col.DUR, descending=True, maintain_order=True)
        .group_by(Col.OP, maintain_order=True)
        .agg(pl.col(Col.NAME).first().cast(pl.String).alias("kernel"))
    )
    attrs = trace.op_attrs
    concrete = [CONCRETE_INPUTS_COLUMN] if CONCRETE_INPUTS_COLUMN in attrs.columns else []
    table = (
        per_op.join(longest_kernel, on=Col.OP, how="left")
        .join(s.select(Col.ID, pl.col(Col.NAME).cast(pl.String)), left_on=Col.OP, right_on=Col.ID)
        .join(attrs.select(Col.ID, OpAttrCol.INPUT_DIMS, OpAttrCol.INPUT_TYPES, *concrete),
              left_on=Col.OP, right_on=Col.ID, how="left")
        .sort(Col.OP)
    )
    rows: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    for r in table.iter_rows(named=True):
        inputs = OpInputs.parse(r[OpAttrCol.INPUT_DIMS], r[OpAttrCol.INPUT_TYPES], r.get(CONCRETE_INPUTS_COLUMN))
        cost = estimate(r[Col.NAME], inputs, kernel_name=r["kernel"]) if inputs else None
        if cost is None:
            skipped[r[Col.NAME]] = skipped.get(r[Col.NAME], 0) + r["gpu_ns"]
            continue
        precision = op_precision(cost.precision, cost.category, r["kernel"], peaks) if peaks else cost.precision
        placed = _place(cost.flops, cost.min_bytes, r["gpu_ns"],
                        peaks.flops(precision) if peaks else None, peaks.dram_bytes_per_s if peaks else None)
        rows.append({
            Col.ID: r[Col.OP], Col.NAME: r[Col.NAME], "input_dims": _compact(r[OpAttrCol.INPUT_DIMS]),
            "category": cost.category, "dtype": cost.dtype, "precision": precision,
            "gpu_ns": r["gpu_ns"], "kernel": r["kernel"], "flops": cost.flops,
            "min_bytes": cost.min_bytes, **placed,
            "params": _compact_params(cost.params), "note": cost.note,
        })
    instances = pl.DataFrame(rows, schema=_INSTANCE_SCHEMA, strict=False)
    covered = int(instances.get_column("gpu_ns").sum() or 0)
    has_shapes = trace.op_attrs.get_column(OpAttrCol.INPUT_DIMS).null_count() < trace.op_attrs.height
    return OpRooflineMeasures(device, peaks, instances, _by_op(instances), gpu_time, covered, has_shapes, skipped)


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
    """Instances grouped by op name and shapes: totals, and rates over the group's GPU time."""
    grouped = instances.group_by(OP_KEYS).agg(
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
        grouped.with_columns(
            (pl.col("flops") / seconds).alias("flop_per_s"),
            (pl.col("min_bytes") / seconds).alias("bytes_per_s"),
            (pl.col("roof_ns") / pl.col("gpu_ns")).alias("roof_fraction"),
        )
        # Times at the roof are estimates in fractions of a nanosecond: whole ones once summed.
        .with_columns(whole_ns(pl.col("roof_ns")), whole_ns(pl.col("lost_ns")))
        # Every key of the group, so that groups apart only in dtype come in one order on every run.
        .sort(["gpu_ns", Col.NAME, "input_dims", OpRoofCol.DTYPE], descending=[True, False, False, False],
              nulls_last=True)
    )
