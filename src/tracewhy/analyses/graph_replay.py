"""CUDA/HIP graph replays: the GPU work each graph launch ran, the row that work is charged to, and
how much of the device time ran eagerly (one launch call per kernel) instead.

A graph launch (``cudaGraphLaunch``, ``hipGraphLaunch``, ``cuGraphLaunch``) carries one
correlation id for every kernel it replays, so linking already ties each replayed kernel to the
launch call. The op that *recorded* a kernel is known only at capture, and the traces at hand do
not hold one: vLLM and SGLang capture their graphs at start-up, before the profiled window, and
Kineto's ``graph id``/``graph node id`` (CUDA 12 builds) name a node of the graph, not the op
that recorded it. So replayed work is charged to what launched the graph, found from the launch
call's nesting: its innermost CPU op; without one (vLLM and SGLang replay from Python), its
innermost user annotation; without either, the launch call itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.families import Family, classify_kernels
from tracewhy.analyses.name_codes import distinct_names
from tracewhy.model.linking import first_flagged
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, LAUNCH_KINDS, Col, Kind
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]


class ChargedTo:
    """What a graph launch's replayed work is charged to (``GraphLaunchCol.CHARGED_KIND``)."""

    CPU_OP: Final = "cpu_op"  # the innermost CPU op around the launch call
    ANNOTATION: Final = "annotation"  # no op around it: the innermost user annotation
    LAUNCH: Final = "launch"  # neither: the launch call itself


class GraphLaunchCol:
    """Columns of ``GraphReplays.launches``: one row per graph launch call, in time order."""

    ID: Final = Col.ID  # the launch call's row
    NAME: Final = Col.NAME
    TS: Final = Col.TS
    DUR: Final = Col.DUR
    CHARGED_ID: Final = "charged_id"  # the row its replayed work is charged to
    CHARGED_KIND: Final = "charged_kind"  # a ``ChargedTo`` value
    CHARGED_NAME: Final = "charged_name"
    GPU_ROWS: Final = "gpu_rows"  # kernels, copies and memsets the launch replayed
    GPU_NS: Final = "gpu_ns"


LAUNCHES_SCHEMA: Final = pl.Schema({
    GraphLaunchCol.ID: pl.Int64(), GraphLaunchCol.NAME: pl.String(), GraphLaunchCol.TS: pl.Int64(),
    GraphLaunchCol.DUR: pl.Int64(), GraphLaunchCol.CHARGED_ID: pl.Int64(), GraphLaunchCol.CHARGED_KIND: pl.String(),
    GraphLaunchCol.CHARGED_NAME: pl.String(), GraphLaunchCol.GPU_ROWS: pl.Int64(), GraphLaunchCol.GPU_NS: pl.Int64(),
})


@dataclass(frozen=True)
class GraphReplays:
    """``launches``: LAUNCHES_SCHEMA. ``gpu_charged``: for every slice row, the row its GPU time
    is charged to (-1: none): the launch's CPU op as linking gives it (``Col.OP``), and for work
    replayed by a graph launch with no CPU op around it, the annotation or launch call that
    ``launches`` names. ``replayed_rows``: the GPU rows graph launches replayed. The ``*_ns``
    and ``*_rows`` figures count device work (kernels, copies, memsets) over the whole trace:
    replayed from graphs, or launched one call per kernel (``eager``, launch in the trace);
    ``graph_charged_outside_op_ns`` is the replayed time whose launch has no CPU op around it."""

    launches: pl.DataFrame
    gpu_charged: I64
    replayed_rows: I64
    graph_gpu_ns: int
    graph_gpu_rows: int
    graph_charged_outside_op_ns: int
    eager_gpu_ns: int
    eager_gpu_rows: int

    @property
    def graph_launches(self) -> int:
        return self.launches.height


def graph_launch_rows(trace: Trace) -> I64:
    """Rows of the graph launch calls, in table order (each distinct name is tested once)."""
    calls = trace.kind_columns(LAUNCH_KINDS, Col.ID, Col.NAME)
    # (Only the distinct names become strings: a String copy of every call's name was 1.9 M
    # strings on a 600 MB nsys export.)
    names = calls.get_column(Col.NAME)
    graph_names = [n for n in distinct_names(names)[1] if api_names.is_graph_launch(n)]
    if not graph_names:
        return np.zeros(0, dtype=np.int64)
    return np.asarray(calls.filter(names.is_in(graph_names)).get_column(Col.ID).to_numpy(), dtype=np.int64)


def graph_replays(trace: Trace) -> GraphReplays:
    s = trace.slices
    n = s.height
    kind = s.get_column(Col.KIND)
    gpu_charged = np.asarray(s.get_column(Col.OP).fill_null(-1).to_numpy(), dtype=np.int64).copy()
    launch = np.asarray(s.get_column(Col.LAUNCH).fill_null(-1).to_numpy(), dtype=np.int64)
    dur = np.asarray(s.get_column(Col.DUR).to_numpy(), dtype=np.int64)
    is_gpu = kind.is_in([k.value for k in GPU_ACTIVITY_KINDS]).to_numpy()
    gpu_rows = np.flatnonzero(is_gpu)
    launch_rows = graph_launch_rows(trace)
    is_graph_launch = np.zeros(n, dtype=bool)
    is_graph_launch[launch_rows] = True
    gpu_launch = launch[gpu_rows]
    replayed = gpu_launch >= 0
    replayed[replayed] = is_graph_launch[gpu_launch[replayed]]
    eager = (gpu_launch >= 0) & ~replayed

    # What each launch's work is charged to: its CPU op, else the innermost annotation above it.
    op = gpu_charged[launch_rows]
    parent = np.asarray(s.get_column(Col.PARENT).fill_null(-1).to_numpy(), dtype=np.int64)
    is_annotation = (kind == Kind.ANNOTATION.value).to_numpy()
    annotation = first_flagged(parent[launch_rows], parent, is_annotation)
    charged = np.where(op >= 0, op, np.where(annotation >= 0, annotation, launch_rows))
    charged_kind = np.where(op >= 0, ChargedTo.CPU_OP,
                            np.where(annotation >= 0, ChargedTo.ANNOTATION, ChargedTo.LAUNCH))
    charge_of_launch = np.full(n, -1, dtype=np.int64)
    charge_of_launch[launch_rows] = charged
    replayed_rows = gpu_rows[replayed]
    gpu_charged[replayed_rows] = charge_of_launch[launch[replayed_rows]]

    per_launch_rows = np.bincount(launch[replayed_rows], minlength=n)
    per_launch_ns = np.bincount(launch[replayed_rows], weights=dur[replayed_rows], minlength=n).astype(np.int64)
    names = s.get_column(Col.NAME)  # (the rows named are taken, then made strings)
    launches = pl.DataFrame({
        GraphLaunchCol.ID: launch_rows,
        GraphLaunchCol.NAME: names.gather(launch_rows).cast(pl.String),
        GraphLaunchCol.TS: s.get_column(Col.TS).gather(launch_rows),
        GraphLaunchCol.DUR: s.get_column(Col.DUR).gather(launch_rows),
        GraphLaunchCol.CHARGED_ID: charged,
        GraphLaunchCol.CHARGED_KIND: charged_kind.astype(str),
        GraphLaunchCol.CHARGED_NAME: names.gather(charged).cast(pl.String),
        GraphLaunchCol.GPU_ROWS: per_launch_rows[launch_rows].astype(np.int64),
        GraphLaunchCol.GPU_NS: per_launch_ns[launch_rows],
    }, schema=LAUNCHES_SCHEMA).sort(GraphLaunchCol.TS, GraphLaunchCol.ID)
    op_at_launch = np.full(n, -1, dtype=np.int64)
    op_at_launch[launch_rows] = op
    outside_op = replayed_rows[op_at_launch[launch[replayed_rows]] < 0]
    return GraphReplays(
        launches=launches,
        gpu_charged=gpu_charged,
        replayed_rows=replayed_rows,
        graph_gpu_ns=int(dur[replayed_rows].sum()),
        graph_gpu_rows=int(replayed_rows.size),
        graph_charged_outside_op_ns=int(dur[outside_op].sum()),
        eager_gpu_ns=int(dur[gpu_rows[eager]].sum()),
        eager_gpu_rows=int(eager.sum()),
    )



class GraphWorkCol:
    """Columns of ``graph_work``: one row per kernel, copy or memset."""

    ID: Final = Col.ID
    TS: Final = Col.TS
    DUR: Final = Col.DUR
    REPLAYED: Final = "replayed"  # launched by a graph launch (else one launch call each, or none recorded)
    CHARGED_NAME: Final = "charged_name"  # the op (or annotation, launch call) it is charged to; null: none
    FAMILY: Final = "family"  # the kernel family (``analyses.families``); copies and memsets: copy/memset


def graph_work(trace: Trace, replays: GraphReplays) -> pl.DataFrame:
    """Every GPU activity with whether a graph launch replayed it, what it is charged to and its
    family (GraphWorkCol): what the replay finding breaks down by family and by op."""
    gpu = trace.kind_columns(GPU_ACTIVITY_KINDS, Col.ID, Col.TS, Col.DUR)
    rows = np.asarray(gpu.get_column(Col.ID).to_numpy(), dtype=np.int64)
    charged = replays.gpu_charged[rows]
    replayed = np.zeros(trace.slices.height, dtype=bool)
    replayed[replays.replayed_rows] = True
    names = trace.slices.get_column(Col.NAME).gather(np.maximum(charged, 0)).cast(pl.String)
    families = classify_kernels(trace).select(Col.ID, pl.col("family").alias(GraphWorkCol.FAMILY))
    return gpu.with_columns(
        pl.Series(GraphWorkCol.REPLAYED, replayed[rows]),
        pl.when(pl.Series(charged) >= 0).then(names).alias(GraphWorkCol.CHARGED_NAME),
    ).join(families, on=Col.ID, how="left").with_columns(pl.col(GraphWorkCol.FAMILY).fill_null(Family.COPY.value))
