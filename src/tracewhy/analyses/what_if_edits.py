"""The fixes a prediction can replay, each a small declarative object that edits one window's
dependency graph the way the fix would change the program (``GraphEdit``: edges dropped,
scaled, added). ``what_if`` replays them; this module says which edges each fix touches.
"""

from __future__ import annotations

from typing import Final, Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from tracewhy.analyses import api_names
from tracewhy.analyses.account_host import HostPurpose, top_collective
from tracewhy.analyses.account_parts import CATEGORY_CODE
from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.critical_path_replay import GraphEdit
from tracewhy.analyses.critical_path_walk import Category
from tracewhy.analyses.what_if_checkpoint import after_rerun_nodes, checkpoint_entries, forward_at_rerun_cost
from tracewhy.analyses.what_if_comm import host_collectives_lane, optimizer_start, reduced_by_hand
from tracewhy.analyses.what_if_gaps import loop_between, untraced_around
from tracewhy.analyses.what_if_removals import RemovePart, RemoveSlices
from tracewhy.analyses.what_if_window import WindowEdges
from tracewhy.model.schema import KIND_CODE, Kind

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

#: Tensors one multi-tensor (foreach) kernel launch takes: PyTorch's
#: aten/src/ATen/native/cuda/MultiTensorApply.cuh, ``depth_to_max_tensors[5] = {110, 64, 48, 36,
#: 30}``, for 1 to 5 tensor lists; 36 is Adam's depth (params, grads, exp_avg, exp_avg_sq).
FOREACH_CHUNK: Final = 36

class DropSync(msgspec.Struct, frozen=True):
    """A blocking call no longer waits (``.item()`` or ``synchronize`` removed): its sync edges
    go, the copy it waited for (a DtoH read) no longer holds it, and its own time on the host
    (the wait where the trace links it to no GPU work) leaves. ``under``: only blocking calls
    under this outermost op (``aten::item``); None: every one."""

    under: str | None = None

    @property
    def label(self) -> str:
        return f"no blocking wait under {self.under}" if self.under else "no blocking waits"

    def edit(self, w: WindowEdges) -> GraphEdit:
        # The blocking calls' edges are found once per window, for every op they may be under.
        chosen, inside = w.once("blocking_waits", lambda: self._blocking(w))
        if self.under is not None:
            ctx = w.model.rules.ctx
            rows = np.flatnonzero(chosen | inside)
            outer = ctx.outer_op[np.maximum(w.attr[rows], 0)]
            # Named once per distinct op, then matched in numpy: a Python test per edge took most
            # of a small trace's prediction (65 k edges, six edits).
            named = [o for o in np.unique(outer).tolist() if o >= 0 and ctx.name(int(o)) == self.under]
            under = np.zeros(w.ids.size, dtype=bool)
            under[rows[np.isin(outer, named)]] = True
            chosen, inside = chosen & under, inside & under
        return GraphEdit(drop=w.ids[chosen], scaled=w.ids[inside], factor=np.zeros(int(inside.sum())))

    @staticmethod
    def _blocking(w: WindowEdges) -> tuple[B, B]:
        """The window's sync edges into blocking calls (or from the copy a call launched and waits
        for), and the blocking calls' own host time."""
        ctx, g = w.model.rules.ctx, w.model.graph
        sync = (w.kind == int(Edge.SYNC)) & (w.attr >= 0)
        in_call = (w.kind == int(Edge.HOST)) & (w.category == CATEGORY_CODE[Category.SYNC])
        calls = np.unique(w.attr[sync | in_call])
        blocking = np.isin(w.attr, [int(c) for c in calls.tolist() if api_names.is_sync_call(ctx.name(int(c)))])
        chosen = sync & blocking
        rows = np.flatnonzero(sync)
        chosen[rows[w.model.rules.launch[g.node_slice[g.src[w.ids[rows]]]] == w.attr[rows]]] = True  # its own copy
        inside: B = (w.kind == int(Edge.HOST)) & blocking
        return chosen, inside


class OverlapCopies(msgspec.Struct, frozen=True):
    """Pinned memory and ``non_blocking=True``: the host call does not wait for the copy, and
    the copy runs on a stream of its own beside compute (still one after another, and the step
    still ends after its copies end)."""

    direction: str = "HtoD"

    @property
    def label(self) -> str:
        return f"{self.direction} copies from pinned memory, non_blocking, beside compute"

    def edit(self, w: WindowEdges) -> GraphEdit:
        rules = w.model.rules
        gpu = (w.kind == int(Edge.GPU)) & (w.attr >= 0)
        # The copies among the activities, by kind code in numpy (a Python test per GPU edge, 17 k
        # on the nsys export, was most of this edit), then each copy's direction.
        activities = np.unique(w.attr[gpu])
        copies = activities[rules.kind_code[activities] == KIND_CODE[Kind.MEMCPY.value]]
        moved = set(copies[rules.copies.going(copies, self.direction)].tolist())
        return w.off_stream(moved) if moved else GraphEdit()


class PrefetchData(msgspec.Struct, frozen=True):
    """DataLoader workers prefetch: the fetch's own time (the dataset's Python, waiting on I/O)
    leaves the main thread; what a batch still costs the main process stays: the CPU ops it
    runs under the fetch (collating, pinning)."""

    @property
    def label(self) -> str:
        return "DataLoader workers prefetch the batches"

    def edit(self, w: WindowEdges) -> GraphEdit:
        outer = w.model.rules.ctx.outer_op[np.maximum(w.attr, 0)]
        fetch = (w.context == int(HostPurpose.DATA_LOADING)) & (w.attr >= 0) & (outer < 0)
        return w.removing(fetch & (w.host() | (w.kind == int(Edge.SYNC))), np.zeros(w.ids.size, dtype=bool))


class MultiTensorOptimizer(msgspec.Struct, frozen=True):
    """The optimizer's per-parameter loop replaced by one multi-tensor (``foreach=True``) call
    per op. With GPU activity in the trace, one launch per ``chunk`` tensors instead of one per
    parameter: each op the optimizer repeats per parameter keeps one call per chunk, every other
    call saving what the trace's cheapest call of that op took (its fixed cost: dispatch and
    launch). On a CPU-only trace the foreach op loops over the same per-tensor ops in C++ (each
    still runs, nested under it), so their time stays and what leaves is the Python loop that
    called them one by one (``what_if_gaps.loop_between``)."""

    chunk: int = FOREACH_CHUNK

    @property
    def label(self) -> str:
        return "multi-tensor (foreach) optimizer"

    def edit(self, w: WindowEdges) -> GraphEdit:
        optimizer = w.host() & (w.context == int(HostPurpose.OPTIMIZER))
        if w.model.rules.cpu_only:
            return loop_between(w, optimizer)
        return w.fewer_calls(optimizer, self.chunk)[0]


class RemoveRecompute(msgspec.Struct, frozen=True):
    """Activation checkpointing off: the forward ops run again inside backward leave, with the
    GPU work they launch, and so does what ``checkpoint()`` costs where the trace marks it: in
    the forward, each region's entry (``what_if_checkpoint.checkpoint_entries``) and what its
    saved-tensor hooks add to the region's ops (``what_if_checkpoint.forward_at_rerun_cost``); in
    backward, the hook's Python in and after each node that reruns a region (``_hooks``,
    ``what_if_checkpoint.after_rerun_nodes``)."""

    @property
    def label(self) -> str:
        return "no activation recompute in backward"

    def edit(self, w: WindowEdges) -> GraphEdit:
        recompute = w.model.rules.ctx.recompute
        host = (w.attr >= 0) & (recompute[np.maximum(w.attr, 0)] >= 0) & (w.kind != int(Edge.GPU))
        gpu = (w.launch >= 0) & (recompute[np.maximum(w.launch, 0)] >= 0)
        return (w.removing(host, gpu) + self._hooks(w, host) + after_rerun_nodes(w) + checkpoint_entries(w)
                + forward_at_rerun_cost(w))

    @staticmethod
    def _hooks(w: WindowEdges, recomputed: B) -> GraphEdit:
        """The slice the autograd engine reruns the forward in (the node's function, which calls
        the checkpoint's saved-tensor hook) spends its own time, outside any op, in that hook's
        Python: measured on the calibration pair, it fell to what a slice of its name that
        reruns nothing spends. So its own time is scaled to the median of those (none: it stays,
        no reference saying what the node costs without the hook)."""
        rules, ctx, g = w.model.rules, w.model.rules.ctx, w.model.graph
        own = w.host() & ~recomputed
        holders = np.unique(w.attr[own])
        reruns = np.unique(ctx.recompute[w.attr[recomputed]])
        if holders.size == 0 or reruns.size == 0:
            return GraphEdit()
        holds: set[int] = set()
        for r in reruns.tolist():  # the innermost slice around each rerun: the latest to start
            at = rules.slice_ts[r]
            around = holders[(rules.slice_ts[holders] <= at) & (rules.slice_end[holders] > at)
                             & (ctx.tid[holders] == ctx.tid[r])]
            if around.size:
                holds.add(int(around[np.argmax(rules.slice_ts[around])]))
        dur = (g.node_ts[w.dst] - g.node_ts[w.src]).astype(np.float64)
        spent = {int(h): float(dur[own & (w.attr == h)].sum()) for h in holders.tolist()}
        factor: dict[int, float] = {}
        for h in holds:
            others = [spent[o] for o in spent if o not in holds and ctx.name(o) == ctx.name(h)]
            if others and spent[h] > 0:
                factor[h] = min(1.0, float(np.median(others)) / spent[h])
        chosen = own & np.isin(w.attr, list(factor))
        return GraphEdit(scaled=w.ids[chosen], factor=np.array([factor[int(a)] for a in w.attr[chosen]]))


class RemoveCompile(msgspec.Struct, frozen=True):
    """No compilation in the step (warm the cache, mark dynamic shapes): compile phases leave,
    with the GPU work they launch (autotuning); running the compiled code stays."""

    @property
    def label(self) -> str:
        return "no compilation in the step"

    def edit(self, w: WindowEdges) -> GraphEdit:
        host = (w.context == int(HostPurpose.COMPILATION)) & (w.kind != int(Edge.GPU))
        return w.removing(host, w.launch_context == int(HostPurpose.COMPILATION))


class HideCollective(msgspec.Struct, frozen=True):
    """A gradient collective hidden under compute: its kernels leave the compute stream's order
    and nothing waits for them but the optimizer step that reads the gradients (or, without one
    in the window, the step's end). A collective outside backward is read by the work that waits
    for it: that data dependency stays, so the edit leaves it. The host's time in a collective
    call in backward that launches GPU kernels stays: issuing an asynchronous collective (NCCL's
    c10d::allreduce_, record_param_comms, its launches) costs the host the same hidden or not;
    only its waits on the kernels go. A collective call in backward that launches nothing (a CPU
    backend such as gloo moves the data inside the call) leaves the thread with its time, and so
    do such calls made by hand between backward and the optimizer (``reduced_by_hand``), with
    the untraced waits after them: that time runs beside backward, and the optimizer waits for
    it (``host_collectives_lane``). ``collective``: only this one; None: every one."""

    collective: str | None = None

    @property
    def label(self) -> str:
        return f"{self.collective or 'gradient collectives'} hidden under compute"

    def edit(self, w: WindowEdges) -> GraphEdit:
        m = w.model
        rules, g = m.rules, m.graph
        ctx = rules.ctx
        # What no collective's name changes is found once per window: the window's gradient
        # collectives, the host's time in collective calls, and the optimizer that reads them.
        consumer = w.once("optimizer_start", lambda: optimizer_start(w))
        backward = w.once("comm_in_backward", lambda: self._in_backward(w))
        moved = {int(a) for a in w.attr[backward].tolist() if self._matches(w, a)}
        by_hand = w.once("reduced_by_hand", lambda: reduced_by_hand(w, consumer))
        host = w.once("comm_host", lambda: w.host() & (w.context == int(HostPurpose.COMMUNICATION))
                      & ctx.in_backward[np.maximum(w.attr, 0)] | by_hand).copy()
        if self.collective is not None:
            rows = np.flatnonzero(host)
            host[rows] = [ctx.collective[int(a)] == self.collective for a in w.attr[rows].tolist()]
        if moved:
            issuing = top_collective(m.trace, ctx.context, rules.launch[sorted(moved)])
            rows = np.flatnonzero(host)
            host[rows] = ~np.isin(top_collective(m.trace, ctx.context, w.attr[rows]), issuing[issuing >= 0])
        calls = ctx.outer_op[np.maximum(w.attr[host & by_hand], 0)]
        edit = w.removing(host, np.zeros(w.ids.size, dtype=bool)) + untraced_around(w, set(calls.tolist()))
        if not moved:  # the backend runs the collectives on the host (gloo): their time moves
            return edit + host_collectives_lane(w, edit, consumer)
        ends = np.sort(g.end_nodes(np.fromiter(moved, dtype=np.int64, count=len(moved))))
        waits = np.isin(w.src, ends) & np.isin(w.kind, [int(Edge.EVENT_WAIT), int(Edge.SYNC)])
        read = ends[g.node_ts[ends] <= g.node_ts[consumer]] if consumer >= 0 else ends[:0]
        return edit + w.off_stream(moved) + GraphEdit(
            drop=w.ids[waits], add_src=read, add_dst=np.full(read.size, consumer, dtype=np.int64),
            add_weight=np.zeros(read.size, dtype=np.int64), add_kind=np.full(read.size, int(Edge.GPU), dtype=np.int64),
            add_attr=g.node_slice[read])

    @staticmethod
    def _in_backward(w: WindowEdges) -> B:
        """The window's communication kernels launched in backward."""
        launch, ctx = w.launch, w.model.rules.ctx
        comm = (w.kind == int(Edge.GPU)) & (w.category == CATEGORY_CODE[Category.COMMUNICATION])
        mask: B = comm & (launch >= 0) & ctx.in_backward[np.maximum(launch, 0)]
        return mask

    def _matches(self, w: WindowEdges, activity: int) -> bool:
        if self.collective is None:
            return True
        part = w.model.rules.parts[w.model.rules.gpu_part(activity, Category.COMMUNICATION)].name
        return part == f"communication: {self.collective}"


class Fix(Protocol):
    """What every edit is: a label for the table and the edit of one window's graph."""

    @property
    def label(self) -> str: ...

    def edit(self, w: WindowEdges) -> GraphEdit: ...


Edit = (DropSync | OverlapCopies | PrefetchData | MultiTensorOptimizer | RemoveRecompute | RemoveCompile
        | HideCollective | RemoveSlices | RemovePart)
