"""What a host thread was doing at given instants: the innermost slice on its stack, and what
that stack contains (a DataLoader fetch, a synchronize, an allocator call, a collective...).

Built once per trace; queries are vectorized over many instants.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import Enum
from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.id_arrays import Ids, narrow
from tracewhy.analyses.name_codes import NameCodes, decide, distinct_names
from tracewhy.model.schema import HOST_KINDS, KIND_CODE, LAUNCH_KINDS, Col, Kind
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


class Flag(str, Enum):
    """Something on a host stack that explains what the host was waiting on or doing."""

    DATALOADER = "dataloader"
    SYNC = "sync"
    ALLOC = "alloc"
    COMM = "comm"
    GRAPH = "graph"
    LAUNCH = "launch"
    OPTIMIZER = "optimizer"


class HostIndex(msgspec.Struct, frozen=True):
    """Host slices sorted by (thread, start); ``pos`` arrays index into these sorted rows."""

    ids: I64  # slice id per sorted row
    ts: I64
    end: I64
    parent: Ids  # sorted-row position of the parent, -1 at top level (int32 where it fits, as below)
    depth: npt.NDArray[np.int32]
    kind_code: npt.NDArray[np.uint8]  # the row's Kind as its code (KIND_CODE; see is_kind)
    threads: dict[tuple[int, int], tuple[int, int]]  # (pid, tid) -> [lo, hi) rows
    on_stack: dict[Flag, B]  # the row or one of its ancestors carries the flag
    self_flag: dict[Flag, B]  # the row itself carries the flag
    op_ctx: I64  # innermost CPU op at or above the row (slice id), -1 if none
    annotation_ctx: Ids  # innermost annotation at or above the row (slice id)
    python_ctx: I64  # innermost Python frame at or above the row (slice id)

    def is_kind(self, kind: Kind) -> B:
        """Which rows are of this kind."""
        hits: B = self.kind_code == KIND_CODE[kind.value]
        return hits

    def top_level(self, rows: I64) -> I64:
        """Of ``rows``, those with no op or annotation above them (Python frames aside): the
        blocks a loop's body is made of."""
        parent = self.parent[rows]
        safe = np.maximum(parent, 0)
        return rows[(parent < 0) | ((self.annotation_ctx[safe] < 0) & (self.op_ctx[safe] < 0))]

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


def host_index_once(trace: Trace) -> Callable[[], HostIndex]:
    """``build_host_index(trace)`` on the first call, the same index after: the step search asks
    for it only on a trace without step markers, and its marker search, loop iterations and engine
    iterations share one (on a 2 MB nsys export one build is about 0.1 s of CPU)."""
    return functools.cache(lambda: build_host_index(trace))


def build_host_index(trace: Trace) -> HostIndex:
    trace.require_whole()
    s = trace.slices
    # Names stay categorical (codes, not strings, are sorted and compared); kinds become codes.
    # (Columns first, then rows: filtering first copies every column of millions of host rows.)
    host = s.select(
        Col.ID, Col.KIND, Col.NAME, Col.TS, Col.DUR, Col.PID, Col.TID, Col.PARENT, Col.DEPTH
    ).filter(pl.col(Col.KIND).is_in([k.value for k in HOST_KINDS])).with_columns(
        pl.col(Col.PID).fill_null(-1), pl.col(Col.TID).fill_null(-1)
    )
    # Rows are in id order already: a stable sort ends ties by id (three times quicker than
    # sorting on the id as a fifth key).
    host = host.sort([Col.PID, Col.TID, Col.TS, Col.DUR], descending=[False, False, False, True], maintain_order=True)
    n = host.height
    ids = host.get_column(Col.ID).to_numpy()
    pos_of_id = np.full(s.height, -1, dtype=np.int64)
    pos_of_id[ids] = np.arange(n)
    parent_ids = host.get_column(Col.PARENT).fill_null(-1).to_numpy()
    parent = narrow(np.where(parent_ids >= 0, pos_of_id[np.maximum(parent_ids, 0)], -1))
    del pos_of_id, parent_ids
    depth = host.get_column(Col.DEPTH).fill_null(0).to_numpy()
    kind_code = host.get_column(Col.KIND).to_physical().to_numpy()
    threads: dict[tuple[int, int], tuple[int, int]] = {}
    if n:
        # Rows are sorted by thread: each thread is the run between two changes of (pid, tid).
        pid, tid = host.get_column(Col.PID).to_numpy(), host.get_column(Col.TID).to_numpy()
        starts = np.flatnonzero(np.r_[True, (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])])
        ends = np.r_[starts[1:], n]
        threads = {(int(pid[lo]), int(tid[lo])): (int(lo), int(hi)) for lo, hi in zip(starts, ends, strict=True)}

    is_runtime = np.isin(kind_code, [KIND_CODE[k.value] for k in LAUNCH_KINDS])
    named = _name_flags(host.get_column(Col.NAME), is_runtime)
    self_flag = {
        Flag.DATALOADER: named[Flag.DATALOADER],
        Flag.SYNC: named[Flag.SYNC] & is_runtime,
        Flag.ALLOC: named[Flag.ALLOC] & is_runtime,
        Flag.COMM: named[Flag.COMM] & ~is_runtime,
        Flag.GRAPH: named[Flag.GRAPH] & is_runtime,
        Flag.LAUNCH: named[Flag.LAUNCH] & is_runtime,
        Flag.OPTIMIZER: named[Flag.OPTIMIZER],
    }
    del named, is_runtime
    levels = _levels(depth, parent)
    # All flags in one pass down the levels, as the bits of one byte per slice.
    bits = np.zeros(n, dtype=np.uint8)
    for bit, values in enumerate(self_flag.values()):
        bits |= values.astype(np.uint8) << bit
    bits = _propagate_any(bits, levels)
    # A flag no slice carries is on no stack: one read-only False stands for every row (most
    # flags are absent from an nsys export, 6.6 MB a flag per table on a large one).
    none: B = np.broadcast_to(np.False_, (n,))
    on_stack = {flag: (bits & (1 << bit)) != 0 if self_flag[flag].any() else none
                for bit, flag in enumerate(self_flag)}
    self_flag = {flag: values if values.any() else none for flag, values in self_flag.items()}
    del bits
    # The innermost op, annotation and Python frame on each stack.
    op_ctx, annotation_ctx, python_ctx = (
        _context(kind_code == KIND_CODE[k.value], ids, levels) for k in (Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON)
    )
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
        op_ctx=op_ctx,
        annotation_ctx=narrow(annotation_ctx),
        python_ctx=python_ctx,
    )


#: What a slice's own name says it is (the launch-kind tests are applied on top).
_NAME_TESTS: Final = {
    Flag.DATALOADER: api_names.is_dataloader,
    Flag.SYNC: api_names.is_sync_call,
    Flag.ALLOC: api_names.is_alloc_call,
    Flag.COMM: api_names.is_comm,
    Flag.GRAPH: api_names.is_graph_launch,
    Flag.LAUNCH: api_names.is_launch_call,
    Flag.OPTIMIZER: api_names.is_optimizer,
}
#: The flags that count on runtime calls alone (``build_host_index`` ands them with the kind).
_RUNTIME_FLAGS: Final = frozenset({Flag.SYNC, Flag.ALLOC, Flag.GRAPH, Flag.LAUNCH})


def _name_flags(names: pl.Series, is_runtime: B) -> dict[Flag, B]:
    """Per row, whether its name passes each of ``_NAME_TESTS``: each distinct name is tested
    once (where the test's literal pre-test, run over all of them at once, passes it), and the
    rows take their name's answer through its categorical code (seven ``is_in``
    over 6.6 M host rows took 0.56 s). The tests of ``_RUNTIME_FLAGS`` see the runtime calls'
    names alone, so their answer is False on a row of another kind whose name is no call's:
    a few dozen names where an nsys emit_nvtx export has 16 k distinct range names."""
    rows = NameCodes.of(names)
    every, calls = distinct_names(names), distinct_names(names, is_runtime)
    out: dict[Flag, B] = {}
    for flag, test in _NAME_TESTS.items():
        unique_codes, texts = calls if flag in _RUNTIME_FLAGS else every
        out[flag] = rows.spread(unique_codes, decide(texts, test, api_names.PRETESTS.get(test), False), False, bool)
    return out


def _levels(depth: npt.NDArray[np.int32], parent: I64) -> list[tuple[I64, I64]]:
    """Depth 1, 2, ...: the rows at that depth that have a parent, and their parents. Walked in
    order, a parent is final before its children."""
    if depth.size == 0:
        return []
    # Depths are small: as uint16 a stable argsort is a radix sort, ten times quicker.
    key = depth.astype(np.uint16) if int(depth.max()) < 1 << 16 else depth
    order = np.argsort(key, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(1, int(depth.max()) + 2))
    levels = []
    for d in range(1, len(bounds)):
        rows = order[bounds[d - 1] : bounds[d]]
        p = parent[rows]
        ok = p >= 0
        levels.append((rows[ok], p[ok]))
    return levels


def _propagate_any(values: npt.NDArray[np.uint8], levels: list[tuple[I64, I64]]) -> npt.NDArray[np.uint8]:
    """Each slice's bits OR'd with all its ancestors' (bit k set: flag k is on its stack)."""
    out: npt.NDArray[np.uint8] = values.copy()
    for rows, parents in levels:
        out[rows] |= out[parents]
    return out


def _context(mine: B, ids: I64, levels: list[tuple[I64, I64]]) -> I64:
    """The innermost slice of a kind (``mine``: the rows of that kind) at or above each row, -1
    where none is. Without any slice of the kind (no CPU ops or Python frames in an nsys export)
    one read-only -1 stands for every row: two such arrays were 0.1 GB on a large export."""
    if not mine.any():
        none: I64 = np.broadcast_to(np.int64(-1), mine.shape)
        return none
    return _propagate_ctx(np.where(mine, ids, -1), levels)


def _propagate_ctx(values: I64, levels: list[tuple[I64, I64]]) -> I64:
    """The nearest value at or above each slice in ``values`` (-1 where a slice is not of the
    context's kind)."""
    out: I64 = values.copy()
    for rows, parents in levels:
        own = out[rows]
        out[rows] = np.where(own < 0, out[parents], own)
    return out
