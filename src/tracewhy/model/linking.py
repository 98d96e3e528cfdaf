"""Derived links every reader needs: host nesting per thread and GPU-to-launch correlation.

Readers call ``link_slices`` once on their finished slices table; analyses rely on the
``depth``, ``parent_id``, ``launch_id`` and ``op_id`` columns it fills.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.model.schema import GPU_ACTIVITY_KINDS, HOST_KINDS, LAUNCH_KINDS, Col, Kind

I64 = npt.NDArray[np.int64]


def nest_host_slices(
    pid: I64, tid: I64, ts: I64, dur: I64, is_op: npt.NDArray[np.bool_]
) -> tuple[I64, I64, I64]:
    """Nest host slices per thread; return (depth, parent index, innermost enclosing CPU op).

    Inputs are parallel arrays over host slices; -1 stands for "none". A slice is a child of
    the innermost slice on its thread that began earlier (longer first on ties) and is still
    open. The op column gives, for each slice, the innermost enclosing CPU op, itself excluded.

    Vectorized for properly nested slices (the normal case): a slice's depth is the number of
    earlier slices on its thread still open at its start, and its parent is the latest earlier
    slice one level up. Slices that overrun their parent's end (clock jitter) break that
    arithmetic; then the exact stack walk below decides.
    """
    n = ts.shape[0]
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy(), empty.copy()
    order = np.lexsort((np.arange(n), -dur, ts, tid, pid))
    o_ts = ts[order]
    o_end = o_ts + dur[order]
    # Thread number per sorted row, then times shifted so threads never interleave.
    key = np.stack([pid[order], tid[order]])
    new_thread = np.ones(n, dtype=bool)
    new_thread[1:] = (key[:, 1:] != key[:, :-1]).any(axis=0)
    thread = np.cumsum(new_thread) - 1
    span = int(max(o_end.max() - o_ts.min(), 0)) + 2
    base = o_ts.min()
    shift = thread.astype(np.int64) * span - base
    s_key = o_ts + shift
    e_key = o_end + shift
    pos = np.arange(n, dtype=np.int64)
    first_of_thread = np.maximum.accumulate(np.where(new_thread, pos, 0))
    # Open at my start = earlier rows of my thread minus those that ended by my start.
    ended = np.searchsorted(np.sort(e_key), s_key, side="right") - np.searchsorted(
        np.sort(e_key), thread.astype(np.int64) * span - base, side="left"
    )
    # Zero-length rows sort last among rows of their thread that start at the same instant;
    # their end equals that instant, so they were counted as ended above although they come
    # at or after the row in question. Take them back out.
    zero = o_end == o_ts
    new_instant = new_thread.copy()
    new_instant[1:] |= o_ts[1:] != o_ts[:-1]
    group = np.cumsum(new_instant) - 1
    group_end = np.append(np.flatnonzero(new_instant)[1:], n)[group]
    zeros_in_group = np.bincount(group, weights=zero, minlength=group[-1] + 1).astype(np.int64)[group]
    ended -= np.where(zero, group_end - pos, zeros_in_group)
    depth = (pos - first_of_thread) - ended
    # Parent: the latest earlier row of my thread at depth - 1.
    level_key = depth * n + pos
    level_order = np.argsort(level_key, kind="stable")
    sorted_levels = level_key[level_order]
    cand_at = np.searchsorted(sorted_levels, (depth - 1) * n + pos, side="left") - 1
    cand = np.where(cand_at >= 0, level_order[np.maximum(cand_at, 0)], -1)
    has_parent = depth > 0
    valid = (cand >= 0) & (depth[np.maximum(cand, 0)] == depth - 1) & (thread[np.maximum(cand, 0)] == thread)
    valid &= (o_end[np.maximum(cand, 0)] > o_ts) & (o_end[np.maximum(cand, 0)] >= o_end)
    parent_sorted = np.where(has_parent, cand, -1)
    broken = (depth < 0) | (has_parent & ~valid)
    if broken.any():
        # Threads where a slice overruns its parent: redo just those with the exact stack walk.
        redo = np.isin(thread, np.unique(thread[broken]))
        rows = np.flatnonzero(redo)
        d, p = _stack_walk_sorted(o_ts[rows], o_end[rows], thread[rows])
        depth = depth.copy()
        depth[rows] = d
        parent_sorted[rows] = np.where(p >= 0, rows[np.maximum(p, 0)], -1)
    o_is_op = is_op[order]
    op_sorted = first_flagged(parent_sorted, parent_sorted, o_is_op)
    out_depth = np.empty(n, dtype=np.int64)
    out_parent = np.empty(n, dtype=np.int64)
    out_op = np.empty(n, dtype=np.int64)
    out_depth[order] = depth
    out_parent[order] = np.where(parent_sorted >= 0, order[np.maximum(parent_sorted, 0)], -1)
    out_op[order] = np.where(op_sorted >= 0, order[np.maximum(op_sorted, 0)], -1)
    return out_depth, out_parent, out_op


def _stack_walk_sorted(ts: I64, end: I64, thread: npt.NDArray[np.int64]) -> tuple[I64, I64]:
    """Depth and parent (positions within these rows) by the stack walk; rows sorted by thread,
    start, longest first. A slice that overruns its parent's end is still nested under it."""
    n = ts.shape[0]
    depth = [0] * n
    parent = [-1] * n
    stack: list[tuple[int, int]] = []  # (end, position)
    cur = -1
    for k, (start, stop, th) in enumerate(zip(ts.tolist(), end.tolist(), thread.tolist(), strict=True)):
        if th != cur:
            stack.clear()
            cur = th
        while stack and stack[-1][0] <= start:
            stack.pop()
        if stack:
            parent[k] = stack[-1][1]
            depth[k] = len(stack)
        stack.append((stop, k))
    return np.array(depth, dtype=np.int64), np.array(parent, dtype=np.int64)


def first_flagged(start: I64, parent: I64, flag: npt.NDArray[np.bool_]) -> I64:
    """For each start row (-1: none), the nearest row at or above it, following ``parent``, whose
    flag is set, or -1. With ``start = parent`` that is the nearest proper flagged ancestor."""
    result = np.full(start.shape[0], -1, dtype=np.int64)
    rows = np.flatnonzero(start >= 0)
    cur = start[rows]
    while rows.size:
        hit = flag[cur]
        result[rows[hit]] = cur[hit]
        rows, cur = rows[~hit], parent[cur[~hit]]
        keep = cur >= 0
        rows, cur = rows[keep], cur[keep]
    return result


def link_slices(slices: pl.DataFrame) -> pl.DataFrame:
    """Fill depth, parent_id, launch_id and op_id on a slices table whose ids are row numbers."""
    kind = slices.get_column(Col.KIND)
    host_mask = kind.is_in([k.value for k in HOST_KINDS]).to_numpy()
    host_idx = np.flatnonzero(host_mask)
    n = slices.height
    depth = np.full(n, -1, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    op = np.full(n, -1, dtype=np.int64)
    if host_idx.size:
        h = slices[host_idx]
        d, p, o = nest_host_slices(
            h.get_column(Col.PID).fill_null(-1).to_numpy(),
            h.get_column(Col.TID).fill_null(-1).to_numpy(),
            h.get_column(Col.TS).to_numpy(),
            h.get_column(Col.DUR).to_numpy(),
            (h.get_column(Col.KIND) == Kind.CPU_OP.value).to_numpy(),
        )
        depth[host_idx] = d
        parent[host_idx] = np.where(p >= 0, host_idx[np.maximum(p, 0)], -1)
        op[host_idx] = np.where(o >= 0, host_idx[np.maximum(o, 0)], -1)

    # GPU activity -> the launch call with the same correlation id. A CUDA-graph launch has one
    # correlation id for all of its kernels, so this is many-to-one.
    launches = slices.filter(
        pl.col(Col.KIND).is_in([k.value for k in LAUNCH_KINDS]) & pl.col(Col.CORRELATION).is_not_null()
    ).select(Col.CORRELATION, pl.col(Col.ID).alias("_launch"))
    # Runtime before driver: when both record a launch (cudaLaunchKernel -> cuLaunchKernel)
    # with one correlation id, the runtime call is what the user's code made.
    launches = launches.unique(subset=Col.CORRELATION, keep="first", maintain_order=True)
    gpu = slices.filter(
        pl.col(Col.KIND).is_in([k.value for k in (*GPU_ACTIVITY_KINDS, Kind.GPU_SYNC)])
        & pl.col(Col.CORRELATION).is_not_null()
    ).select(Col.ID, Col.CORRELATION)
    launch = np.full(n, -1, dtype=np.int64)
    if gpu.height and launches.height:
        joined = gpu.join(launches, on=Col.CORRELATION, how="inner")
        gids = joined.get_column(Col.ID).to_numpy()
        lids = joined.get_column("_launch").to_numpy()
        launch[gids] = lids
        op[gids] = op[lids]

    def col(values: I64, name: str, dtype: pl.DataType) -> pl.Expr:
        raw = pl.lit(pl.Series(name, values))
        return pl.when(raw >= 0).then(raw).otherwise(None).cast(dtype).alias(name)

    return slices.with_columns(
        col(depth, Col.DEPTH, pl.Int32()),
        col(parent, Col.PARENT, pl.Int64()),
        col(launch, Col.LAUNCH, pl.Int64()),
        col(op, Col.OP, pl.Int64()),
    )
