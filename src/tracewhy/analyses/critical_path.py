"""The critical path of each step: the chain of host work, launches, GPU activities and waits
that set the step's length, what it is made of, and how much shorter the step would be without
each of the things on it.

The path runs backwards from the step's last instant (the next step's start; for the last step
the end of its own work) through the edge that released each instant (see
``critical_path_graph``) until it reaches the step's start. Edge lengths are elapsed times, so
the path is the longest one and covers the whole window when every instant on it was released
by something the trace recorded. The gains come from replaying the step with an item's time
removed (``critical_path_replay``): each instant at the latest of its in-edges, waits shrinking
to what was measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.critical_path_graph import Graph, build_graph
from tracewhy.analyses.critical_path_replay import Replay
from tracewhy.analyses.critical_path_walk import (  # Category and its tuples: still exported from here
    CATEGORIES as CATEGORIES,
)
from tracewhy.analyses.critical_path_walk import (
    EDGE_NAMES,
    EdgeLabels,
    nodes_by_pid,
    walk,
)
from tracewhy.analyses.critical_path_walk import WORK_CATEGORIES as WORK_CATEGORIES
from tracewhy.analyses.critical_path_walk import Category as Category
from tracewhy.analyses.iterations import account_windows
from tracewhy.analyses.steps import StepsOptions, StepsResult, WindowCol, steps
from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows

I64 = npt.NDArray[np.int64]


#: ``tracewhy critical-path`` analyses at most this many steps, steady ones first (its note says
#: so): each step costs a walk and the replays of its top items, ~5 ms, so 20,000 one-kernel
#: steps (15 MB of JSON) ran past 90 s; the longest real runs here have a few hundred steps.
MAX_PATH_STEPS: Final = 2_000


@dataclass(frozen=True)
class CriticalPathOptions:
    marker: str | None = None  # step marker (None: what ``steps`` picks)
    gain_items: int = 5  # per step, the items on the path (by time) whose removal is replayed
    #: Analyse this one window (start_ns, end_ns) instead of the steps: e.g. one instance of an
    #: annotation, as HTA's critical_path_analysis(annotation, instance_id) does.
    window_ns: tuple[int, int] | None = None
    #: Analyse at most this many steps, steady ones first (then warm-up), in time order (None:
    #: every step). The report bounds it: each step costs a walk and its replays.
    max_steps: int | None = None


class PathCol:
    """Column names of the result tables."""

    STEP: Final = "step"  # index into ``steps``
    WINDOW_START: Final = WindowCol.WINDOW_START
    WINDOW_END: Final = WindowCol.WINDOW_END
    WINDOW: Final = WindowCol.WINDOW
    TOTAL: Final = "total_ns"  # the time the path covers
    DETERMINED: Final = "determined"  # the path covers the whole window
    CATEGORY: Final = "category"
    FAMILY: Final = "family"  # kernel family (kernels only)
    ON_PATH: Final = "on_path_ns"
    COUNT: Final = "count"
    GAIN: Final = "gain_ns"  # step time saved if the item took no time (null: not replayed)
    EDGE: Final = "edge"  # an Edge name
    NUMBER: Final = WindowCol.NUMBER
    STEADY: Final = WindowCol.STEADY
    NS: Final = "ns"  # a family's time on the path (``families``)


#: The category of the ``gains`` rows that the ``critical-path`` report adds for the step account's
#: parts (``name`` the part, ``gain_ns`` the step time its fix saves: ``what_if.part_gains``).
PART_GAIN_CATEGORY: Final = "part"
#: The ``steps`` column of each category's time on the path.
CATEGORY_NS: Final = {c: f"{c}_ns" for c in CATEGORIES}


@dataclass(frozen=True)
class CriticalPathResult(Rows, rows="steps"):
    """``steps``: per step its window (WindowCol names), ``total_ns``, ``determined`` and one
    ``<category>_ns`` column per category (``CATEGORY_NS``); ``step`` is the window's index among
    all ``steps_total`` of the trace, of which ``steps`` holds at most ``max_steps``.
    ``families``: step, family, ns (kernels only).
    ``segments``: the path in time order: step, ts_ns, dur_ns, category, edge, id (the slice the
    time was spent in, null for idle and gaps), name (that slice's). ``on_path``: step, id, name, kind, category,
    family, ts_ns, dur_ns, on_path_ns. ``gains``: step, category, name, count, on_path_ns,
    gain_ns."""

    marker: str
    steps: pl.DataFrame
    families: pl.DataFrame
    segments: pl.DataFrame
    on_path: pl.DataFrame
    gains: pl.DataFrame
    #: Edges left out because their end precedes their start (host and GPU clocks disagree).
    dropped_edges: int
    note: str | None
    steps_total: int


def critical_path(trace: Trace, options: CriticalPathOptions = CriticalPathOptions(),
                  steps_result: StepsResult | None = None, graph: Graph | None = None) -> CriticalPathResult:
    """``steps_result``: the steps to take (their warm-up included) when the caller has them;
    ``graph``: the trace's ``build_graph``, when the caller has built it (the step account does)."""
    trace.require_whole()
    graph = graph if graph is not None else build_graph(trace)
    if options.window_ns is None:
        # The steps (marked, or the loop's iterations), else the whole trace: never nothing to analyse.
        found = account_windows(trace, steps_result or steps(trace, StepsOptions(marker=options.marker)), graph)
        windows, marker, note = found.windows, found.marker, found.note
    else:
        windows, marker, note = _one_window(graph, *options.window_ns), "window", None
    steps_total = windows.height
    chosen = _bounded(windows, options.max_steps)
    labels = EdgeLabels(trace, graph)
    replay = Replay(graph)
    by_pid = nodes_by_pid(graph)
    step_rows: list[dict[str, object]] = []
    segments: list[pl.DataFrame] = []
    gains: list[pl.DataFrame] = []
    for i, ws, we, pid, number, steady in chosen.select(
            _INDEX, WindowCol.WINDOW_START, WindowCol.WINDOW_END, WindowCol.PID, WindowCol.NUMBER,
            WindowCol.STEADY).iter_rows():
        path, start, sink = walk(graph, by_pid.get(pid), ws, we)
        seg = _segments(labels, path, ws).with_columns(pl.lit(i, pl.Int64).alias(PathCol.STEP))
        segments.append(seg)
        total = int(graph.node_ts[sink]) - max(start, ws) if sink >= 0 else 0
        by_cat = dict(seg.group_by(PathCol.CATEGORY).agg(pl.col(Col.DUR).sum()).iter_rows())
        step_rows.append({
            PathCol.STEP: i, WindowCol.NUMBER: number, WindowCol.STEADY: steady, PathCol.WINDOW_START: ws,
            PathCol.WINDOW_END: we, PathCol.WINDOW: we - ws, PathCol.TOTAL: total,
            PathCol.DETERMINED: sink >= 0 and start <= ws and int(graph.node_ts[sink]) == we,
            **{CATEGORY_NS[c]: int(by_cat.get(c, 0)) for c in CATEGORIES},
        })
        gains.append(_gains(trace, graph, replay, seg, i, ws, we, sink, options.gain_items))
    seg_all = pl.concat(segments) if segments else _segments(labels, [], 0).with_columns(
        pl.lit(0, pl.Int64).alias(PathCol.STEP))
    on_path = _on_path(trace, seg_all)
    if graph.dropped_edges:
        extra = (f"{graph.dropped_edges} dependencies left out: their GPU end precedes their host start "
                 "(host and GPU clocks disagree)")
        note = extra if note is None else f"{note}; {extra}"
    return CriticalPathResult(
        marker=marker,
        steps=pl.DataFrame(step_rows, schema=_STEPS_SCHEMA),
        families=seg_all.filter(pl.col(PathCol.FAMILY).is_not_null()).group_by(PathCol.STEP, PathCol.FAMILY)
        .agg(pl.col(Col.DUR).sum().alias(PathCol.NS)).sort(PathCol.STEP, PathCol.NS, PathCol.FAMILY,
                                                      descending=[False, True, False]),
        segments=_named(trace, seg_all.select(PathCol.STEP, Col.TS, Col.DUR, PathCol.CATEGORY, PathCol.EDGE, Col.ID)),
        on_path=on_path,
        gains=pl.concat(gains) if gains else pl.DataFrame(schema=_GAINS_SCHEMA),
        dropped_edges=graph.dropped_edges,
        note=note,
        steps_total=steps_total,
    )


_INDEX: Final = "_index"


def _bounded(windows: pl.DataFrame, max_steps: int | None) -> pl.DataFrame:
    """The windows to analyse, with their index among all (``_INDEX``): at most ``max_steps``,
    steady ones first, in time order."""
    w = windows.with_row_index(_INDEX).with_columns(pl.col(_INDEX).cast(pl.Int64))
    if max_steps is None or w.height <= max_steps:
        return w
    return w.sort(pl.col(WindowCol.STEADY).not_(), _INDEX).head(max_steps).sort(_INDEX)


_STEPS_SCHEMA: Final = pl.Schema({
    PathCol.STEP: pl.Int64(), WindowCol.NUMBER: pl.Int64(), WindowCol.STEADY: pl.Boolean(),
    PathCol.WINDOW_START: pl.Int64(), PathCol.WINDOW_END: pl.Int64(), PathCol.WINDOW: pl.Int64(),
    PathCol.TOTAL: pl.Int64(), PathCol.DETERMINED: pl.Boolean(), **{CATEGORY_NS[c]: pl.Int64() for c in CATEGORIES},
})
_GAINS_SCHEMA: Final = pl.Schema({
    PathCol.STEP: pl.Int64(), PathCol.CATEGORY: pl.String(), Col.NAME: pl.String(), PathCol.COUNT: pl.Int64(),
    PathCol.ON_PATH: pl.Int64(), PathCol.GAIN: pl.Int64(),
})


def _named(trace: Trace, seg: pl.DataFrame) -> pl.DataFrame:
    """The segments with the name of the slice each was spent in (null without one)."""
    ids = seg.get_column(Col.ID)
    names = trace.slices.get_column(Col.NAME).gather(ids.fill_null(0)).cast(pl.String)
    return seg.with_columns(pl.when(ids.is_not_null()).then(names).alias(Col.NAME))


def _one_window(graph: Graph, start_ns: int, end_ns: int) -> pl.DataFrame:
    """A steps-like table of one window, owned by the process with the most instants in it."""
    inside = (graph.node_ts >= start_ns) & (graph.node_ts <= end_ns)
    pids, counts = np.unique(graph.node_pid[inside], return_counts=True)
    pid = int(pids[np.argmax(counts)]) if pids.size else -1
    return pl.DataFrame({WindowCol.WINDOW_START: [start_ns], WindowCol.WINDOW_END: [end_ns], WindowCol.PID: [pid],
                         WindowCol.NUMBER: [None], WindowCol.STEADY: [True]},
                        schema={WindowCol.WINDOW_START: pl.Int64, WindowCol.WINDOW_END: pl.Int64,
                                WindowCol.PID: pl.Int64, WindowCol.NUMBER: pl.Int64, WindowCol.STEADY: pl.Boolean})


def _segments(labels: EdgeLabels, path: Sequence[int], ws: int) -> pl.DataFrame:
    """The path's edges in time order, the first clipped at the window's start."""
    e = np.asarray(path[::-1], dtype=np.int64)
    g = labels.graph
    start = np.maximum(g.node_ts[g.src[e]], ws)
    return pl.DataFrame({
        Col.TS: start, Col.DUR: g.node_ts[g.dst[e]] - start,
        PathCol.CATEGORY: labels.category(e).tolist(), PathCol.FAMILY: labels.family(e).tolist(),
        PathCol.EDGE: EDGE_NAMES[g.kind[e]].tolist(),
        Col.ID: pl.Series(g.attr[e]).replace(-1, None), "_edge": e,
    }, schema={Col.TS: pl.Int64, Col.DUR: pl.Int64, PathCol.CATEGORY: pl.String, PathCol.FAMILY: pl.String,
               PathCol.EDGE: pl.String, Col.ID: pl.Int64, "_edge": pl.Int64})


def _on_path(trace: Trace, seg: pl.DataFrame) -> pl.DataFrame:
    """The slices the path spends time in, per step, in time order (zero-length calls of an
    integer-microsecond trace lie on it too, spending nothing: left out)."""
    s = trace.slices
    per = seg.filter(pl.col(Col.ID).is_not_null()).group_by(PathCol.STEP, Col.ID, PathCol.CATEGORY).agg(
        pl.col(PathCol.FAMILY).first(), pl.col(Col.DUR).sum().alias(PathCol.ON_PATH),
    ).filter(pl.col(PathCol.ON_PATH) > 0)
    ids = per.get_column(Col.ID).to_numpy()
    return per.with_columns(
        s.get_column(Col.NAME).gather(ids).cast(pl.String).alias(Col.NAME),
        s.get_column(Col.KIND).gather(ids).cast(pl.String).alias(Col.KIND),
        s.get_column(Col.TS).gather(ids).alias(Col.TS),
        s.get_column(Col.DUR).gather(ids).alias(Col.DUR),
    ).select(PathCol.STEP, Col.ID, Col.NAME, Col.KIND, PathCol.CATEGORY, PathCol.FAMILY, Col.TS, Col.DUR,
             PathCol.ON_PATH).sort(PathCol.STEP, Col.TS, Col.ID, PathCol.CATEGORY)


def _gains(trace: Trace, graph: Graph, replay: Replay, seg: pl.DataFrame, step: int, ws: int, we: int,
           sink: int, top: int) -> pl.DataFrame:
    """Per (category, name) on the path: count, time on the path, and for the ``top`` by time
    among shortenable ones, the step time saved if all of the step's instances took no time."""
    names = trace.slices.get_column(Col.NAME)
    per = seg.filter(pl.col(Col.ID).is_not_null()).with_columns(
        names.gather(seg.filter(pl.col(Col.ID).is_not_null()).get_column(Col.ID)).cast(pl.String).alias(Col.NAME))
    items = per.group_by(PathCol.CATEGORY, Col.NAME).agg(
        pl.col(Col.ID).n_unique().cast(pl.Int64).alias(PathCol.COUNT), pl.col(Col.DUR).sum().alias(PathCol.ON_PATH),
        pl.col(Col.ID).unique().alias("_ids"),
    ).sort(PathCol.ON_PATH, PathCol.CATEGORY, Col.NAME, descending=[True, False, False])
    gain: list[int | None] = [None] * items.height
    if sink >= 0 and top > 0:
        sub = replay.window(ws, we)
        work = items.get_column(PathCol.CATEGORY).is_in(WORK_CATEGORIES).to_list()
        picked = [i for i, ok in enumerate(work) if ok][:top]
        ids_col = items.get_column("_ids").to_list()
        cats = items.get_column(PathCol.CATEGORY).to_list()
        for i in picked:
            edge_kind = (Edge.GPU,) if cats[i] in (Category.KERNELS, Category.COMMUNICATION, Category.COPIES) \
                and _is_gpu_item(trace, ids_col[i][0]) else (Edge.HOST,)
            gain[i] = sub.saved(sink, np.asarray(ids_col[i], dtype=np.int64), edge_kind)
    return items.drop("_ids").with_columns(pl.lit(step, pl.Int64).alias(PathCol.STEP),
                                           pl.Series(PathCol.GAIN, gain, dtype=pl.Int64)).select(*_GAINS_SCHEMA)


def _is_gpu_item(trace: Trace, slice_id: int) -> bool:
    return str(trace.slices.get_column(Col.KIND)[slice_id]) in {Kind.KERNEL.value, Kind.MEMCPY.value,
                                                                 Kind.MEMSET.value}
