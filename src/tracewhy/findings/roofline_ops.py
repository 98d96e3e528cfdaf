"""Roofline verdicts of operators from their recorded input shapes: the roof each op instance's
time is set by (or latency, for a short op that reaches little of it), each op's main bound, and
what the estimate rests on. ``analyses.roofline_ops`` measures; this module judges, against
``findings.thresholds`` (the roofline section)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

from tracewhy.analyses.peaks import DevicePeaks
from tracewhy.analyses.roofline_ops import (
    OP_KEYS,
    OpRoofCol,
    OpRooflineMeasures,
    OpRooflineOptions,
    measure_op_roofline,
)
from tracewhy.findings import thresholds as th
from tracewhy.findings.roofline import COMPUTE_BOUND, LATENCY_BOUND, MEMORY_BOUND, VerdictCol
from tracewhy.model.ncu import NcuCol
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows


@dataclass(frozen=True)
class OpRooflineResult(Rows, rows="ops", key="name"):
    """Shape-based roofline per op instance (``instances``) and per op name and shapes (``ops``),
    each with its bound; ``notes`` say what the estimate rests on and what it leaves out.
    The other fields are ``analyses.roofline_ops.OpRooflineMeasures``'s."""

    device_name: str | None
    peaks: DevicePeaks | None
    instances: pl.DataFrame
    ops: pl.DataFrame
    gpu_time_ns: int
    covered_ns: int
    notes: tuple[str, ...]


def _op_bound() -> pl.Expr:
    """The roof an op's time is set by; latency when a short op reaches little of it."""
    return (
        pl.when(pl.col(OpRoofCol.ROOF_NS).is_null()).then(pl.lit(None, pl.String))
        .when((pl.col(OpRoofCol.GPU_NS) < th.SHAPE_LATENCY_MAX_NS)
              & (pl.col(OpRoofCol.ROOF_FRACTION) < th.SHAPE_LATENCY_EFFICIENCY)).then(pl.lit(LATENCY_BOUND))
        .when(pl.col(OpRoofCol.COMPUTE_NS) > pl.col(OpRoofCol.MEMORY_NS)).then(pl.lit(COMPUTE_BOUND))
        .otherwise(pl.lit(MEMORY_BOUND))
        .alias(VerdictCol.BOUND)
    )


def _with_column_after(frame: pl.DataFrame, column: pl.Expr, name: str, anchor: str) -> pl.DataFrame:
    """``frame`` with ``column`` (called ``name``) placed right after ``anchor``: the JSON keeps
    the column order it had when the analysis named the bound itself."""
    order = [c for c in frame.columns if c != name]
    order.insert(order.index(anchor) + 1, name)
    return frame.with_columns(column.alias(name)).select(order)


#: ``OpRooflineResult.ops``: one row per op name, input shapes and dtype, most GPU time first.
OP_ROOFLINE_SCHEMA: Final = pl.Schema({
    NcuCol.NAME: pl.String(), OpRoofCol.INPUT_DIMS: pl.String(), OpRoofCol.DTYPE: pl.String(), "calls": pl.Int64(),
    "category": pl.String(), "precision": pl.String(), "kernel": pl.String(), "params": pl.String(),
    OpRoofCol.NOTE: pl.String(),
    OpRoofCol.GPU_NS: pl.Int64(), "flops": pl.Float64(), "min_bytes": pl.Float64(), OpRoofCol.ROOF_NS: pl.Int64(),
    OpRoofCol.LOST_NS: pl.Int64(), "peak_flop_per_s": pl.Float64(), "peak_bytes_per_s": pl.Float64(),
    "ridge_point": pl.Float64(), OpRoofCol.ARITHMETIC_INTENSITY: pl.Float64(), VerdictCol.BOUND: pl.String(),
    "flop_per_s": pl.Float64(), "bytes_per_s": pl.Float64(), OpRoofCol.ROOF_FRACTION: pl.Float64(),
})


def judge_op_roofline(measures: OpRooflineMeasures) -> OpRooflineResult:
    """Each instance's bound, each op's main bound (the one that takes most of its time), notes."""
    instances = _with_column_after(measures.instances, _op_bound(), VerdictCol.BOUND, OpRoofCol.LOST_NS).drop(
        OpRoofCol.MEMORY_NS, OpRoofCol.COMPUTE_NS)
    keys = list(OP_KEYS)
    main_bound = (
        instances.group_by(*keys, VerdictCol.BOUND).agg(pl.col(OpRoofCol.GPU_NS).sum().alias("bound_ns"))
        # Two bounds of equal time: the first by name, the same on every run.
        .sort([*keys, "bound_ns", VerdictCol.BOUND], descending=[False, False, False, True, False], nulls_last=True)
        .group_by(keys, maintain_order=True).first().select(*keys, VerdictCol.BOUND)
    )
    ops = measures.ops.join(main_bound, on=keys, how="left")
    ops = _with_column_after(ops, pl.col(VerdictCol.BOUND), VerdictCol.BOUND, OpRoofCol.ARITHMETIC_INTENSITY)
    return OpRooflineResult(measures.device_name, measures.peaks, instances, ops, measures.gpu_time_ns,
                            measures.covered_ns, _op_notes(measures, instances))


def op_roofline(trace: Trace, options: OpRooflineOptions | None = None) -> OpRooflineResult:
    """Measure and judge the ops of one trace: what ``tracewhy roofline TRACE`` shows."""
    return judge_op_roofline(measure_op_roofline(trace, options or OpRooflineOptions()))


def _op_notes(measures: OpRooflineMeasures, instances: pl.DataFrame) -> tuple[str, ...]:
    notes: list[str] = []
    peaks, gpu_time = measures.peaks, measures.gpu_time_ns
    if not measures.has_input_shapes:
        notes.append("the trace has no input shapes: capture with torch.profiler.profile(record_shapes=True)")
    if peaks is None:
        notes.append(f"no peaks for device {measures.device_name!r}: pass --device NAME (one of the peak "
                     "table's GPUs); FLOP/s and bytes/s are shown without a verdict")
    else:
        notes.append(f"peaks: {peaks.name} ({peaks.source})"
                     + (f"; {peaks.scaled_note}" if peaks.scaled_note else "")
                     + ". Datasheet peaks at boost clock; a GPU running lower clocks has a lower roof.")
    if gpu_time:
        notes.append(f"estimates cover {measures.covered_ns / gpu_time:.0%} of GPU time; the rest is launched "
                     "outside any op (e.g. before the trace window) or by ops without a model")
    top_skipped = sorted(measures.unmodelled_ns.items(), key=lambda kv: -kv[1])[:3]
    if top_skipped:
        notes.append("not modelled (largest GPU time): " + ", ".join(f"{n}" for n, _ in top_skipped))
    assumed = instances.get_column(OpRoofCol.NOTE).drop_nulls().unique().sort().to_list()
    notes.extend(f"assumption: {a}" for a in assumed)
    return tuple(notes)
