"""One analysed window as the what-if edits see it (``WindowEdges``): its edges with what the
edits select them by, and what every prediction on the window shares, computed once per
window: each fix's edit of it, the drain every replay adds, and the per-edge columns several
edits read (on a whole-trace window of a large export, 17 M edges, each such column is a
gather over all of them).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

import numpy as np
import numpy.typing as npt

from tracewhy.analyses.account import StepModel, WindowPath
from tracewhy.analyses.account_host import HostPurpose
from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.critical_path_replay import EditedPath, GraphEdit, ReplayWindow
from tracewhy.analyses.what_if_removals import window_parts
from tracewhy.model.schema import GPU_ACTIVITY_KINDS

if TYPE_CHECKING:  # what_if_edits imports this module
    from tracewhy.analyses.what_if_edits import Fix

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]
T = TypeVar("T")
D = TypeVar("D", bound=np.generic)

#: Host edges: program order, and the launch call's own time.
HOST_EDGES: Final = (int(Edge.HOST), int(Edge.LAUNCH))


class WindowEdges:
    """The edges of one analysed window with what the edits select them by: Edge kind, the
    attributed slice, its context (``account_host.HostPurpose``) and, for a GPU activity, its
    launch call. What does not depend on an edit is computed at its first use and kept for the
    window's other predictions (``once``): a finding's fix is replayed alone and again among
    the fixes together, and several fixes of one kind (a collective each) read the same
    columns."""

    def __init__(self, model: StepModel, path: WindowPath) -> None:
        self.model, self.path = model, path
        self.replay: ReplayWindow = model.replay.window(path.window_start, path.window_end)
        g, rules = model.graph, model.rules
        self.ids = self.replay.edges
        # (Kinds as the graph's bytes; ends gathered when an edit asks: a whole-trace window of
        # a large export has 17 M edges, 136 MB an int64 column. A window of every edge reads
        # the columns themselves, through read-only views.)
        self.kind, self.attr, self.category = (self.of_edges(c) for c in (g.kind, g.attr, rules.category))
        safe = np.maximum(self.attr, 0)
        self.context = np.where(self.attr >= 0, rules.ctx.context[safe], int(HostPurpose.NONE))
        launch = self.launch
        self.launch_context = np.where(launch >= 0, rules.ctx.context[np.maximum(launch, 0)], int(HostPurpose.NONE))
        self._unedited: EditedPath | None = None
        self._parts: npt.NDArray[np.integer[Any]] | None = None
        self._once: dict[str, Any] = {}

    def once(self, key: str, compute: Callable[[], T]) -> T:
        """``compute()``, computed at the first call with ``key`` and kept for this window's other
        predictions. An array kept is made read-only: a caller that would change it in place
        fails instead of changing it for the next."""
        if key not in self._once:
            value = compute()
            if isinstance(value, np.ndarray):
                value.flags.writeable = False
            self._once[key] = value
        out: T = self._once[key]
        return out

    def edit_of(self, fix: Fix) -> GraphEdit:
        """``fix``'s edit of this window, made once (an edit is a function of the fix and the
        window): the fixes replayed together are those the findings replayed alone."""
        return self.once("edit:" + repr(fix), lambda: fix.edit(self))

    def drain(self) -> GraphEdit:
        """The step ends after the GPU work of its process that ended in its window: an edge of no
        weight from each such activity's end to the window's last instant (every replay of the
        window adds the same ones)."""
        return self.once("drain", self._drain)

    def _drain(self) -> GraphEdit:
        g, p = self.model.graph, self.path
        ends = np.flatnonzero((g.node_ts >= p.window_start) & (g.node_ts <= g.node_ts[p.sink]) & (g.node_pid == p.pid))
        ends = ends[ends % 2 == 1]
        gpu = np.isin(self.model.rules.kind[g.node_slice[ends]], [k.value for k in GPU_ACTIVITY_KINDS])
        ends = ends[gpu & (ends != p.sink)]
        n = ends.size
        return GraphEdit(add_src=ends, add_dst=np.full(n, p.sink, dtype=np.int64),
                         add_weight=np.zeros(n, dtype=np.int64), add_kind=np.full(n, int(Edge.GPU), dtype=np.int64),
                         add_attr=g.node_slice[ends])

    def of_edges(self, column: npt.NDArray[D]) -> npt.NDArray[D]:
        """A per-edge column of the graph, for this window's edges: a read-only view of it where the
        window holds every edge (a trace accounted as one window), else the window's rows."""
        if self.ids.size < column.size:
            rows: npt.NDArray[D] = column[self.ids]
            return rows
        view: npt.NDArray[D] = column.view()
        view.flags.writeable = False
        return view

    @property
    def src(self) -> I64:
        return self.of_edges(self.model.graph.src)

    @property
    def dst(self) -> I64:
        return self.of_edges(self.model.graph.dst)

    @property
    def launch(self) -> I64:
        """Per edge, the launch call of the GPU activity it runs (-1: none; not kept: 136 MB on a
        whole-trace window of a large export, and the edits that read it keep what they find)."""
        gpu = (self.kind == int(Edge.GPU)) & (self.attr >= 0)
        out: I64 = np.where(gpu, self.model.rules.launch[np.maximum(self.attr, 0)], -1)
        return out

    def unedited(self) -> EditedPath:
        """The window replayed with its drain alone, once: every prediction whose edits change
        nothing here replays exactly this (a replay is a function of the window and the edit),
        and on a whole-trace window of a large export one replay takes seconds."""
        if self._unedited is None:
            self._unedited = self.replay.edited(self.path.sink, self.drain(), self.path.edges)
        return self._unedited

    def host(self) -> B:
        """Per edge, whether it is host time in a slice (program order or a launch call's own)."""
        def compute() -> B:
            mask: B = ((self.kind == HOST_EDGES[0]) | (self.kind == HOST_EDGES[1])) & (self.attr >= 0)
            return mask
        return self.once("host", compute)

    def in_part(self, name: str) -> B:
        """The edges the account puts in the part ``name`` (each edge's part decided once per
        window: 5 s for a whole-trace window's 17 M edges, once per edit that removes a part)."""
        if self._parts is None:
            self._parts = window_parts(self)
        index = self.model.rules.index_of(name)
        mask: B = self._parts == index if index is not None else np.zeros(self._parts.size, dtype=bool)
        return mask
    def removing(self, host: B, gpu: B) -> GraphEdit:
        """These host and GPU edges take no time; the blocking calls among them no longer wait."""
        sync = (self.kind == int(Edge.SYNC)) & host
        scaled = self.ids[(host & ~sync) | gpu]
        return GraphEdit(drop=self.ids[sync], scaled=scaled, factor=np.zeros(scaled.size))

    def fewer_calls(self, host: B, chunk: int | None) -> tuple[GraphEdit, int, int]:
        """Each op that runs more than once among these host edges (by its outermost op's name)
        keeps one call per ``chunk`` (None: one call in all), every other call saving what the
        window's cheapest call of that op took (its fixed cost: dispatch, launch); the work the
        calls do together stays. Returns the edit, and the calls there were and are left."""
        ctx, rules = self.model.rules.ctx, self.model.rules
        outer = ctx.outer_op[np.maximum(self.attr, 0)]
        by_name: dict[str, list[int]] = {}
        for op in np.unique(outer[host & (outer >= 0)]).tolist():
            by_name.setdefault(ctx.name(op), []).append(op)
        factor: dict[int, float] = {}
        before = after = 0
        for name, calls in by_name.items():
            fused = "_foreach_" in name or "_fused_" in name
            kept = len(calls) if fused else math.ceil(len(calls) / (chunk or len(calls)))
            before, after = before + len(calls), after + kept
            if kept == len(calls):
                continue
            dur = rules.slice_end[calls] - rules.slice_ts[calls]
            total = float(dur.sum())
            saved = (len(calls) - kept) * float(dur.min())
            for op in calls:
                factor[op] = (total - saved) / total if total > 0 else 1.0
        chosen = host & np.isin(outer, list(factor))
        edit = GraphEdit(scaled=self.ids[chosen], factor=np.array([factor[int(o)] for o in outer[chosen]],
                                                                  dtype=np.float64))
        return edit, before, after

    def off_stream(self, moved: set[int]) -> GraphEdit:
        """These GPU activities leave their stream for one of their own, in their order: the
        stream-order edges between one of them and another activity go, each of the two streams
        is linked anew where it skipped over the other's activities, and a blocking call no
        longer waits for them."""
        slice_of = self.model.graph.node_slice
        gap = self.kind == int(Edge.GAP)
        src_in = np.isin(slice_of[self.src], list(moved))
        dst_in = np.isin(slice_of[self.dst], list(moved))
        drop = (gap & (src_in ^ dst_in)) | ((self.kind == int(Edge.SYNC)) & src_in)
        following = {int(a): int(b) for a, b in zip(self.src[gap], self.dst[gap], strict=True)}  # end -> start
        heads = sorted({e - 1 for e in following} - set(following.values()))
        add_src: list[int] = []
        add_dst: list[int] = []
        for head in heads:
            chain = [head]
            while chain[-1] + 1 in following:
                chain.append(following[chain[-1] + 1])
            for keep in (True, False):
                part = [a for a in chain if (int(slice_of[a]) in moved) == keep]
                for a, b in itertools.pairwise(part):
                    if following.get(a + 1) != b:
                        add_src.append(a + 1)
                        add_dst.append(b)
        n = len(add_src)
        return GraphEdit(drop=self.ids[drop], add_src=np.asarray(add_src, dtype=np.int64),
                         add_dst=np.asarray(add_dst, dtype=np.int64), add_weight=np.zeros(n, dtype=np.int64),
                         add_kind=np.full(n, int(Edge.GAP), dtype=np.int64), add_attr=np.full(n, -1, dtype=np.int64))
