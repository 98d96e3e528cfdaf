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
    the innermost open slice on its thread that began earlier (longer first on ties). A slice
    that overruns its parent's end (clock jitter of a few hundred ns is common) is still
    nested under it rather than dropped. The op column gives, for each slice, the innermost
    enclosing CPU op, itself excluded.
    """
    n = ts.shape[0]
    depth = np.full(n, -1, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    op = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return depth, parent, op
    order = np.lexsort((np.arange(n), -dur, ts, tid, pid))
    end = ts + dur
    o_pid = pid[order].tolist()
    o_tid = tid[order].tolist()
    o_ts = ts[order].tolist()
    o_end = end[order].tolist()
    o_op = is_op[order].tolist()
    o_idx = order.tolist()
    r_depth = [0] * n
    r_parent = [-1] * n
    r_op = [-1] * n
    # Stack entries: (end, original index, innermost op at this level including itself).
    stack: list[tuple[int, int, int]] = []
    cur = (None, None)
    for k in range(n):
        key = (o_pid[k], o_tid[k])
        if key != cur:
            stack.clear()
            cur = key
        start = o_ts[k]
        while stack and stack[-1][0] <= start:
            stack.pop()
        idx = o_idx[k]
        if stack:
            top = stack[-1]
            r_parent[k] = top[1]
            r_op[k] = top[2]
            r_depth[k] = len(stack)
        stack.append((o_end[k], idx, idx if o_op[k] else r_op[k]))
    depth[order] = r_depth
    parent[order] = r_parent
    op[order] = r_op
    return depth, parent, op


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
