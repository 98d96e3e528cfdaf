"""How much of the step's critical path communication holds, which bounds what hiding it under
compute (``what_if_edits.HideCollective``) can save: exposed communication (no compute kernel
beside it on the GPU) that runs while the path is on the host, or on compute the collectives
run beside, is off the path, and hiding it changes nothing. Also which collective calls reduce
gradients by hand (after backward, before the optimizer), which that edit hides as well, and
where the time of a collective run on the host (a CPU backend) goes when it is hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import msgspec
import numpy as np
import numpy.typing as npt

from tracewhy.analyses.account import StepModel, WindowPath
from tracewhy.analyses.account_host import HostPurpose
from tracewhy.analyses.account_names import PartKind
from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.critical_path_replay import GraphEdit
from tracewhy.analyses.intervals import covered_ns

if TYPE_CHECKING:  # what_if_edits imports this module
    from tracewhy.analyses.what_if_window import WindowEdges


class CommOnPath(msgspec.Struct, frozen=True):
    """Means per analysed step (the account's): the collective kernels' time on the critical path,
    and the rest of communication's time there (host time in the collective calls, their launches,
    waits on them)."""

    kernels_ns: int
    calls_ns: int
    steps: int

    @property
    def total_ns(self) -> int:
        return self.kernels_ns + self.calls_ns


def comm_on_path(model: StepModel, paths: Sequence[WindowPath] | None = None) -> CommOnPath:
    """Communication's time on these steps' critical paths (default: every analysed step's),
    kernels apart from the rest."""
    rules, g = model.rules, model.graph
    paths = model.paths if paths is None else paths
    kernels = calls = 0
    for p in paths:
        e = p.edges
        if e.size == 0:
            continue
        part = model.edge_parts.of(e)
        comm_parts = [i for i, x in enumerate(rules.parts) if x.kind == PartKind.COMMUNICATION]
        comm = np.isin(part, comm_parts)
        dur = g.node_ts[g.dst[e]] - np.maximum(g.node_ts[g.src[e]], p.window_start)
        running = g.kind[e] == int(Edge.GPU)
        kernels += int(dur[comm & running].sum())
        calls += int(dur[comm & ~running].sum())
    n = max(len(paths), 1)
    return CommOnPath(kernels_ns=round(kernels / n), calls_ns=round(calls / n), steps=len(paths))


def reduced_by_hand(w: WindowEdges, optimizer_start: int) -> npt.NDArray[np.bool_]:
    """The window's host edges in collective calls that run after its last backward op and
    before the optimizer (node ``optimizer_start``; -1: none, the window's end) and launch no GPU
    work: gradients all-reduced by hand once backward is done, on a CPU backend (gloo moves the
    data inside the call, its waits untraced after it). DDP would issue them from backward's
    gradient hooks, on gloo's own thread, while backward computes the rest."""
    g, ctx = w.model.graph, w.model.rules.ctx
    host = w.host()
    comm = host & (w.context == int(HostPurpose.COMMUNICATION)) & ~ctx.in_backward[np.maximum(w.attr, 0)]
    backward = host & (w.context == int(HostPurpose.BACKWARD))
    if not comm.any() or not backward.any():
        return np.zeros(w.ids.size, dtype=bool)
    after = g.node_ts[w.src] >= g.node_ts[w.dst[backward]].max()
    if optimizer_start >= 0:
        after &= g.node_ts[w.dst] <= g.node_ts[optimizer_start]
    launching = np.unique(w.launch[(w.kind == int(Edge.GPU)) & (w.launch >= 0)])
    calls = w.model.rules.ctx.outer_op[np.maximum(w.attr, 0)]
    chosen: npt.NDArray[np.bool_] = comm & after & ~np.isin(calls, ctx.outer_op[launching])
    return chosen


def optimizer_start(w: WindowEdges) -> int:
    """The start node of the first optimizer-context slice in the window (-1: none): what reads
    the gradients a collective reduced."""
    g = w.model.graph
    opt = w.host() & (w.context == int(HostPurpose.OPTIMIZER))
    if not opt.any():
        return -1
    starts = w.src[opt][w.src[opt] % 2 == 0]
    if starts.size == 0:
        return -1
    return int(starts[np.argmin(g.node_ts[starts])])


#: The autograd node that hands a parameter its gradient (its RecordFunction name ends so:
#: ``torch::autograd::AccumulateGrad``, under ``autograd::engine::evaluate_function: ...``).
ACCUMULATE_NODE: Final = "AccumulateGrad"


def host_collectives_lane(w: WindowEdges, removed: GraphEdit, consumer: int) -> GraphEdit:
    """Where the time of collectives run on the host goes when they are hidden. A CPU backend
    (gloo) moves and sums the data itself, in the call and the untraced waits after it
    (``removed``: the edit that takes that time off the calling thread); hidden under backward
    (DDP's gradient hooks) the same work runs on the backend's own thread, one collective after
    another, from when the first gradient exists (the end of backward's first ``AccumulateGrad``
    node, else backward's start; or the first call's start, for calls from backward) to what
    reads the gradients (``consumer``, the optimizer's start; -1: the window's end). So one edge
    of that much time joins the two: the step is no shorter than backward's first gradient plus
    all the data moved. That time is the removed edges' on the clock, not their sum: the calling
    thread waits while the backend's thread works (``gloo:all_reduce`` ranges on its own
    threads), the same time on two threads."""
    g = w.model.graph
    if removed.scaled.size == 0:
        return GraphEdit()
    start_ns = g.node_ts[g.src[removed.scaled]]
    left = np.round(w.model.replay.weight[removed.scaled] * (1.0 - removed.factor)).astype(np.int64)
    moved = covered_ns(start_ns, start_ns + left)
    in_calls = w.host() & np.isin(w.ids, removed.scaled) & (w.context == int(HostPurpose.COMMUNICATION))
    calls = w.ids[in_calls]
    # A call from backward's hooks had its gradient when it started.
    starts = np.r_[_first_gradient(w), w.src[in_calls]]
    starts = starts[starts >= 0]
    start = int(starts[np.argmin(g.node_ts[starts])]) if starts.size else -1
    end = consumer if consumer >= 0 else w.path.sink
    if moved <= 0 or start < 0 or end < 0 or g.node_ts[start] > g.node_ts[end]:
        return GraphEdit()
    # The time is the collective's: the part of its call's longest edge.
    like = int(calls[np.argmax(w.model.replay.weight[calls])]) if calls.size else -1
    attr = int(g.attr[like]) if like >= 0 else -1
    return GraphEdit(add_src=np.array([start]), add_dst=np.array([end]), add_weight=np.array([moved]),
                     add_kind=np.array([int(Edge.HOST)]), add_attr=np.array([attr]), add_like=np.array([like]))


def _first_gradient(w: WindowEdges) -> int:
    """The node where backward's first ``AccumulateGrad`` node ends (else backward's first
    instant); -1 without backward in the window."""
    g, ctx = w.model.graph, w.model.rules.ctx
    backward = w.host() & (w.context == int(HostPurpose.BACKWARD))
    if not backward.any():
        return -1
    outer = ctx.outer_op[np.maximum(w.attr, 0)]
    ops = np.unique(outer[backward & (outer >= 0)])
    accumulate = [int(o) for o in ops.tolist() if ctx.name(int(o)).endswith(ACCUMULATE_NODE)]
    if not accumulate:
        src = w.src[backward]
        return int(src[np.argmin(g.node_ts[src])])
    first = min(accumulate, key=lambda o: int(w.model.rules.slice_ts[o]))
    dst = w.dst[backward & (outer == first)]
    return int(dst[np.argmax(g.node_ts[dst])])

