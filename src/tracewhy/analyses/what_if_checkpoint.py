"""What activation checkpointing (``torch.utils.checkpoint``, ``use_reentrant=False``) costs
besides the rerun itself, priced from the trace for ``RemoveRecompute``: in the forward, each
region's entry (an op the checkpoint records, or where the trace marks none, the untraced
wrapper before the region's first op) and what its saved-tensor hooks add to the region's ops,
priced by the same ops run again in backward without the recompute hook's own ops; in
backward, the untraced time after each node that reran a region.

A region's forward ops and their rerun are paired by their names in order (a rerun may stop
early), each rerun with the latest region not yet paired (backward runs the regions in reverse).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.critical_path_graph import nearest_marked
from tracewhy.analyses.critical_path_replay import GraphEdit
from tracewhy.analyses.what_if_gaps import Untraced, ops_in_order, untraced_around, untraced_before
from tracewhy.model.schema import Col, OpAttrCol

if TYPE_CHECKING:  # what_if_edits imports this module
    from tracewhy.analyses.what_if_window import WindowEdges

B = npt.NDArray[np.bool_]
Pairs = list[tuple[int, int]]

#: The op ``torch.utils.checkpoint(use_reentrant=False)`` records in the forward before each
#: checkpointed region: the autograd Function that saves the region's inputs (torch 2.x up to
#: 2.11 at least, torch/utils/checkpoint.py; torch 2.13 saves them with ``_make_saved_tensor``
#: and records no op: its regions are found from their reruns, ``_by_names``). The reentrant
#: checkpoint's Function holds the region's forward ops themselves, so it is no marker to remove.
CHECKPOINT_FORWARD_OPS: Final = frozenset({"_NoopSaveInputs"})


def checkpoint_entries(w: WindowEdges) -> GraphEdit:
    """What ``checkpoint()`` costs in the forward around each region. Where the trace marks it:
    the op it records for each region (``CHECKPOINT_FORWARD_OPS``) and an op just before it
    that autograd does not record (no sequence number: the dummy tensor it makes) leave, with
    the untraced Python around them, the wrapper's own time (``what_if_gaps.untraced_around``).
    Where it marks none (torch 2.13), the wrapper's Python is the untraced time just before each
    region's first op (paired with a rerun, ``regions``): it shrinks to the window's typical gap
    (``what_if_gaps.untraced_before``). Its saved-tensor hooks run inside the region's forward
    ops, untraced (``forward_at_rerun_cost``)."""
    rules = w.model.rules
    ctx = rules.ctx
    outer = ctx.outer_op[np.maximum(w.attr, 0)]
    ops = np.unique(outer[w.host() & (outer >= 0)])
    if not any(ctx.name(int(o)) in CHECKPOINT_FORWARD_OPS for o in ops.tolist()):
        return untraced_before(w, {region[0][0] for region in regions(w)})
    ops = ops[np.lexsort((rules.slice_ts[ops], ctx.tid[ops]))]
    recorded = set(w.model.trace.op_attrs.filter(pl.col(OpAttrCol.SEQUENCE).is_not_null())
                   .get_column(OpAttrCol.ID).to_list())
    removed: set[int] = set()
    for i, op in enumerate(ops.tolist()):
        if ctx.name(op) not in CHECKPOINT_FORWARD_OPS:
            continue
        removed.add(op)
        before = int(ops[i - 1]) if i else -1
        if before >= 0 and ctx.tid[before] == ctx.tid[op] and before not in recorded:
            removed.add(before)
    chosen = w.host() & np.isin(outer, list(removed))
    return w.removing(chosen, np.zeros(w.ids.size, dtype=bool)) + untraced_around(w, removed)


def regions(w: WindowEdges) -> list[Pairs]:
    """The window's checkpointed regions that backward reran: per region, its (forward op, rerun
    op) pairs in order. A rerun is the outermost recomputed ops under one backward slice; where
    the trace marks each region's entry (``CHECKPOINT_FORWARD_OPS``), its region is the ops that
    follow an entry on its thread (``_after_entries``), else a run of forward ops with the
    rerun's names (``_by_names``). Found once per window."""
    return w.once("checkpoint:regions", lambda: _regions(w))


def _regions(w: WindowEdges) -> list[Pairs]:
    rules = w.model.rules
    ctx = rules.ctx
    host = w.host()
    rerun = _rerun_ops(w, host)
    if rerun.size == 0:
        return []
    forward = ops_in_order(w, host)
    entries = [int(o) for o in np.sort(forward).tolist() if ctx.name(int(o)) in CHECKPOINT_FORWARD_OPS]
    parent = _parents(w)
    up = parent[rerun]
    rerun = rerun[(up < 0) | (ctx.recompute[np.maximum(up, 0)] < 0)]  # outermost recomputed ops
    groups: dict[int, list[int]] = {}
    for r in rerun[np.argsort(rules.slice_ts[rerun], kind="stable")].tolist():
        groups.setdefault(int(parent[r]), []).append(int(r))
    reruns = sorted(groups.values(), key=lambda g: int(rules.slice_ts[g[0]]))
    return _after_entries(w, forward, entries, reruns) if entries else _by_names(w, forward, reruns)


def _parents(w: WindowEdges) -> npt.NDArray[np.int64]:
    """Each slice's parent (-1: none), read once per window for the regions and their prices."""
    return w.once("checkpoint:parents",
                  lambda: w.model.trace.slices.get_column(Col.PARENT).fill_null(-1).to_numpy())


def forward_at_rerun_cost(w: WindowEdges) -> GraphEdit:
    """Each forward op of a checkpointed region (``regions``) priced at what the same op cost
    when backward ran it again: ``checkpoint(use_reentrant=False)`` runs the region's forward
    ops under its saved-tensor hooks (Python called inside each op for every tensor autograd
    saves, untraced, so it shows as the op's own time), and without checkpointing the same ops
    run once with no hook. The rerun computes the same ops on the same inputs, under the
    recompute's hooks only: its time without the ops those hooks call (``_rerun_hook_ns``) is
    what the op costs there, an upper bound on the hook-free one, so an op keeps the smaller of
    its two times."""
    rules = w.model.rules
    outer = rules.ctx.outer_op[np.maximum(w.attr, 0)]
    pairs = [pair for region in regions(w) for pair in region]
    hooks = _rerun_hook_ns(w, pairs, _parents(w))
    factor: dict[int, float] = {}
    for f, r in pairs:
        own = float(rules.slice_end[f] - rules.slice_ts[f])
        if own > 0:
            factor[f] = min(1.0, (float(rules.slice_end[r] - rules.slice_ts[r]) - hooks[r]) / own)
    chosen = w.host() & np.isin(outer, list(factor))
    return GraphEdit(scaled=w.ids[chosen], factor=np.array([factor[int(o)] for o in outer[chosen]], dtype=np.float64))


def _after_entries(w: WindowEdges, forward: npt.NDArray[np.int64], entries: list[int], reruns: list[list[int]]
                   ) -> list[Pairs]:
    """Each rerun (in time order) with the latest region whose entry op's next ops on its
    thread have the rerun's names in order."""
    rules, ctx = w.model.rules, w.model.rules.ctx
    out: list[Pairs] = []
    unmatched = sorted(entries, key=lambda e: -int(rules.slice_ts[e]))
    for group in reruns:
        names = [ctx.name(r) for r in group]
        for entry in unmatched:
            after = forward[(rules.slice_ts[forward] > rules.slice_ts[entry]) & (ctx.tid[forward] == ctx.tid[entry])]
            region = after[:len(group)].tolist()
            if [ctx.name(int(f)) for f in region] != names:
                continue
            unmatched.remove(entry)
            out.append([(int(f), int(r)) for f, r in zip(region, group, strict=True)])
            break
    return out


def _by_names(w: WindowEdges, forward: npt.NDArray[np.int64], reruns: list[list[int]]) -> list[Pairs]:
    """Where the trace marks no region's entry (torch 2.13's checkpoint saves the region's
    inputs without recording an op): each rerun (in time order) with the latest run of
    consecutive outermost ops of one thread, starting before the rerun and not yet paired,
    whose names are the rerun's in order (in a window of several iterations, each backward's
    reruns find their own forward's regions)."""
    rules, ctx = w.model.rules, w.model.rules.ctx
    ops = forward[rules.slice_ts[forward] < max(rules.slice_ts[g[0]] for g in reruns)]
    names = [ctx.name(int(o)) for o in ops.tolist()]
    ts = rules.slice_ts[ops]
    tids = ctx.tid[ops]
    free = np.ones(ops.size, dtype=bool)
    starts: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        starts.setdefault(name, []).append(i)
    out: list[Pairs] = []
    for group in reruns:
        want = [ctx.name(r) for r in group]
        k = len(want)
        for i in reversed(starts.get(want[0], [])):
            if ts[i] >= rules.slice_ts[group[0]]:
                continue
            if names[i:i + k] == want and free[i:i + k].all() and (tids[i:i + k] == tids[i]).all():
                free[i:i + k] = False
                out.append([(int(f), int(r)) for f, r in zip(ops[i:i + k].tolist(), group, strict=True)])
                break
    return out


def _rerun_hook_ns(w: WindowEdges, pairs: list[tuple[int, int]], parent: npt.NDArray[np.int64]) -> dict[int, float]:
    """Per rerun op of these (forward op, rerun op) pairs: the time of the ops nested in it under
    a name that nothing nested in its forward twin has, outermost ones only. They are the
    recompute's saved-tensor hook's, not the op's: it detaches each tensor it keeps that
    requires grad (``aten::detach`` in the rerun ``aten::addmm`` and ``aten::gelu``, none in
    their forward twins), which the op run without checkpointing never does."""
    if not pairs:
        return {}
    rules, ctx = w.model.rules, w.model.rules.ctx
    twins = np.array(sorted({op for pair in pairs for op in pair}), dtype=np.int64)
    is_twin = np.zeros(parent.size, dtype=bool)
    is_twin[twins] = True
    # Every slice under the twins' outermost ops, then each one's nearest twin above it.
    nested = np.flatnonzero(np.isin(ctx.outer_op, np.unique(ctx.outer_op[twins])) & ~is_twin)
    owner = nearest_marked(parent, parent[nested], is_twin)
    under: dict[int, list[int]] = {}
    for s, o in zip(nested[owner >= 0].tolist(), owner[owner >= 0].tolist(), strict=True):
        under.setdefault(o, []).append(s)
    hooks: dict[int, float] = {}
    for f, r in pairs:
        known = {ctx.name(s) for s in under.get(f, [])}
        extra = {s for s in under.get(r, []) if ctx.name(s) not in known}
        hooks[r] = float(sum(int(rules.slice_end[s] - rules.slice_ts[s]) for s in extra if int(parent[s]) not in extra))
    return hooks


def after_rerun_nodes(w: WindowEdges) -> GraphEdit:
    """The untraced time after each backward node that reran a checkpointed region (the
    outermost op around a rerun op) up to the next op, where the checkpoint's Python finishes
    with the rerun (most likely dropping the tensors it made): it shrinks to the median gap
    after the window's nodes of the same name that reran nothing (none: it stays), as the
    node's own time does in ``RemoveRecompute``."""
    rules = w.model.rules
    ctx = rules.ctx
    rerun = _rerun_ops(w, w.host())
    nodes = set(np.unique(ctx.outer_op[rerun]).tolist()) - {-1}
    if not nodes:
        return GraphEdit()
    u = Untraced(w)
    for tid in np.unique(ctx.tid[list(nodes)]).tolist():
        ops = ops_in_order(w, u.host & (u.tid == tid))
        gaps = np.maximum(rules.slice_ts[ops[1:]] - rules.slice_end[ops[:-1]], 0)
        names = [ctx.name(int(o)) for o in ops[:-1].tolist()]
        held = np.isin(ops[:-1], list(nodes))
        # Each name's gaps after its nodes that reran nothing, gathered once for every held node.
        free: dict[str, list[int]] = {}
        for j in np.flatnonzero(~held).tolist():
            free.setdefault(names[j], []).append(j)
        for i in np.flatnonzero(held).tolist():
            same = free.get(names[i])
            if not same:
                continue
            u.shrink(u.between(tid, rules.slice_end[ops[i]], rules.slice_ts[ops[i + 1]]), float(np.median(gaps[same])))
    return u.edit()


def _rerun_ops(w: WindowEdges, host: B) -> npt.NDArray[np.int64]:
    """The recomputed ops (activation checkpointing's rerun in backward) these host edges are in."""
    recompute = w.model.rules.ctx.recompute
    at = recompute[np.maximum(w.attr, 0)]
    rerun: npt.NDArray[np.int64] = np.unique(at[host & (w.attr >= 0) & (at >= 0)])
    return rerun
