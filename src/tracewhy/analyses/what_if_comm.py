"""How much of the step's critical path communication holds, which bounds what hiding it under
compute (``what_if_edits.HideCollective``) can save: exposed communication (no compute kernel
beside it on the GPU) that runs while the path is on the host, or on compute the collectives
run beside, is off the path, and hiding it changes nothing. Also which collective calls reduce
gradients by hand (after backward, before the optimizer), which that edit hides as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tracewhy.analyses.account import StepModel, WindowPath
from tracewhy.analyses.account_host import HostPurpose
from tracewhy.analyses.account_names import PartKind
from tracewhy.analyses.critical_path_edges import Edge

if TYPE_CHECKING:  # what_if_edits imports this module
    from tracewhy.analyses.what_if_edits import WindowEdges


@dataclass(frozen=True)
class CommOnPath:
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
        part, _, _ = rules.of_edges(g.kind[e].astype(np.int64), g.attr[e], rules.category[e], g.src[e], g.dst[e])
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
