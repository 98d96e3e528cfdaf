"""Backward passes inside a step, and the collectives each one issues: gradient accumulation over
micro-batches runs forward and backward several times per optimizer step, and a data-parallel
wrapper that is not told to skip the reduction (DDP's ``no_sync()``) all-reduces the gradients
after every one of them, where only the last is needed.

A backward pass is a run of the autograd engine's outermost nodes (``HostContext.in_backward``,
on whichever thread the engine runs them) that no forward work of the step's own thread
interrupts; a pass's collectives are the reducing collective calls (their context:
communication, none of their ancestors one; all-reduce, reduce-scatter: ``api_names.is_reduction``)
that start between the pass's first node and the next pass's. FSDP's all-gathers in backward
(parameters gathered again) are needed in every pass and are not counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import numpy as np
import numpy.typing as npt

from tracewhy.analyses import api_names
from tracewhy.analyses.account import StepModel, WindowPath
from tracewhy.analyses.account_host import HostPurpose
from tracewhy.analyses.account_names import PartKind
from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.critical_path_replay import GraphEdit
from tracewhy.analyses.steps import WindowCol
from tracewhy.model.schema import KIND_CODE, Kind

if TYPE_CHECKING:
    from tracewhy.analyses.what_if_window import WindowEdges

I64 = npt.NDArray[np.int64]


class BackwardPasses(msgspec.Struct, frozen=True):
    """One analysed window's backward passes: ``starts`` (each pass's first node's start, in time
    order) and, per pass, the collective calls that start in it (``calls``, slice ids)."""

    starts: tuple[int, ...]
    calls: tuple[tuple[int, ...], ...]

    @property
    def reducing(self) -> int:
        """How many passes issue collectives."""
        return sum(1 for c in self.calls if c)


def backward_passes(model: StepModel, path: WindowPath, parent: I64 | None) -> BackwardPasses:
    """The backward passes of one analysed window of ``model`` and the collectives of each;
    ``parent``: the host nesting (``HostTree.parent``; None: the passes alone, no calls)."""
    hc, ts, end = model.rules.ctx, model.rules.slice_ts, model.rules.slice_end
    ids = np.arange(hc.outer_op.size)
    lo, hi = path.window_start, path.window_end
    in_window = (ts >= lo) & (ts < hi) & (hc.pid == path.pid)
    outermost = (hc.outer_op == ids) & in_window
    nodes = ids[outermost & hc.in_backward]
    if nodes.size == 0:
        return BackwardPasses((), ())
    nodes = nodes[np.argsort(ts[nodes], kind="stable")]
    ops = model.rules.kind_code == KIND_CODE[Kind.CPU_OP.value]
    in_comm = hc.context == int(HostPurpose.COMMUNICATION)
    comm = ids[:0] if parent is None else ids[in_comm & ops & in_window
                                             & ((parent < 0) | ~in_comm[np.maximum(parent, 0)])]
    comm = comm[[api_names.is_reduction(hc.collective[int(c)] or "") for c in comm.tolist()]] if comm.size else comm
    # Forward work: the step thread's outermost ops outside backward that are no collective (a
    # reducer's call, a wait) and not the optimizer's.
    candidates = outermost & ~hc.in_backward & ~in_comm & (hc.context != int(HostPurpose.OPTIMIZER))
    marker = model.found.windows.get_column(WindowCol.STEP_ID)[path.step]
    if marker is not None:
        thread = hc.tid[int(marker)]
    else:  # no marker: the thread that runs the most of that work
        tids, counts = np.unique(hc.tid[ids[candidates]], return_counts=True)
        thread = tids[np.argmax(counts)] if tids.size else -1
    forward = ids[candidates & (hc.tid == thread)]
    forward_ts = np.sort(ts[forward])
    # A new pass starts at a node with forward work between it and the node before it.
    between = np.searchsorted(forward_ts, ts[nodes[1:]]) - np.searchsorted(forward_ts, end[nodes[:-1]])
    first = np.r_[0, np.flatnonzero(between > 0) + 1]
    starts = ts[nodes[first]]
    bounds = np.r_[starts[1:], hi]
    calls = tuple(tuple(int(c) for c in comm[(ts[comm] >= s) & (ts[comm] < e)]) for s, e in zip(starts, bounds,
                                                                                                 strict=True))
    return BackwardPasses(tuple(int(s) for s in starts), calls)


class ReduceOnce(msgspec.Struct, frozen=True):
    """Gradients accumulated over a step's micro-batches and reduced once, after the last
    backward (DDP's ``no_sync()`` around the others): what the account puts in the reducing
    collectives' communication parts from a step's first backward pass to the start of its last
    (the calls, the waits on them, the backend's work on the critical path, the GPU's collective
    kernels) leaves,
    with the DDP reducer's own ops there (``api_names.is_ddp_reducer``: the reduced buckets
    copied back into the gradients), which a pass that does not synchronize does not run. The
    wrapper's gradient hooks stay: they run in every pass, inside the autograd nodes, and the
    trace holds no pass without them to price them from."""

    @property
    def label(self) -> str:
        return "gradients reduced once per step"

    def edit(self, w: WindowEdges) -> GraphEdit:
        passes = backward_passes(w.model, w.path, None)
        if len(passes.starts) < 2:
            return GraphEdit()
        comm = np.zeros(w.ids.size, dtype=bool)
        for part in w.model.rules.parts:
            if part.kind == PartKind.COMMUNICATION and api_names.is_reduction(part.name):
                comm |= w.in_part(part.name)
        ctx = w.model.rules.ctx
        outer = ctx.outer_op[np.maximum(w.attr, 0)]
        ops = np.unique(outer[w.host() & (outer >= 0)])
        reducer = ops[[api_names.is_ddp_reducer(ctx.name(int(o))) for o in ops.tolist()]] if ops.size else ops
        at = w.model.graph.node_ts[w.src]
        held = comm | (w.host() & np.isin(outer, reducer) & (w.attr >= 0))
        chosen = held & (at >= passes.starts[0]) & (at < passes.starts[-1])
        gpu = chosen & (w.kind == int(Edge.GPU))
        return w.removing(chosen & ~gpu, gpu)
