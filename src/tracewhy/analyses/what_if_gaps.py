"""The untraced host time around ops a fix removes: the Python that called them (a forward
hook, checkpoint()'s wrapper) runs between ops, where the profiler records nothing but the gap.
When the ops go, that Python goes with them, and the thread passes from the op before them to
the op after them in the gap two neighbouring ops usually leave. Also the forward-side ops
``checkpoint()`` records, which leave with checkpointing, and what its saved-tensor hooks add to
the region's forward ops, priced by the same ops run again in backward.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.critical_path_replay import GraphEdit
from tracewhy.model.schema import Col, OpAttrCol

if TYPE_CHECKING:  # what_if_edits imports this module
    from tracewhy.analyses.what_if_window import WindowEdges

B = npt.NDArray[np.bool_]

#: The op ``torch.utils.checkpoint(use_reentrant=False)`` records in the forward before each
#: checkpointed region: the autograd Function that saves the region's inputs (torch 2.x,
#: torch/utils/checkpoint.py). The reentrant checkpoint's Function holds the region's forward
#: ops themselves, so it is no marker to remove.
CHECKPOINT_FORWARD_OPS: Final = frozenset({"_NoopSaveInputs"})


def untraced_around(w: WindowEdges, removed: set[int]) -> GraphEdit:
    """Per thread, each run of consecutive outermost ops that are all in ``removed``: the
    untraced host time (edges outside every op) from the end of the op before the run (or the
    window's start) to the start of the op after it (or the window's end) shrinks to the
    window's typical gap (the median gap between two neighbouring ops neither of which is
    removed). Untraced time only ever shrinks."""
    if not removed:  # no run to shrink around (every call on an nsys export: each scanned 17 M edges)
        return GraphEdit()
    rules, g = w.model.rules, w.model.graph
    ctx = rules.ctx
    attr = np.maximum(w.attr, 0)
    outer = ctx.outer_op[attr]
    host = w.host()
    untraced = host & (outer < 0)
    src_ts, dst_ts = g.node_ts[w.src], g.node_ts[w.dst]
    chosen = np.zeros(w.ids.size, dtype=bool)
    factors = np.ones(w.ids.size, dtype=np.float64)
    for tid in np.unique(ctx.tid[attr[host]]).tolist():
        ops = _ops_in_order(w, host & (ctx.tid[attr] == tid))
        if ops.size < 3:
            continue
        gone = np.isin(ops, list(removed))
        if not gone.any():
            continue
        starts, ends = rules.slice_ts[ops], rules.slice_end[ops]
        kept_pairs = ~gone[:-1] & ~gone[1:]
        if not kept_pairs.any():
            continue
        typical = float(np.median(np.maximum(starts[1:] - ends[:-1], 0)[kept_pairs]))
        on_thread = untraced & (ctx.tid[attr] == tid)
        for first, last in _runs(gone):
            # A run at the window's edge (logging at the step's end) reaches to the window's
            # bound on that side: the code that ran it ends (or starts) the step.
            lo = ends[first - 1] if first > 0 else w.path.window_start
            hi = starts[last + 1] if last < ops.size - 1 else w.path.window_end
            _shrink(on_thread & (src_ts >= lo) & (dst_ts <= hi), typical, src_ts, dst_ts, chosen, factors)
    return GraphEdit(scaled=w.ids[chosen], factor=factors[chosen])


def released_after(w: WindowEdges, calls: list[int]) -> GraphEdit:
    """The untraced time where a grown tensor is released, which a buffer allocated once never
    is: after each growth call (``calls``, outermost ops of one thread) up to the next op (the
    Python drops the tensor the call replaced), and, when the loop ends the step (every op after
    the last call repeats in the window at least once per growth), after the window's last op
    up to its end (the grown tensor dropped as the code returns). Each such stretch shrinks to
    the window's typical gap (the median gap between two neighbouring ops neither of which is a
    growth call); the stretches take what the trace shows there, nothing where it shows none."""
    rules, g = w.model.rules, w.model.graph
    ctx = rules.ctx
    attr = np.maximum(w.attr, 0)
    outer = ctx.outer_op[attr]
    host = w.host()
    tid = ctx.tid[calls[0]]
    on_thread = host & (ctx.tid[attr] == tid)
    ops = _ops_in_order(w, on_thread)
    growth = np.isin(ops, calls)
    starts, ends = rules.slice_ts[ops], rules.slice_end[ops]
    kept_pairs = ~growth[:-1] & ~growth[1:]
    if ops.size < 3 or not kept_pairs.any() or not growth[:-1].any():
        return GraphEdit()
    typical = float(np.median(np.maximum(starts[1:] - ends[:-1], 0)[kept_pairs]))
    spans = [(int(ends[i]), int(starts[i + 1])) for i in np.flatnonzero(growth[:-1]).tolist()]
    last = int(np.flatnonzero(growth)[-1])
    counts = Counter(ctx.name(int(o)) for o in ops.tolist())
    if all(counts[ctx.name(int(o))] >= len(calls) - 1 for o in ops[last + 1:].tolist()):
        spans.append((int(ends[-1]), w.path.window_end))
    untraced = on_thread & (outer < 0)
    src_ts, dst_ts = g.node_ts[w.src], g.node_ts[w.dst]
    chosen = np.zeros(w.ids.size, dtype=bool)
    factors = np.ones(w.ids.size, dtype=np.float64)
    for lo, hi in spans:
        _shrink(untraced & (src_ts >= lo) & (dst_ts <= hi), typical, src_ts, dst_ts, chosen, factors)
    return GraphEdit(scaled=w.ids[chosen], factor=factors[chosen])


def loop_between(w: WindowEdges, host: B) -> GraphEdit:
    """Among these host edges, per thread, the untraced time (edges outside every op) between
    two consecutive outermost ops that both repeat in the window (one call per parameter, by
    name) takes none: the Python of a per-parameter loop, gone when one multi-tensor call per op
    replaces it. A read into Python (``api_names.is_scalar_read``: a value per parameter that no
    multi-tensor op returns) stays with the untraced time on both sides of it; the ops' own time
    stays."""
    rules, g = w.model.rules, w.model.graph
    ctx = rules.ctx
    attr = np.maximum(w.attr, 0)
    outer = ctx.outer_op[attr]
    untraced = host & (outer < 0)
    src_ts, dst_ts = g.node_ts[w.src], g.node_ts[w.dst]
    chosen = np.zeros(w.ids.size, dtype=bool)
    for tid in np.unique(ctx.tid[attr[host]]).tolist():
        ops = _ops_in_order(w, host & (ctx.tid[attr] == tid))
        names = [ctx.name(int(o)) for o in ops.tolist()]
        counts = Counter(names)
        looped = np.array([counts[n] > 1 and not api_names.is_scalar_read(n) for n in names], dtype=bool)
        pairs = np.flatnonzero(looped[:-1] & looped[1:])
        if pairs.size == 0:
            continue
        on_thread = untraced & (ctx.tid[attr] == tid)
        lo, hi = rules.slice_end[ops[pairs]], rules.slice_ts[ops[pairs + 1]]
        # The gap an edge lies in: the last op ending at or before the edge's start.
        at = np.searchsorted(lo, src_ts[on_thread], side="right") - 1
        inside = (at >= 0) & (dst_ts[on_thread] <= hi[np.maximum(at, 0)])
        chosen[np.flatnonzero(on_thread)[inside]] = True
    return GraphEdit(scaled=w.ids[chosen], factor=np.zeros(int(chosen.sum())))


def checkpoint_entries(w: WindowEdges) -> GraphEdit:
    """What ``checkpoint()`` costs in the forward, where the trace marks it: the op it
    records for each checkpointed region (``CHECKPOINT_FORWARD_OPS``) and an op just
    before it that autograd does not record (no sequence number: the dummy tensor it
    makes) leave, with the untraced Python around them, the wrapper's own time
    (``what_if_gaps.untraced_around``). Its saved-tensor hooks run inside the region's
    forward ops, untraced, and so do the recompute's hooks inside the rerun ops: no op of
    the before trace runs without them, so that cost stays."""
    rules = w.model.rules
    ctx = rules.ctx
    outer = ctx.outer_op[np.maximum(w.attr, 0)]
    ops = np.unique(outer[w.host() & (outer >= 0)])
    if not any(ctx.name(int(o)) in CHECKPOINT_FORWARD_OPS for o in ops.tolist()):
        return GraphEdit()
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


def forward_at_rerun_cost(w: WindowEdges) -> GraphEdit:
    """Each forward op of a checkpointed region priced at what the same op cost when backward
    ran it again: ``checkpoint(use_reentrant=False)`` runs the region's forward ops under its
    saved-tensor hooks (Python called inside each op for every tensor autograd saves, untraced,
    so it shows as the op's own time), and without checkpointing the same ops run once with
    no hook. The rerun computes the same ops on the same inputs, under the recompute's hooks
    only: its time is what the op costs there, an upper bound on the hook-free one, so an op
    keeps the smaller of its two times. A region is the ops that follow its entry op
    (``CHECKPOINT_FORWARD_OPS``) on its thread; it pairs with a rerun (the outermost recomputed
    ops under one backward slice) whose ops' names match its first ops in order (a rerun may
    stop early), the latest such region first (backward runs the regions in reverse)."""
    rules = w.model.rules
    ctx = rules.ctx
    attr = np.maximum(w.attr, 0)
    outer = ctx.outer_op[attr]
    host = w.host()
    forward = _ops_in_order(w, host)
    entries = [int(o) for o in np.sort(forward).tolist() if ctx.name(int(o)) in CHECKPOINT_FORWARD_OPS]
    rerun = _rerun_ops(w, host)
    if not entries or rerun.size == 0:
        return GraphEdit()
    parent = w.model.trace.slices.get_column(Col.PARENT).fill_null(-1).to_numpy()
    up = parent[rerun]
    rerun = rerun[(up < 0) | (ctx.recompute[np.maximum(up, 0)] < 0)]  # outermost recomputed ops
    groups: dict[int, list[int]] = {}
    for r in rerun[np.argsort(rules.slice_ts[rerun], kind="stable")].tolist():
        groups.setdefault(int(parent[r]), []).append(int(r))
    pairs: list[tuple[int, int]] = []
    unmatched = sorted(entries, key=lambda e: -int(rules.slice_ts[e]))
    for group in sorted(groups.values(), key=lambda g: int(rules.slice_ts[g[0]])):
        names = [ctx.name(r) for r in group]
        for entry in unmatched:
            after = forward[(rules.slice_ts[forward] > rules.slice_ts[entry]) & (ctx.tid[forward] == ctx.tid[entry])]
            region = after[:len(group)].tolist()
            if [ctx.name(int(f)) for f in region] != names:
                continue
            unmatched.remove(entry)
            pairs.extend((int(f), int(r)) for f, r in zip(region, group, strict=True))
            break
    hooks = _rerun_hook_ns(w, pairs, parent)
    factor: dict[int, float] = {}
    for f, r in pairs:
        own = float(rules.slice_end[f] - rules.slice_ts[f])
        if own > 0:
            factor[f] = min(1.0, (float(rules.slice_end[r] - rules.slice_ts[r]) - hooks[r]) / own)
    chosen = host & np.isin(outer, list(factor))
    return GraphEdit(scaled=w.ids[chosen], factor=np.array([factor[int(o)] for o in outer[chosen]], dtype=np.float64))


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
    owner = np.full(nested.size, -1, dtype=np.int64)
    up = parent[nested]
    todo = np.arange(nested.size)
    while todo.size:
        at = up[todo]
        found = (at >= 0) & is_twin[np.maximum(at, 0)]
        owner[todo[found]] = at[found]
        todo = todo[(at >= 0) & ~found]
        up[todo] = parent[up[todo]]
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
    rules, g = w.model.rules, w.model.graph
    ctx = rules.ctx
    attr = np.maximum(w.attr, 0)
    outer = ctx.outer_op[attr]
    host = w.host()
    rerun = _rerun_ops(w, host)
    nodes = set(np.unique(ctx.outer_op[rerun]).tolist()) - {-1}
    if not nodes:
        return GraphEdit()
    untraced = host & (outer < 0)
    src_ts, dst_ts = g.node_ts[w.src], g.node_ts[w.dst]
    chosen = np.zeros(w.ids.size, dtype=bool)
    factors = np.ones(w.ids.size, dtype=np.float64)
    for tid in np.unique(ctx.tid[list(nodes)]).tolist():
        on_thread = host & (ctx.tid[attr] == tid)
        ops = _ops_in_order(w, on_thread)
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
            span: B = untraced & (ctx.tid[attr] == tid) & (src_ts >= rules.slice_end[ops[i]]) & (
                dst_ts <= rules.slice_ts[ops[i + 1]])
            _shrink(span, float(np.median(gaps[same])), src_ts, dst_ts, chosen, factors)
    return GraphEdit(scaled=w.ids[chosen], factor=factors[chosen])


def _ops_in_order(w: WindowEdges, rows: B) -> npt.NDArray[np.int64]:
    """The outermost ops of the slices these edges (``rows``) are spent in, in start order."""
    rules = w.model.rules
    outer = rules.ctx.outer_op[np.maximum(w.attr, 0)]
    ops = np.unique(outer[rows & (outer >= 0)])
    ordered: npt.NDArray[np.int64] = ops[np.argsort(rules.slice_ts[ops], kind="stable")]
    return ordered


def _rerun_ops(w: WindowEdges, host: B) -> npt.NDArray[np.int64]:
    """The recomputed ops (activation checkpointing's rerun in backward) these host edges are in."""
    recompute = w.model.rules.ctx.recompute
    at = recompute[np.maximum(w.attr, 0)]
    rerun: npt.NDArray[np.int64] = np.unique(at[host & (w.attr >= 0) & (at >= 0)])
    return rerun


def _shrink(span: B, to_ns: float, src_ts: npt.NDArray[np.int64], dst_ts: npt.NDArray[np.int64], chosen: B,
            factors: npt.NDArray[np.float64]) -> None:
    """Scale these untraced edges so that together they take ``to_ns``, where they take more:
    marks them in ``chosen`` and sets their ``factors``."""
    spent = float((dst_ts[span] - src_ts[span]).sum())
    if spent > to_ns:
        chosen |= span
        factors[span] = to_ns / spent


def _runs(flags: B) -> list[tuple[int, int]]:
    """(first, last) index of each run of True."""
    edges = np.diff(np.concatenate(([0], flags.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1).tolist(), (np.flatnonzero(edges == -1) - 1).tolist(), strict=True))
