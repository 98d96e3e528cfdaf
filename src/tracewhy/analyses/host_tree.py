"""The host nesting as arrays indexed by slice id (``HostTree``): each slice's parent, depth and
kind, what is an op, the nearest marked slice at or above each one, level by level, and the
top of each parent chain. The source lines, the step account, memory and the anti-pattern and
extra-copy analyses share one tree per trace (``Context.host_tree``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.id_arrays import Ids, narrow
from tracewhy.analyses.name_codes import decide
from tracewhy.model import compiled
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, HOST_KINDS, Col, Kind
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
B = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class HostTree:
    """The host nesting as arrays indexed by slice id (-1: none), with what each slice is."""

    parent: Ids
    depth: Ids
    ts: I64
    dur: I64
    is_python: B
    is_op: B
    is_sync: B  # outermost sync point: a scalar read or a blocking call not inside another one
    gpu_self: I64  # GPU time of the work this slice launched itself

    @staticmethod
    def of(trace: Trace) -> HostTree:
        s = trace.slices
        n = s.height
        kind = s.get_column(Col.KIND)
        host = kind.is_in([k.value for k in HOST_KINDS]).to_numpy()
        # (Slice ids and depths int32 where they fit, ``id_arrays.narrow``: the tree lives as long as
        # the diagnosis, 62 MB an int64 column on an 8 M-slice export.)
        parent = narrow(np.where(host, s.get_column(Col.PARENT).fill_null(-1).to_numpy(), -1))
        depth = narrow(np.where(host, s.get_column(Col.DEPTH).fill_null(0).to_numpy(), -1))
        names = s.get_column(Col.NAME)
        texts = names.unique().drop_nulls().cast(pl.String).to_list()
        pretests = api_names.PRETESTS
        scalar = decide(texts, api_names.is_scalar_read, pretests[api_names.is_scalar_read], False)
        call = decide(texts, api_names.is_sync_call, pretests[api_names.is_sync_call], False)
        reads = [u for u, a, b in zip(texts, scalar, call, strict=True) if a or b]
        sync = names.is_in(reads).to_numpy() & host if reads else np.zeros(n, dtype=bool)
        gpu = s.filter(kind.is_in([k.value for k in GPU_ACTIVITY_KINDS]) & pl.col(Col.LAUNCH).is_not_null())
        gpu_self = np.bincount(gpu.get_column(Col.LAUNCH).to_numpy(), weights=gpu.get_column(Col.DUR).to_numpy(),
                               minlength=n).astype(np.int64)
        tree = HostTree(parent=parent, depth=depth, ts=s.get_column(Col.TS).to_numpy(),
                     dur=s.get_column(Col.DUR).to_numpy(), is_python=(kind == Kind.PYTHON.value).to_numpy(),
                     is_op=(kind == Kind.CPU_OP.value).to_numpy(), is_sync=sync, gpu_self=gpu_self[:n])
        out = replace(tree, is_sync=sync & (tree.nearest(sync, strict=True) < 0))
        # (The same parents and depths: the levels made for that ``nearest`` serve the tree kept,
        # which made them again, 0.6 s on an 8 M-slice export.)
        object.__setattr__(out, "_levels", tree.__dict__["_levels"])
        return out

    @property
    def outermost_op(self) -> B:
        """CPU ops not inside another CPU op: what a Python line called itself."""
        inside: B = self.nearest(self.is_op, strict=True) >= 0
        return self.is_op & ~inside

    def levels(self) -> list[I64]:
        """Host slice ids by depth 1, 2, ...: a parent's level comes before its children's."""
        rows = np.flatnonzero((self.depth > 0) & (self.parent >= 0))
        order = rows[np.argsort(self.depth[rows], kind="stable")]
        bounds = np.flatnonzero(np.diff(self.depth[order])) + 1
        return np.split(order, bounds) if order.size else []

    def nearest(self, mark: B, strict: bool = False) -> I64:
        """Per slice, the nearest slice at or above it (``strict``: above it) with ``mark``; -1: none."""
        by_level = self._by_level()
        at_or_above = nearest_marked(self.parent, mark) if by_level is None else _nearest_by_level(mark, *by_level)
        if not strict:
            return at_or_above
        has_parent = self.parent >= 0
        return np.where(has_parent, at_or_above[np.maximum(self.parent, 0)], -1)

    def outermost(self, mark: B) -> I64 | None:
        """Per slice, the outermost slice with ``mark`` at or above it (-1: none), a level at a
        time: a slice takes its parent's answer, or itself when marked and its parent has none.
        None where ``depth`` does not count the parent chain (``_by_level``)."""
        by_level = self._by_level()
        if by_level is None:
            return None
        rows, parents, cuts = by_level
        fast = compiled.loops(mark.size, load=False)
        if fast is not None:
            done: I64 = fast.outermost_by_level(np.ascontiguousarray(mark, dtype=np.bool_), rows, parents,
                                                np.empty(mark.size, dtype=np.int64))
            return done
        outer: I64 = np.where(mark, np.arange(mark.size, dtype=np.int64), -1)
        for lo, hi in itertools.pairwise(cuts):
            r = rows[lo:hi]
            above = outer[parents[lo:hi]]
            outer[r] = np.where(above >= 0, above, outer[r])
        return outer

    def _by_level(self) -> tuple[I32, I32, list[int]] | None:
        """The slices with a parent by depth (a parent's level before its children's), their
        parents, and where each level starts; made once per tree, for ``nearest``, whose pointer
        jumping took 0.5 s a call on a large export's 8 M slices (host_context asks 16 times),
        where a pass per level takes each slice once. None where ``depth`` is not one more than
        the parent's (then ``nearest_marked``)."""
        kept: tuple[I32, I32, list[int]] | None = self.__dict__.get("_levels")
        if kept is None and "_levels" not in self.__dict__:
            rows = np.flatnonzero(self.parent >= 0)
            parents = self.parent[rows]
            if bool((self.depth[rows] == self.depth[parents] + 1).all()):
                order = np.argsort(self.depth[rows], kind="stable")
                rows, parents = rows[order], parents[order]
                cuts = np.flatnonzero(np.diff(self.depth[rows])) + 1
                # (Kept as int32, slice ids being under 2^31: 64 MB less on a large export.)
                kept = (rows.astype(np.int32), parents.astype(np.int32), [0, *cuts.tolist(), int(rows.size)])
            object.__setattr__(self, "_levels", kept)  # (frozen: a cache, not a field)
        return kept

    def inclusive(self, weights: I64) -> I64:
        """Each slice's weight plus its descendants' (children's sums pushed up, deepest first)."""
        total: I64 = weights.astype(np.int64).copy()
        for rows in reversed(self.levels()):
            np.add.at(total, self.parent[rows], total[rows])
        return total


def nearest_marked(parent: I64, mark: B) -> I64:
    """Per row of a forest (``parent``: -1 at a root), the nearest row at or above it with
    ``mark``; -1: none. Pointer jumping: each round, a row still without an answer takes its
    ancestor's or, lacking one, that ancestor's ancestor, so the span checked doubles and a
    chain D deep takes log2(D) rounds of whole-array steps (one step per level, or every row
    walking its ancestors, made 1e5 nested ops take minutes)."""
    at_or_above: I64 = np.where(mark, np.arange(mark.size, dtype=np.int64), -1)
    up = parent.astype(np.int64, copy=True)
    pending = np.flatnonzero((at_or_above < 0) & (up >= 0))
    while pending.size:
        above = up[pending]
        at_or_above[pending] = at_or_above[above]
        up[pending] = up[above]
        pending = pending[(at_or_above[pending] < 0) & (up[pending] >= 0)]
    return at_or_above


def _nearest_by_level(mark: B, rows: I32, parents: I32, cuts: list[int]) -> I64:
    """``nearest_marked`` a level at a time (``HostTree._by_level``): a row takes itself when
    marked, else its parent's answer, settled in the level before. Compiled where the tree is large
    and the compiled loops are loaded (``model/compiled.py``): one pass over the rows in level order
    instead of five numpy passes a level (ten calls a diagnosis took 2.5 s on a 606 MB export's
    8 M slices)."""
    fast = compiled.loops(mark.size, load=False)
    if fast is not None:
        done: I64 = fast.nearest_by_level(np.ascontiguousarray(mark, dtype=np.bool_), rows, parents,
                                          np.empty(mark.size, dtype=np.int64))
        return done
    at_or_above: I64 = np.where(mark, np.arange(mark.size, dtype=np.int64), -1)
    for lo, hi in itertools.pairwise(cuts):
        r = rows[lo:hi]
        at_or_above[r] = np.where(mark[r], r, at_or_above[parents[lo:hi]])
    return at_or_above


def chain_top(link: I64) -> I64:
    """Per row, the last row reached by following ``link`` (-1 ends a chain), by pointer jumping
    (log2 of the longest chain rounds)."""
    top: I64 = np.where(link >= 0, link, np.arange(link.size, dtype=np.int64))
    while True:
        further = top[top]
        if np.array_equal(further, top):
            return top
        top = further
