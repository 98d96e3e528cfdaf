"""Untraced host time that is a wait on a collective another thread runs.

A CPU backend (gloo) runs each collective on its own worker threads, each recorded as a range
(``gloo:all_reduce``, a communication context), while the thread that issued it returns from
``c10d::allreduce_`` and waits in ``work.wait()``, which nothing records. That wait reaches the
account as untraced host time ("idle: untraced Python") though the trace shows what it waited
for: a communication range of the same process, on another thread, running through it. Such
time is the collective's (its part and the range as evidence): told by threads, time and the
ranges' context, not by names. Only on a trace with no GPU activity: there a collective's range
is the data moving; beside a GPU, NCCL's ranges are a thread issuing kernels, which nothing
waits on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from tracewhy.analyses.account_host import HostPurpose
from tracewhy.analyses.account_names import PartKind, PartName
from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.intervals import union

if TYPE_CHECKING:  # account_parts calls this module
    from tracewhy.analyses.account_parts import PartRules

I64 = npt.NDArray[np.int64]

#: Untraced time counts as a wait on communication when ranges of it (on other threads of the
#: process) cover at least this share of it: more of the stretch waited on them than not.
WAIT_COVER_MIN: Final = 0.5


def waits_on_collectives(rules: PartRules, kind: I64, src: I64, dst: I64, part: I64, item: I64
                         ) -> tuple[I64, I64]:
    """``part`` and ``item`` with untraced host edges that communication ranges on other threads
    of their process cover (``WAIT_COVER_MIN``) given to the covering collective."""
    if not rules.cpu_only:  # NCCL's ranges are the issuing of GPU work, not the data moving
        return part, item
    untraced = rules.part(PartName.UNTRACED, PartKind.IDLE)
    chosen = np.flatnonzero((part == untraced) & (kind == int(Edge.HOST)))
    if chosen.size == 0:
        return part, item
    ctx, g = rules.ctx, rules.graph
    ranges = np.flatnonzero(ctx.context == int(HostPurpose.COMMUNICATION))
    if ranges.size == 0:
        return part, item
    a, b = g.node_ts[src[chosen]], g.node_ts[dst[chosen]]
    on = g.node_slice[src[chosen]]
    pid, tid = ctx.pid[on], ctx.tid[on]
    part, item = part.copy(), item.copy()
    for p, t in sorted(set(zip(pid.tolist(), tid.tolist(), strict=True))):
        mine = ranges[(ctx.pid[ranges] == p) & (ctx.tid[ranges] != t)]
        rows = np.flatnonzero((pid == p) & (tid == t))
        if mine.size == 0:
            continue
        lo, hi = union(rules.slice_ts[mine], rules.slice_end[mine])
        # Each run is named by its first range (the earliest start; ties in id order).
        by_start = mine[np.argsort(rules.slice_ts[mine], kind="stable")]
        first = by_start[np.searchsorted(rules.slice_ts[by_start], lo)]
        covered = _covered(lo, hi, b[rows]) - _covered(lo, hi, a[rows])
        length = b[rows] - a[rows]
        waits = (length > 0) & (covered >= WAIT_COVER_MIN * length)
        # The run of ranges around the stretch's middle names the collective.
        at = np.clip(np.searchsorted(lo, (a[rows] + b[rows]) // 2, side="right") - 1, 0, lo.size - 1)
        for r, k in zip(rows[waits].tolist(), at[waits].tolist(), strict=True):
            range_id = int(first[k])
            collective = ctx.collective[range_id] or "collective"
            part[chosen[r]] = rules.part(f"communication: {collective}", PartKind.COMMUNICATION)
            item[chosen[r]] = rules.item(ctx.name(range_id))
    return part, item


def _covered(lo: I64, hi: I64, t: I64) -> I64:
    """How much of the runs [lo, hi) lies before each time ``t``."""
    done = np.r_[0, np.cumsum(hi - lo)]
    k = np.searchsorted(lo, t, side="right")  # runs that start at or before t
    inside = np.where(k > 0, np.minimum(t, hi[np.maximum(k - 1, 0)]) - lo[np.maximum(k - 1, 0)], 0)
    out: I64 = done[np.maximum(k - 1, 0)] * (k > 0) + np.maximum(inside, 0)
    return out
