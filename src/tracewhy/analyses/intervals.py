"""Interval algebra over sorted numpy arrays: union, total covered length, gaps."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]


def union(starts: I64, ends: I64) -> tuple[I64, I64]:
    """Merge possibly overlapping intervals [start, end) into disjoint, sorted ones."""
    if starts.size == 0:
        return starts.astype(np.int64), ends.astype(np.int64)
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = ends[order]
    running_end = np.maximum.accumulate(e)
    # A new merged interval begins where a start lies beyond everything seen so far.
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > running_end[:-1]
    idx = np.flatnonzero(new)
    merged_starts = s[idx]
    last = np.append(idx[1:] - 1, s.size - 1)
    merged_ends = running_end[last]
    return merged_starts, merged_ends


def covered_ns(starts: I64, ends: I64) -> int:
    """Length of the union of the intervals."""
    s, e = union(starts, ends)
    return int((e - s).sum())


def gaps(starts: I64, ends: I64, lo: int | None = None, hi: int | None = None) -> tuple[I64, I64]:
    """Holes between the merged intervals, optionally also before/after them inside [lo, hi)."""
    s, e = union(starts, ends)
    gs = e[:-1]
    ge = s[1:]
    if lo is not None and (s.size == 0 or lo < s[0]):
        gs = np.concatenate(([lo], gs))
        ge = np.concatenate(([s[0] if s.size else (hi if hi is not None else lo)], ge))
    if hi is not None and s.size and hi > e[-1]:
        gs = np.concatenate((gs, [e[-1]]))
        ge = np.concatenate((ge, [hi]))
    keep = ge > gs
    return gs[keep].astype(np.int64), ge[keep].astype(np.int64)
