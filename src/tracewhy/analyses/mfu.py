"""Model FLOPs utilization: the matrix math (GEMMs, convolutions, attention) each op, step and
annotated region does, over its time, against the device's peak for the precision in use.

An op's FLOPs are the trace's own ``flops`` field (``with_flops=True``: PyTorch's count for
conv2d, mm, addmm, bmm, baddbmm) where it has one, else the shape formulas of
``analyses.shapes`` (which add attention, linear, matmul and convolution backward). Ops nest
(``aten::linear`` holds ``aten::addmm``; ``scaled_dot_product_attention`` the kernel op under
it): only the outermost op doing matrix math counts, with the ``flops`` fields of the ops
inside it summed, so no math is counted twice. Elementwise FLOPs are left out: they run on the
vector units, and the matrix units' peak is what MFU is measured against.

The ideal time of an op is its FLOPs at the device's peak for its precision (bf16/fp16 tensor,
TF32 where the kernel's name says so, fp32, fp8); MFU of a stretch of time is the ideal time of
its ops over its length, which is FLOPs over (time x peak) when one precision is in use. On a
trace without GPU work there is no peak to hold the math against: FLOPs and FLOP/s are given,
MFU is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.op_families import (
    CONV_OPS,
    FLASH_BNHD,
    FLASH_BNHD_BWD,
    GEMM_OPS,
    SDPA_BHND,
    SDPA_BHND_BWD,
    base_name,
)
from tracewhy.analyses.op_inputs import OpInputs
from tracewhy.analyses.peaks import DevicePeaks
from tracewhy.analyses.roofline_ops import OpRooflineOptions, device_peaks, op_precision
from tracewhy.analyses.shapes import ATTENTION, CONVOLUTION, GEMM, estimate
from tracewhy.analyses.tensor_sizes import matmul_precision
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, Kind, OpAttrCol
from tracewhy.model.trace import Trace

#: What the matrix units run: the categories of ``analyses.shapes`` MFU counts.
MATH_CATEGORIES: Final = (GEMM, ATTENTION, CONVOLUTION)
#: Ops whose ``flops`` field counts matrix math (PyTorch also writes one on mul and add).
_MATH_OPS: Final = (GEMM_OPS | CONV_OPS | SDPA_BHND | SDPA_BHND_BWD | FLASH_BNHD | FLASH_BNHD_BWD
                    | {"convolution_backward"})
#: ``MfuOp.SOURCE`` values: where an op's FLOPs come from.
FROM_TRACE: Final = "trace"
FROM_SHAPES: Final = "shapes"


class MfuOp:
    """Columns of ``MfuMeasures.ops``: one row per op counted (outermost matrix math)."""

    ID: Final = Col.ID
    NAME: Final = Col.NAME
    PID: Final = Col.PID
    TID: Final = Col.TID
    TS: Final = Col.TS
    DUR: Final = Col.DUR
    FLOPS: Final = "flops"  # the count used: the trace's where it has one
    SOURCE: Final = "source"  # FROM_TRACE or FROM_SHAPES
    TRACE_FLOPS: Final = "trace_flops"  # sum of the flops fields at or under the op (null: none)
    SHAPES_FLOPS: Final = "shapes_flops"  # the shape formula's count (null: not modelled)
    DTYPE: Final = "dtype"
    PRECISION: Final = "precision"  # key into DevicePeaks.flop_per_s
    IDEAL_NS: Final = "ideal_ns"  # FLOPS at the peak of PRECISION (null without one)


OPS_SCHEMA: Final = pl.Schema({
    MfuOp.ID: pl.Int64(), MfuOp.NAME: pl.String(), MfuOp.PID: pl.Int64(), MfuOp.TID: pl.Int64(),
    MfuOp.TS: pl.Int64(), MfuOp.DUR: pl.Int64(), MfuOp.FLOPS: pl.Float64(), MfuOp.SOURCE: pl.String(),
    MfuOp.TRACE_FLOPS: pl.Float64(), MfuOp.SHAPES_FLOPS: pl.Float64(), MfuOp.DTYPE: pl.String(),
    MfuOp.PRECISION: pl.String(), MfuOp.IDEAL_NS: pl.Float64(),
})


@dataclass(frozen=True)
class MfuOps:
    """The counted ops and the peaks they are held against. ``peak_note`` says why there is no
    MFU (a CPU trace, a device the peak table lacks); None when there is one."""

    device_name: str | None
    peaks: DevicePeaks | None
    ops: pl.DataFrame
    #: The trace ran GPU work: times are the device's (regions: the span of the work they launched).
    on_gpu: bool
    peak_note: str | None


def counted_ops(trace: Trace, device: str | None = None) -> MfuOps:
    """The outermost ops doing matrix math, with their FLOPs, precision and ideal time."""
    trace.require_whole()
    name, peaks = device_peaks(trace, OpRooflineOptions(device=device))
    s = trace.slices
    on_gpu = trace.count(*GPU_ACTIVITY_KINDS) > 0
    attrs = trace.op_attrs.select(OpAttrCol.ID, OpAttrCol.INPUT_DIMS, OpAttrCol.INPUT_TYPES,
                                  OpAttrCol.CONCRETE_INPUTS, OpAttrCol.FLOPS)
    cpu_ops = s.filter(pl.col(Col.KIND) == Kind.CPU_OP.value)
    # Only names of matrix-math ops become strings and rows (a large trace has 1.5 M ops).
    names = [n for n in cpu_ops.get_column(Col.NAME).unique().cast(pl.String).to_list()
             if n is not None and base_name(n) in _MATH_OPS]
    ops = (cpu_ops.filter(pl.col(Col.NAME).is_in(names))
           .select(Col.ID, pl.col(Col.NAME).cast(pl.String), Col.PID, Col.TID, Col.TS, Col.DUR)
           .join(attrs, on=Col.ID, how="inner"))
    matrix: dict[int, dict[str, Any]] = {}
    for r in ops.iter_rows(named=True):
        inputs = OpInputs.parse(r[OpAttrCol.INPUT_DIMS], r[OpAttrCol.INPUT_TYPES], r[OpAttrCol.CONCRETE_INPUTS])
        cost = estimate(r[Col.NAME], inputs) if inputs else None
        if cost is not None and (cost.category not in MATH_CATEGORIES or not 0 < cost.flops < math.inf):
            cost = None  # (a hostile file's negative or absurd shapes give no count)
        flops_field = r[OpAttrCol.FLOPS] if r[OpAttrCol.FLOPS] and r[OpAttrCol.FLOPS] > 0 else None
        if cost is None and flops_field is None:
            continue
        dtype = cost.dtype if cost else _first_dtype(inputs)
        matrix[r[Col.ID]] = {**r, "cost": cost, "field": flops_field, "dtype": dtype}
    outermost = _outermost(trace, matrix)
    kernels = _longest_kernels(trace, outermost) if peaks else {}
    trace_sums: dict[int, float] = {}
    for op_id, top in outermost.items():
        if matrix[op_id]["field"] is not None:
            trace_sums[top] = trace_sums.get(top, 0.0) + float(matrix[op_id]["field"])
    rows = []
    for op_id in sorted(set(outermost.values())):
        r = matrix[op_id]
        cost = r["cost"]
        shapes_flops = cost.flops if cost else None
        trace_flops = trace_sums.get(op_id)
        flops = trace_flops if trace_flops is not None else float(shapes_flops or 0.0)
        precision = cost.precision if cost else matmul_precision(r["dtype"] or "")
        category = cost.category if cost else GEMM
        if peaks:
            precision = op_precision(precision, category, kernels.get(op_id), peaks)
        peak = peaks.flops(precision) if peaks else None
        rows.append({
            MfuOp.ID: op_id, MfuOp.NAME: r[Col.NAME], MfuOp.PID: r[Col.PID], MfuOp.TID: r[Col.TID],
            MfuOp.TS: r[Col.TS], MfuOp.DUR: r[Col.DUR], MfuOp.FLOPS: flops,
            MfuOp.SOURCE: FROM_TRACE if trace_flops is not None else FROM_SHAPES,
            MfuOp.TRACE_FLOPS: trace_flops, MfuOp.SHAPES_FLOPS: shapes_flops, MfuOp.DTYPE: r["dtype"],
            MfuOp.PRECISION: precision, MfuOp.IDEAL_NS: flops / peak * 1e9 if peak else None,
        })
    table = pl.DataFrame(rows, schema=OPS_SCHEMA).sort([MfuOp.TS, MfuOp.ID])
    return MfuOps(name, peaks, table, on_gpu, _peak_note(on_gpu, name, peaks))


def _first_dtype(inputs: OpInputs | None) -> str | None:
    tensors = inputs.tensors() if inputs else []
    return tensors[0][1] if tensors else None


def parent_of(trace: Trace) -> npt.NDArray[np.int64]:
    """Each slice's enclosing host slice (slice ids are row numbers; -1: none), kept once per Trace."""
    parents: npt.NDArray[np.int64] = trace.kept(
        "_parent_of", lambda: trace.slices.get_column(Col.PARENT).fill_null(-1).cast(pl.Int64).to_numpy())
    return parents


#: Deeper than any real stack: a parent chain this long is a cycle in a malformed file.
_MAX_DEPTH: Final = 10_000


def ancestors(parents: npt.NDArray[np.int64], rows: npt.NDArray[np.int64], marked: npt.NDArray[np.bool_]) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Every marked slice at or above each of ``rows`` on its stack: (index into rows, slice id,
    level), innermost first for each row (level 0 is the row itself)."""
    idx = np.arange(rows.size, dtype=np.int64)
    cur = rows.astype(np.int64)
    found: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int]] = []
    for level in range(_MAX_DEPTH):
        if cur.size == 0:
            break
        hit = marked[cur]
        found.append((idx[hit], cur[hit], level))
        cur = parents[cur]
        keep = cur >= 0
        idx, cur = idx[keep], cur[keep]
    if not found:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    return (np.concatenate([f[0] for f in found]), np.concatenate([f[1] for f in found]),
            np.concatenate([np.full(f[0].size, f[2], dtype=np.int64) for f in found]))


def _outermost(trace: Trace, matrix: dict[int, dict[str, Any]]) -> dict[int, int]:
    """Each math op and the outermost math op at or above it on its thread's stack."""
    ids = np.fromiter(matrix, dtype=np.int64, count=len(matrix))
    marked = np.zeros(trace.slices.height, dtype=np.bool_)
    marked[ids] = True
    row, above, level = ancestors(parent_of(trace), ids, marked)
    order = np.lexsort((level, row))  # by row, then outward: each row's last pair is its outermost
    row, above = row[order], above[order]
    last = np.r_[row[1:] != row[:-1], True] if row.size else np.zeros(0, dtype=np.bool_)
    top = ids.copy()
    top[row[last]] = above[last]
    return dict(zip(ids.tolist(), top.tolist(), strict=True))


def _longest_kernels(trace: Trace, outermost: dict[int, int]) -> dict[int, str]:
    """Per counted op, the name of the longest kernel launched under it (its TF32 hint)."""
    k = (trace.slices.filter((pl.col(Col.KIND) == Kind.KERNEL.value) & pl.col(Col.OP).is_not_null())
         .select(Col.OP, pl.col(Col.NAME).cast(pl.String), Col.DUR))
    counted = np.zeros(trace.slices.height, dtype=np.bool_)
    counted[np.fromiter(set(outermost.values()), dtype=np.int64)] = True
    row, op, _ = ancestors(parent_of(trace), k.get_column(Col.OP).to_numpy(), counted)
    # Stable: of kernels equally long, the first launched names the op on every run.
    best = (pl.DataFrame({"op": op, "row": row, "dur": k.get_column(Col.DUR).to_numpy()[row]})
            .sort("dur", descending=True, maintain_order=True).group_by("op", maintain_order=True).first())
    names = k.get_column(Col.NAME).gather(best.get_column("row")).to_list()
    return dict(zip(best.get_column("op").to_list(), names, strict=True))


def _peak_note(on_gpu: bool, device: str | None, peaks: DevicePeaks | None) -> str | None:
    if peaks is not None:
        return peaks.scaled_note
    if not on_gpu:
        return "no GPU work in the trace, so no GPU peak to measure MFU against (FLOPs and FLOP/s are given)"
    if device is None:
        return "the trace names no GPU: MFU needs its peak (roofline --device NAME names one)"
    return f"{device} is not in the peak table: MFU needs its peak"


def window_sums(ops: pl.DataFrame, pids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[
        list[float], list[float | None], list[str | None]]:
    """FLOPs, ideal time and FLOP source of the ops starting in each [start, end) of process ``pid``."""
    flops: list[float] = []
    ideal: list[float | None] = []
    sources: list[str | None] = []
    for pid, lo, hi in zip(pids.tolist(), starts.tolist(), ends.tolist(), strict=True):
        inside = ops.filter((pl.col(MfuOp.PID) == pid) & (pl.col(MfuOp.TS) >= lo) & (pl.col(MfuOp.TS) < hi))
        flops.append(float(inside.get_column(MfuOp.FLOPS).sum() or 0.0))
        known = inside.get_column(MfuOp.IDEAL_NS).drop_nulls()
        ideal.append(float(known.sum()) if known.len() else None)
        sources.append(flop_source(inside))
    return flops, ideal, sources


def flop_source(ops: pl.DataFrame) -> str | None:
    """Where a set of ops' FLOPs come from: "trace", "shapes", "trace+shapes", or None (no op)."""
    found = sorted(set(ops.get_column(MfuOp.SOURCE).to_list()), reverse=True)
    return "+".join(found) if found else None
