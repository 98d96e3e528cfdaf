"""What a host thread was doing at given instants: the innermost slice on its stack, and what
that stack contains (a DataLoader fetch, a synchronize, an allocator call, a collective...).

Built once per trace; queries are vectorized over many instants.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.model.schema import HOST_KINDS, KIND_DTYPE, LAUNCH_KINDS, Col, Kind
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]
#: A kind's code in the slices table's kind column (its physical value).
_KIND_CODES: dict[str, int] = {k: i for i, k in enumerate(KIND_DTYPE.categories.to_list())}


class Flag(str, Enum):
    """Something on a host stack that explains what the host was waiting on or doing."""

    DATALOADER = "dataloader"
    SYNC = "sync"
    ALLOC = "alloc"
    COMM = "comm"
    GRAPH = "graph"
    LAUNCH = "launch"
    OPTIMIZER = "optimizer"


@dataclass(frozen=True)
class HostIndex:
    """Host slices sorted by (thread, start); ``pos`` arrays index into these sorted rows."""

    ids: I64  # slice id per sorted row
    ts: I64
    end: I64
    parent: I64  # sorted-row position of the parent, -1 at top level
    depth: I64
    kind_code: npt.NDArray[np.uint8]  # the row's Kind as its code in KIND_DTYPE (see is_kind)
    threads: dict[tuple[int, int], tuple[int, int]]  # (pid, tid) -> [lo, hi) rows
    on_stack: dict[Flag, B]  # the row or one of its ancestors carries the flag
    self_flag: dict[Flag, B]  # the row itself carries the flag
    op_ctx: I64  # innermost CPU op at or above the row (slice id), -1 if none
    annotation_ctx: I64  # innermost annotation at or above the row (slice id)
    python_ctx: I64  # innermost Python frame at or above the row (slice id)

    def is_kind(self, kind: Kind) -> B:
        """Which rows are of this kind."""
        hits: B = self.kind_code == _KIND_CODES[kind.value]
        return hits

    def innermost(self, pid: int, tid: int, times: I64) -> I64:
        """Sorted-row position of the innermost slice open at each instant on a thread (-1: idle)."""
        out = np.full(times.shape[0], -1, dtype=np.int64)
        bounds = self.threads.get((pid, tid))
        if bounds is None or times.size == 0:
            return out
        lo, hi = bounds
        cand = lo + np.searchsorted(self.ts[lo:hi], times, side="right") - 1
        cand = np.where(cand >= lo, cand, -1)
        todo = np.flatnonzero(cand >= 0)
        cur = cand[todo]
        while todo.size:
            open_now = self.end[cur] > times[todo]
            out[todo[open_now]] = cur[open_now]
            todo, cur = todo[~open_now], self.parent[cur[~open_now]]
            keep = cur >= 0
            todo, cur = todo[keep], cur[keep]
        return out


def build_host_index(trace: Trace) -> HostIndex:
    trace.require_whole()
    s = trace.slices
    # Names stay categorical (codes, not strings, are sorted and compared); kinds become codes.
    host = s.filter(pl.col(Col.KIND).is_in([k.value for k in HOST_KINDS])).select(
        Col.ID, Col.KIND, Col.NAME, Col.TS, Col.DUR, Col.PID, Col.TID, Col.PARENT, Col.DEPTH
    ).with_columns(pl.col(Col.PID).fill_null(-1), pl.col(Col.TID).fill_null(-1))
    host = host.sort([Col.PID, Col.TID, Col.TS, Col.DUR, Col.ID], descending=[False, False, False, True, False])
    n = host.height
    ids = host.get_column(Col.ID).to_numpy()
    pos_of_id = np.full(s.height, -1, dtype=np.int64)
    pos_of_id[ids] = np.arange(n)
    parent_ids = host.get_column(Col.PARENT).fill_null(-1).to_numpy()
    parent = np.where(parent_ids >= 0, pos_of_id[np.maximum(parent_ids, 0)], -1)
    depth = host.get_column(Col.DEPTH).fill_null(0).to_numpy().astype(np.int64)
    kind_code = host.get_column(Col.KIND).to_physical().to_numpy()
    names = host.get_column(Col.NAME)
    threads: dict[tuple[int, int], tuple[int, int]] = {}
    if n:
        keys = host.select(Col.PID, Col.TID).with_row_index("row").group_by(Col.PID, Col.TID).agg(
            pl.col("row").min().alias("lo"), pl.col("row").max().alias("hi")
        )
        threads = {(int(p), int(t)): (int(lo), int(hi) + 1) for p, t, lo, hi in keys.iter_rows()}

    is_runtime = np.isin(kind_code, [_KIND_CODES[k.value] for k in LAUNCH_KINDS])
    unique = [u for u in names.unique().to_list() if u is not None]

    def by_name(test: object) -> B:
        hits = [u for u in unique if test(u)]  # type: ignore[operator]
        return names.is_in(hits).to_numpy() if hits else np.zeros(n, dtype=bool)

    self_flag = {
        Flag.DATALOADER: by_name(api_names.is_dataloader),
        Flag.SYNC: by_name(api_names.is_sync_call) & is_runtime,
        Flag.ALLOC: by_name(api_names.is_alloc_call) & is_runtime,
        Flag.COMM: by_name(api_names.is_comm) & ~is_runtime,
        Flag.GRAPH: by_name(api_names.is_graph_launch) & is_runtime,
        Flag.LAUNCH: by_name(api_names.is_launch_call) & is_runtime,
        Flag.OPTIMIZER: by_name(api_names.is_optimizer),
    }
    levels = _levels(depth)
    on_stack = {flag: _propagate_any(values, parent, levels) for flag, values in self_flag.items()}
    return HostIndex(
        ids=ids,
        ts=host.get_column(Col.TS).to_numpy(),
        end=(host.get_column(Col.TS) + host.get_column(Col.DUR)).to_numpy(),
        parent=parent,
        depth=depth,
        kind_code=kind_code,
        threads=threads,
        on_stack=on_stack,
        self_flag=self_flag,
        op_ctx=_propagate_ctx(np.where(kind_code == _KIND_CODES[Kind.CPU_OP.value], ids, -1), parent, levels),
        annotation_ctx=_propagate_ctx(
            np.where(kind_code == _KIND_CODES[Kind.ANNOTATION.value], ids, -1), parent, levels),
        python_ctx=_propagate_ctx(np.where(kind_code == _KIND_CODES[Kind.PYTHON.value], ids, -1), parent, levels),
    )


def _levels(depth: I64) -> list[I64]:
    if depth.size == 0:
        return []
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(1, int(depth.max()) + 2))
    return [order[bounds[d - 1] : bounds[d]] for d in range(1, len(bounds))]


def _propagate_any(values: B, parent: I64, levels: list[I64]) -> B:
    out: B = values.copy()
    for rows in levels:  # depth 1, 2, ...: parents are final before their children
        p = parent[rows]
        ok = p >= 0
        out[rows[ok]] |= out[p[ok]]
    return out


def _propagate_ctx(values: I64, parent: I64, levels: list[I64]) -> I64:
    out: I64 = values.copy()
    for rows in levels:
        p = parent[rows]
        inherit = (out[rows] < 0) & (p >= 0)
        out[rows[inherit]] = out[p[inherit]]
    return out
