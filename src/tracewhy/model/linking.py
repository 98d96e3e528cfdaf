"""Derived links every reader needs: host nesting per thread and GPU-to-launch correlation.

Readers call ``link_slices`` once on their finished slices table; analyses rely on the
``depth``, ``parent_id``, ``launch_id`` and ``op_id`` columns it fills.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.model import compiled
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, HOST_KINDS, KIND_CODE, KIND_DTYPE, LAUNCH_KINDS, Col, Kind

I64 = npt.NDArray[np.int64]
#: Row numbers: int64, or int32 in the nesting (``_index_dtype``).
Index = npt.NDArray[np.signedinteger[Any]]


def nest_host_slices(
    pid: I64, tid: I64, ts: I64, dur: I64, is_op: npt.NDArray[np.bool_]
) -> tuple[I64, I64, I64]:
    """Nest host slices per thread; return (depth, parent index, innermost enclosing CPU op).

    Inputs are parallel arrays over host slices; -1 stands for "none". A slice's parent is the
    innermost slice of its thread that contains it: one that starts no later, ends no earlier,
    and is still open at its start (so a zero-length slice has no children). Ties of start go
    longest first, then file order. For properly nested slices this is exactly the stack walk a
    profiler's viewer does. A slice that outlives the one it began in is not that one's child:
    ``ProfilerStep#N`` is opened inside the short Python frame of
    ``_record_function_enter_new`` and stays open after it returns, and Python's ``step()``
    frame begins inside the step it closes; each becomes a child of the first slice that
    really contains it. The op column gives, for each slice, the innermost enclosing CPU op,
    itself excluded.

    All of it is vectorized: rows sorted by thread, start and length first, the parent is the
    nearest earlier row whose end reaches this row's end (a previous-greater-element search by
    pointer jumping), and depth is the length of the parent chain (list ranking by pointer
    jumping). Both take a number of rounds logarithmic in the chain lengths. From
    ``compiled.MIN_ITEMS`` rows on, where numba is installed, the sorted rows take one compiled
    pass with a stack instead (``compiled_loops.nest``), which gives the same rows.
    """
    n = ts.shape[0]
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy(), empty.copy()
    # (Temporaries are dropped as soon as they are used: on a 1 GB trace each is 15 MB, on a
    # 600 MB nsys export 53 MB.)
    thread_key = pair_key(pid, tid)
    threads: list[I64] = [thread_key] if thread_key is not None else [pid, tid]
    del pid, tid, thread_key
    # By thread, start, longest first, then input order (polars' multi-key sort: about twice
    # as fast as np.lexsort here, on both cores). One thread key instead of pid and tid: the
    # sort encodes every key of every row, 9 bytes each. (Polars takes the arrays without a
    # copy.)
    keys = {f"thread{i}": values for i, values in enumerate(threads)}
    order = (
        pl.DataFrame({**keys, "ts": ts, "dur": dur})
        .select(pl.arg_sort_by([*keys, "ts", "dur"], descending=[False] * len(keys) + [False, True],
                               maintain_order=True))
        .to_series()
        .to_numpy()
        .astype(_index_dtype(n))
    )
    del keys
    new_thread = np.zeros(n, dtype=bool)
    new_thread[0] = True
    for values in threads:
        ordered = values[order]
        new_thread[1:] |= ordered[1:] != ordered[:-1]
        del ordered
    del threads
    # Times shifted per thread so that no row of an earlier thread can reach a later thread's rows.
    thread = np.cumsum(new_thread) - 1
    del new_thread
    o_is_op = is_op[order]
    o_dur = dur[order]
    del is_op, dur
    end_key = ts[order]
    del ts
    base = int(end_key.min())
    end_key += o_dur
    span = max(int(end_key.max()) - base, 0) + 2
    end_key += thread * span - base
    del thread
    # What a container's end must reach: my end, or one past it for a zero-length slice (a
    # slice that ends at my start is no longer open then).
    reach = end_key + (o_dur == 0)
    del o_dur
    fast = compiled.loops(n)
    if fast is not None:  # (numba: the three in one pass)
        dtype = _index_dtype(n)
        parent, depth, op = np.empty(n, dtype=dtype), np.empty(n, dtype=dtype), np.empty(n, dtype=dtype)
        fast.nest(end_key, reach, o_is_op, parent, depth, op)
        del end_key, reach, o_is_op
    else:
        parent = _previous_reaching(end_key, reach)
        del end_key, reach
        depth = _chain_length(parent)
        op = first_flagged(parent, parent, o_is_op)
        del o_is_op
    out_depth = np.empty(n, dtype=np.int64)
    out_depth[order] = depth
    del depth
    out_op = np.empty(n, dtype=np.int64)
    out_op[order] = np.where(op >= 0, order[np.maximum(op, 0)], -1)
    del op
    out_parent = np.empty(n, dtype=np.int64)
    out_parent[order] = np.where(parent >= 0, order[np.maximum(parent, 0)], -1)
    return out_depth, out_parent, out_op


def _index_dtype(n: int) -> type[np.signedinteger[Any]]:
    """The dtype of row numbers among ``n`` rows (and -1): int32 where it holds them, which
    halves the index arrays of the nesting (tens of MB each for millions of host slices)."""
    return np.int32 if n < 2**31 - 1 else np.int64


def pair_key(pid: I64, tid: I64) -> I64 | None:
    """One integer per (pid, tid) pair, equal for equal pairs and in the pairs' order, or None
    where the two do not fit one int64 (nsys ids are 24 bits; -1 stands for none)."""
    if not (pid.min() >= -1 and pid.max() < 2**31 - 1 and tid.min() >= -1 and tid.max() < 2**32 - 1):
        return None
    key = pid + 1
    key <<= 32
    key |= tid + 1
    return key


def _previous_reaching(end: I64, reach: I64) -> Index:
    """For each row i, the nearest row j < i with ``end[j] >= reach[i]``, or -1.

    Pointer jumping: every candidate c of row i keeps the invariant that the rows strictly
    between c and i end before ``reach[i]``; when c itself falls short, c's own candidate keeps
    it too (those rows end before ``reach[c] <= end[c] + 1 <= reach[i]``), so i jumps there.
    """
    n = end.shape[0]
    cand = np.arange(-1, n - 1, dtype=_index_dtype(n))
    # A row that no earlier row reaches (a top-level slice) would walk back over all its earlier
    # siblings, log2 of their number in rounds: a million top-level CUDA calls on one thread
    # took 20 rounds. The running maximum of the ends settles those rows at once.
    reached = np.empty(n, dtype=bool)
    reached[0] = False
    if n > 1:
        reached[1:] = np.maximum.accumulate(end[:-1]) >= reach[1:]
    cand[~reached] = -1
    active = np.flatnonzero(reached).astype(cand.dtype)
    while active.size:
        c = cand[active]
        settled = end[c] >= reach[active]  # c >= 0: rows whose candidate is -1 are gone
        active = active[~settled]
        cand[active] = cand[cand[active]]
        active = active[cand[active] >= 0]
    return cand


def _chain_length(parent: Index) -> Index:
    """Number of ancestors of each row along ``parent`` (-1: a root), by Wyllie's list ranking."""
    depth = (parent >= 0).astype(parent.dtype)
    nxt = parent.copy()
    active = np.flatnonzero(nxt >= 0).astype(parent.dtype)
    while active.size:
        up = nxt[active]
        depth[active] = depth[active] + depth[up]
        nxt[active] = nxt[up]
        active = active[nxt[active] >= 0]
    return depth


def first_flagged(start: Index, parent: Index, flag: npt.NDArray[np.bool_]) -> I64:
    """For each start row (-1: none), the nearest row at or above it, following ``parent``, whose
    flag is set, or -1. With ``start = parent`` that is the nearest proper flagged ancestor.

    A few starts (the launches of a trace's communication kernels) climb from themselves, for up
    to ``_CLIMB_ROUNDS`` levels; what is left, or many starts, take the pointer jumping over all
    rows (``_nearest_flagged``), whose cost is the table's size (0.4 s on 8 M rows).
    """
    n = parent.shape[0]
    result = np.full(start.shape[0], -1, dtype=np.int64)
    if n == 0 or not start.size or not flag.any():  # (no CPU ops: an nsys trace)
        return result
    todo = np.flatnonzero(start >= 0)
    if todo.size * _CLIMB_SHARE < n:
        cur = start[todo]
        for _ in range(_CLIMB_ROUNDS):
            hit = flag[cur]
            result[todo[hit]] = cur[hit]
            todo, cur = todo[~hit], parent[cur[~hit]]
            above = cur >= 0
            todo, cur = todo[above], cur[above]
            if not todo.size:
                return result
    result[todo] = _nearest_flagged(parent, flag)[start[todo]]
    return result


#: Starts fewer than one per this many rows climb from themselves first.
_CLIMB_SHARE: Final = 16
#: Levels a start climbs before the rest take the pointer jumping.
_CLIMB_ROUNDS: Final = 64


def _nearest_flagged(parent: Index, flag: npt.NDArray[np.bool_]) -> I64:
    """For every row, the nearest row at or above it whose flag is set, or -1.

    Pointer jumping over all rows: an unflagged row's pointer skips only unflagged rows, so a
    row is settled as soon as its pointer lands on a settled row; rounds grow with the log of
    the longest unflagged chain, not with the depth.
    """
    n = parent.shape[0]
    nearest = np.where(flag, np.arange(n, dtype=np.int64), -1)
    settled = flag | (parent < 0)
    ptr = parent.copy()
    active = np.flatnonzero(~settled)
    while active.size:
        p = ptr[active]
        landed = settled[p]
        done = active[landed]
        nearest[done] = nearest[p[landed]]
        settled[done] = True
        active, p = active[~landed], p[~landed]
        ptr[active] = ptr[p]
        # Pointing past the root: nothing flagged above.
        top = ptr[active] < 0
        settled[active[top]] = True
        active = active[~top]
    return nearest


#: Depth, parent row and innermost enclosing CPU op row of every row of a slices table (-1: none).
Nesting = tuple[I64, I64, I64]


def link_slices(slices: pl.DataFrame, *, per_process: bool = False, nesting: Callable[[], Nesting] | None = None,
                meanwhile: Callable[[pl.DataFrame], None] | None = None) -> pl.DataFrame:
    """Fill depth, parent_id, launch_id and op_id on a slices table whose ids are row numbers.

    ``per_process``: a GPU row's launch is found in its own process, runtime calls before driver
    calls, for a capture of several processes, whose correlation ids repeat across processes
    (311 collisions in nsysai_mfu_2gpu_after). Otherwise on the correlation id alone, the first
    call in the table's order, as in one Kineto process.

    ``nesting``: gives what ``nest_rows`` makes of this table's host slices, when the caller
    started it beside work of its own (the Kineto reader, as soon as the rows' time order is
    known); it is asked for once the launches are found. Without it the nesting is made here: from
    ``NEST_APART_ROWS`` host slices on, on a second thread while this one finds the launches. Both
    are numpy and polars work that lets the GIL go, and readers call this on their serial tail,
    where the second core has nothing else to do. ``meanwhile``: the caller's own work on the
    table once its launches are linked (depth, parent and op still null), done before the
    nesting is waited for.
    """
    with contextlib.ExitStack() as stack:
        if nesting is None:
            host_idx = np.flatnonzero(slices.get_column(Col.KIND).is_in([k.value for k in HOST_KINDS]).to_numpy())
            if host_idx.size < NEST_APART_ROWS:
                made: Future[Nesting] = Future()
                made.set_result(_nesting(slices, host_idx))
                nesting = made.result
            else:
                pool = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracewhy-nest"))
                nesting = pool.submit(_nesting, slices, host_idx).result
        gids, lids = _launch_links(slices, per_process)
        launch_ids = np.full(slices.height, -1, dtype=np.int64)
        launch_ids[gids] = lids
        launch = _linked(launch_ids, Col.LAUNCH, pl.Int64())
        del launch_ids
        if meanwhile is not None:
            meanwhile(slices.with_columns(launch))
        depth, parent, op = nesting()
    op[gids] = op[lids]
    del gids, lids
    return slices.with_columns(_linked(depth, Col.DEPTH, pl.Int32()), _linked(parent, Col.PARENT, pl.Int64()),
                               launch, _linked(op, Col.OP, pl.Int64()))


def _linked(values: I64, name: str, dtype: pl.DataType) -> pl.Series:
    """A link column of row numbers (-1: none, null in the table)."""
    raw = pl.Series(name, values)
    return pl.select(pl.when(raw >= 0).then(raw).cast(dtype)).to_series().alias(name)


#: From this many host slices on, the nesting runs on a second thread (``link_slices``).
NEST_APART_ROWS: Final = 100_000


def _nesting(slices: pl.DataFrame, host_idx: npt.NDArray[np.intp]) -> Nesting:
    """``nest_rows`` of the rows of ``slices`` at ``host_idx``."""
    kind = slices.get_column(Col.KIND)

    # Column by column: gathering whole host rows would copy every column of the table.
    def host(name: str) -> npt.NDArray[np.int64]:
        values = slices.get_column(name).gather(host_idx)
        return np.asarray((values.fill_null(-1) if values.null_count() else values).to_numpy(), dtype=np.int64)

    return nest_rows(slices.height, host_idx, [host(Col.PID), host(Col.TID), host(Col.TS), host(Col.DUR)],
                     (kind.gather(host_idx) == Kind.CPU_OP.value).to_numpy())


def nest_rows(n: int, host_idx: npt.NDArray[np.intp], columns: list[I64], is_op: npt.NDArray[np.bool_]) -> Nesting:
    """Depth, parent row and innermost enclosing CPU op row of each of a table's ``n`` rows (-1:
    none, and for every row not at ``host_idx``), ``nest_host_slices`` of the host rows at
    ``host_idx`` (ascending): ``columns`` are their pid, tid, ts and dur, handed over (the list is
    emptied, so that the nesting lets each go once it is used: 16 MB at its peak on 505 k rows)."""
    d, p, o = nest_host_slices(columns.pop(0), columns.pop(0), columns.pop(0), columns.pop(0), is_op)
    del is_op
    # (The whole-table columns are made after the nesting, whose peak they would add to.)
    depth = np.full(n, -1, dtype=np.int64)
    depth[host_idx] = d
    del d
    parent = np.full(n, -1, dtype=np.int64)
    parent[host_idx] = np.where(p >= 0, host_idx[np.maximum(p, 0)], -1)
    del p
    op = np.full(n, -1, dtype=np.int64)
    op[host_idx] = np.where(o >= 0, host_idx[np.maximum(o, 0)], -1)
    return depth, parent, op


def _launch_links(slices: pl.DataFrame, per_process: bool) -> tuple[I64, I64]:
    """(GPU row, its launch call) row pairs: the first call (runtime calls first, ``per_process``)
    with the GPU row's correlation id (and process, ``per_process``). A CUDA-graph launch has
    one correlation id for all of its kernels, so this is many-to-one.

    By a stable sort and a binary search in numpy over one integer key per row: polars' unique
    and join on two keys took 1.1 s for the 1.4 M GPU rows of a 600 MB export, this 0.5 s.
    """
    code = slices.get_column(Col.KIND).cast(KIND_DTYPE).to_physical().to_numpy()
    has = slices.get_column(Col.CORRELATION).is_not_null().to_numpy()
    key = _launch_key(slices, per_process)
    # Calls in the order of preference (rows in table order within each), then stably by key:
    # the first call of each key is its launch.
    preference = [(Kind.RUNTIME,), (Kind.DRIVER,)] if per_process else [LAUNCH_KINDS]
    calls = np.concatenate([np.flatnonzero(_of_kinds(code, kinds) & has) for kinds in preference])
    calls = calls[np.argsort(key[calls], kind="stable")]
    call_keys = key[calls]
    first = np.ones(call_keys.size, dtype=bool)
    first[1:] = call_keys[1:] != call_keys[:-1]
    call_keys, calls = call_keys[first], calls[first]
    gpu = np.flatnonzero(_of_kinds(code, (*GPU_ACTIVITY_KINDS, Kind.GPU_SYNC)) & has)
    if not calls.size:
        return gpu[:0], gpu[:0]
    at = np.minimum(np.searchsorted(call_keys, key[gpu]), call_keys.size - 1)
    found = call_keys[at] == key[gpu]
    return gpu[found], calls[at[found]]


def _of_kinds(code: npt.NDArray[np.integer], kinds: Sequence[Kind]) -> npt.NDArray[np.bool_]:
    """Rows whose kind code is one of ``kinds``."""
    return np.isin(code, [KIND_CODE[k.value] for k in kinds])


def _launch_key(slices: pl.DataFrame, per_process: bool) -> I64:
    """One integer per row that is equal where the correlation id (and pid, ``per_process``) is:
    the pid above the id's 32 bits where both fit (nsys: 24-bit pids, 32-bit CUPTI ids), else
    the rank of the pair. Rows without an id get any key (they are never matched)."""
    correlation = slices.get_column(Col.CORRELATION).fill_null(0).cast(pl.Int64)
    if not per_process:
        return np.asarray(correlation.to_numpy(), dtype=np.int64)
    pid = slices.get_column(Col.PID).fill_null(0).cast(pl.Int64)
    if within(pid, 2**31) and within(correlation, 2**32):
        return np.asarray((pid.to_numpy() << 32) | correlation.to_numpy(), dtype=np.int64)
    pair = pl.struct(pid.alias(Col.PID), correlation.alias(Col.CORRELATION))
    return np.asarray(pl.select(pair.rank("dense")).to_series().to_numpy(), dtype=np.int64)


def within(values: pl.Series, bound: int) -> bool:
    """Whether every value of an integer column (nulls aside) lies in [0, bound): whether it packs
    into ``bound.bit_length() - 1`` bits of a key."""
    low, high = values.min(), values.max()
    return low is None or (int(low) >= 0 and int(high) < bound)  # type: ignore[arg-type]
