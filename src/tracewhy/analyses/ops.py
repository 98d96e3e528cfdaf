"""Operator time: calls, CPU total/self, and GPU time of the work each operator launched."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.graph_replay import graph_replays
from tracewhy.analyses.kernel_lines import compiled_kernel_runs
from tracewhy.model.kernel_provenance import KernelProvenance
from tracewhy.model.linking import first_flagged
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, Kind, OpAttrCol
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows


class OpCol:
    """Columns of ``OpsResult.table``: one row per operator name (and input shapes with ``by_shapes``)."""

    NAME: Final = Col.NAME
    INPUT_DIMS: Final = OpAttrCol.INPUT_DIMS  # only with ``by_shapes``
    CALLS: Final = "calls"
    CPU_TOTAL: Final = "cpu_total_ns"
    CPU_SELF: Final = "cpu_self_ns"
    GPU_TOTAL: Final = "gpu_total_ns"
    GPU_SELF: Final = "gpu_self_ns"


OPS_SCHEMA: Final = pl.Schema({
    OpCol.NAME: pl.String(), OpCol.CALLS: pl.Int64(), OpCol.CPU_TOTAL: pl.Int64(), OpCol.CPU_SELF: pl.Int64(),
    OpCol.GPU_TOTAL: pl.Int64(), OpCol.GPU_SELF: pl.Int64(),
})
#: ``OpsResult.table`` with ``by_shapes``.
OPS_BY_SHAPES_SCHEMA: Final = pl.Schema({OpCol.NAME: pl.String(), OpCol.INPUT_DIMS: pl.String(),
                                         **{k: v for k, v in OPS_SCHEMA.items() if k != OpCol.NAME}})

SORT_KEYS = (OpCol.GPU_SELF, OpCol.GPU_TOTAL, OpCol.CPU_SELF, OpCol.CPU_TOTAL, OpCol.CALLS)


@dataclass(frozen=True)
class OpsOptions:
    by_shapes: bool = False
    sort_by: str | None = None  # one of SORT_KEYS; None: gpu_self_ns if any GPU time, else cpu_self_ns
    #: Where compiled kernels come from (--logs): each is a row of its own, its time taken from
    #: the op it ran under (``## Call CompiledFxGraph ##``).
    provenance: KernelProvenance | None = None


@dataclass(frozen=True)
class OpsResult(Rows, rows="table", key="name"):
    """``table``: OPS_SCHEMA (OPS_BY_SHAPES_SCHEMA with ``by_shapes``), in ``sort_by`` order.

    CPU self time is the op's duration less the CPU ops nested in it. GPU self time is the
    device time (kernels, copies, memsets) whose launch happened with this op innermost on the
    launching thread's stack; GPU total adds the time of work launched by nested ops.
    ``gpu_unattributed_ns`` is device time whose launch has no CPU op above it (or whose launch
    is outside the trace).

    Work replayed by a CUDA/HIP graph launch is charged to what launched the graph
    (``analyses.graph_replay``): its CPU op, or, where no op encloses the launch call (vLLM and
    SGLang replay from Python), the innermost annotation around it, or the launch call itself;
    those rows then appear in the table beside the ops. ``gpu_graph_outside_op_ns`` is that
    replayed time whose launch has no CPU op around it.
    """

    table: pl.DataFrame
    sort_by: str
    by_shapes: bool
    gpu_time_ns: int
    gpu_unattributed_ns: int
    gpu_graph_outside_op_ns: int = 0


def ops(trace: Trace, options: OpsOptions = OpsOptions()) -> OpsResult:
    trace.require_whole()
    s = trace.slices
    n = s.height
    kind = s.get_column(Col.KIND)
    dur = s.get_column(Col.DUR).to_numpy()
    enclosing_op = s.get_column(Col.OP).fill_null(-1).to_numpy()
    is_op = (kind == Kind.CPU_OP.value).to_numpy()
    is_gpu = kind.is_in([k.value for k in GPU_ACTIVITY_KINDS]).to_numpy()
    gpu_rows = np.flatnonzero(is_gpu)
    replays = graph_replays(trace)
    gpu_op = replays.gpu_charged[gpu_rows]
    charged = gpu_op[gpu_op >= 0]
    nesting = enclosing_op
    if not is_op[charged].all():
        # Replayed work charged to annotations or launch calls: they count as ops here, and the
        # nesting of ops is taken over them as well, so that totals include what they enclose.
        is_op = is_op.copy()
        is_op[charged] = True
        parent = s.get_column(Col.PARENT).fill_null(-1).to_numpy()
        nesting = first_flagged(parent, parent, is_op)

    op_rows = np.flatnonzero(is_op)
    child_time = np.bincount(
        nesting[op_rows][nesting[op_rows] >= 0],
        weights=dur[op_rows][nesting[op_rows] >= 0],
        minlength=n,
    ) if op_rows.size else np.zeros(n)
    gpu_dur = dur[gpu_rows]
    gpu_self = _sum_at(gpu_op, gpu_dur, n)
    gpu_total = _inclusive(gpu_op, gpu_dur, nesting, n)

    table = pl.DataFrame(
        {
            Col.ID: op_rows.astype(np.int64),
            OpCol.NAME: s.get_column(Col.NAME).gather(op_rows).cast(pl.String),
            OpCol.CPU_TOTAL: dur[op_rows],
            OpCol.CPU_SELF: np.maximum(dur[op_rows] - child_time[op_rows].astype(np.int64), 0),
            OpCol.GPU_TOTAL: gpu_total[op_rows],
            OpCol.GPU_SELF: gpu_self[op_rows],
        }
    )
    if options.provenance is not None:
        table = _with_compiled_kernels(table, compiled_kernel_runs(trace, options.provenance), enclosing_op, n)
    keys = [OpCol.NAME]
    if options.by_shapes:
        shapes = trace.op_attrs.select(Col.ID, pl.col(OpAttrCol.INPUT_DIMS).fill_null(""))
        table = table.join(shapes, on=Col.ID, how="left").with_columns(
            pl.col(OpAttrCol.INPUT_DIMS).fill_null("")
        )
        keys.append(OpCol.INPUT_DIMS)
    grouped = table.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias(OpCol.CALLS),
        pl.col(OpCol.CPU_TOTAL, OpCol.CPU_SELF, OpCol.GPU_TOTAL, OpCol.GPU_SELF).sum(),
    )
    gpu_time = int(gpu_dur.sum())
    sort_by = options.sort_by or (OpCol.GPU_SELF if gpu_time else OpCol.CPU_SELF)
    if sort_by not in SORT_KEYS:
        raise ValueError(f"sort key must be one of {', '.join(SORT_KEYS)}")
    grouped = grouped.sort([sort_by, *keys], descending=[True] + [False] * len(keys))
    return OpsResult(
        table=grouped,
        sort_by=sort_by,
        by_shapes=options.by_shapes,
        gpu_time_ns=gpu_time,
        gpu_unattributed_ns=int(gpu_dur[gpu_op < 0].sum()),
        gpu_graph_outside_op_ns=replays.graph_charged_outside_op_ns,
    )


def _with_compiled_kernels(table: pl.DataFrame, runs: pl.DataFrame, enclosing_op: npt.NDArray[np.int64],
                           n: int) -> pl.DataFrame:
    """Per-op rows with each compiled kernel run's time moved from the op it ran under to a row
    of its own (a kernel run is no op: an unnamed frame on CPU, a launch on GPU)."""
    if runs.height == 0:
        return table
    at = enclosing_op[runs.get_column(Col.ID).to_numpy()]
    host = _sum_at(at, runs.get_column("host_ns").to_numpy(), n)
    gpu = _sum_at(at, runs.get_column("gpu_ns").to_numpy(), n)
    ids = table.get_column(Col.ID).to_numpy()
    table = table.with_columns(pl.Series(OpCol.CPU_SELF, np.maximum(table.get_column(OpCol.CPU_SELF).to_numpy()
                                                                    - host[ids], 0)),
                               pl.Series(OpCol.GPU_SELF, np.maximum(table.get_column(OpCol.GPU_SELF).to_numpy()
                                                                    - gpu[ids], 0)))
    kernels = runs.select(
        pl.col(Col.ID).cast(pl.Int64), pl.col("name").alias(OpCol.NAME), pl.col("host_ns").alias(OpCol.CPU_TOTAL),
        pl.col("host_ns").alias(OpCol.CPU_SELF), pl.col("gpu_ns").alias(OpCol.GPU_TOTAL),
        pl.col("gpu_ns").alias(OpCol.GPU_SELF))
    return pl.concat([table, kernels.cast(dict(table.schema))], how="vertical")  # type: ignore[arg-type]


def _sum_at(index: npt.NDArray[np.int64], weights: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64]:
    keep = index >= 0
    return np.bincount(index[keep], weights=weights[keep], minlength=n).astype(np.int64)


def _inclusive(
    start: npt.NDArray[np.int64],
    weights: npt.NDArray[np.int64],
    enclosing_op: npt.NDArray[np.int64],
    n: int,
) -> npt.NDArray[np.int64]:
    """Add each weight to the op it starts at and to every enclosing op above it."""
    total = np.zeros(n, dtype=np.int64)
    cur = start.copy()
    w = weights
    while True:
        keep = cur >= 0
        if not keep.any():
            return total
        cur, w = cur[keep], w[keep]
        total += np.bincount(cur, weights=w, minlength=n).astype(np.int64)
        cur = enclosing_op[cur]
