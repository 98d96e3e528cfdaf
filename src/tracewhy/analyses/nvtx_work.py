"""The GPU work each NVTX range launched (nsys's ``nvtx_gpu_proj_trace`` measures, without the
range tree): the part of the projection that ``blocks`` needs, computed once per diagnosis and
shared with the full projection of analyses/nvtx.py.

A GPU operation belongs to every range that contains, on the same thread, the CUDA API call that
launched it; see analyses/nvtx.py for the rules. Everything here works on a few int64 arrays per
range, call and operation: a large nsys export holds millions of ranges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.model.schema import GPU_ACTIVITY_KINDS, LAUNCH_KINDS, Col, Kind, NvtxCol
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]


class WorkCol:
    """Columns of GpuWork.table (the names of nsys's projection, plus our two sums)."""

    ID: Final = Col.ID
    PROJ_START: Final = "proj_start_ns"  # first operation's start
    PROJ_DUR: Final = "proj_dur_ns"  # to the last operation's end
    GPU_OPS: Final = "num_gpu_ops"  # distinct launching calls
    GPU_TIME: Final = "gpu_time_ns"  # the operations' durations, summed
    GPU_BUSY: Final = "gpu_busy_ns"  # their union


GPU_WORK_SCHEMA: Final = pl.Schema({
    WorkCol.ID: pl.Int64(), WorkCol.PROJ_START: pl.Int64(), WorkCol.PROJ_DUR: pl.Int64(),
    WorkCol.GPU_OPS: pl.Int64(), WorkCol.GPU_TIME: pl.Int64(), WorkCol.GPU_BUSY: pl.Int64(),
})


@dataclass(frozen=True)
class Unattributed:
    """GPU operations whose launching call is inside no range (nsys's row with no name)."""

    start_ns: int
    dur_ns: int
    num_ops: int


@dataclass(frozen=True)
class GpuWork:
    """``table`` (GPU_WORK_SCHEMA): one row per projected range (a range that launched GPU
    work), by id (the ranges' slice order). ``ops_without_launch``: GPU operations whose launching
    call is not in the trace."""

    table: pl.DataFrame
    unattributed: Unattributed | None
    ops_without_launch: int


def projectable(trace: Trace, *columns: str | pl.Expr) -> pl.DataFrame:
    """The ranges nsys projects: annotations that are not marks and ended on their own thread.

    Columns: id, pid, tid, ts_ns, _end (and ``columns`` of the annotation slices), slice order.
    """
    trace.require(Kind.ANNOTATION)
    attrs = trace.nvtx_attrs.filter((pl.col(NvtxCol.STYLE) == "Mark") | pl.col(NvtxCol.END_TID).is_not_null())
    # One query: the rows are filtered before their columns are copied, once.
    return trace.slices_where(
        (pl.col(Col.KIND) == Kind.ANNOTATION.value) & ~pl.col(Col.ID).is_in(attrs.get_column(NvtxCol.ID).implode()),
        Col.ID, Col.PID, Col.TID, Col.TS, (pl.col(Col.TS) + pl.col(Col.DUR)).alias("_end"), *columns)


def gpu_work(trace: Trace) -> GpuWork:
    rng = projectable(trace)
    calls = trace.kind_columns(LAUNCH_KINDS, Col.ID, Col.PID, Col.TID, Col.TS,
                         (pl.col(Col.TS) + pl.col(Col.DUR)).alias("_end"))
    ops = trace.kind_columns(GPU_ACTIVITY_KINDS, pl.col(Col.LAUNCH).alias("_call"), Col.TS,
                       (pl.col(Col.TS) + pl.col(Col.DUR)).alias("_end"), Col.DUR)
    without_launch = ops.get_column("_call").null_count()
    ops = ops.drop_nulls("_call")
    r_thread, c_thread = thread_codes(rng, calls)
    # Only what the projection reads from here on (millions of ranges).
    rng = rng.select(Col.ID, Col.TS, "_end")
    calls = calls.select(Col.ID, Col.TS, "_end", pl.Series("_thread", c_thread))
    proj, covered = _project((r_thread, rng.get_column(Col.TS).to_numpy(), rng.get_column("_end").to_numpy()),
                             calls, ops)
    ids = rng.get_column(Col.ID).to_numpy()
    table = proj.sort("_range").with_columns(pl.Series(WorkCol.ID, ids[proj.get_column("_range").to_numpy()]))
    loose = ops.filter(~pl.col("_call").is_in(pl.Series(covered).implode()))
    return GpuWork(table=table.select(*GPU_WORK_SCHEMA), unattributed=_unattributed(loose),
                   ops_without_launch=without_launch)


def _unattributed(loose: pl.DataFrame) -> Unattributed | None:
    """nsys's row with no name: the operations whose launching call is inside no range."""
    if loose.height == 0:
        return None
    first = int(loose.get_column(Col.TS).min())  # type: ignore[arg-type]
    last = int(loose.get_column("_end").max())  # type: ignore[arg-type]
    return Unattributed(first, last - first, int(loose.get_column("_call").n_unique()))


#: Banded keys must stay below this; int64 holds up to 2**63 - 1.
_KEY_LIMIT: Final = 2**62


def search_by_thread(thread: I64, t: I64, q_thread: I64, q_t: I64, side: Literal["left", "right"]) -> I64:
    """``searchsorted`` over (thread, t) pairs sorted by thread then t, for each query pair.

    One global search over banded keys ``(thread - lo) * span + (t - base)``, which order the
    pairs in one int64, is a per-thread search without a Python loop. Keys that would not fit
    (a capture spanning a century, as a trace with some times written 1000x too large does)
    are searched thread by thread instead.
    """
    if t.size == 0 or q_t.size == 0:
        return np.zeros(q_t.size, dtype=np.int64)
    base = min(int(t.min()), int(q_t.min()))
    span = max(int(t.max()), int(q_t.max())) - base + 1
    lo = min(int(thread.min()), int(q_thread.min()))
    threads = max(int(thread.max()), int(q_thread.max())) - lo + 1
    if threads * span < _KEY_LIMIT:
        key = (thread - lo) * span + (t - base)
        return np.searchsorted(key, (q_thread - lo) * span + (q_t - base), side=side).astype(np.int64, copy=False)
    out = np.empty(q_t.size, dtype=np.int64)
    first = np.searchsorted(thread, q_thread, side="left")
    last = np.searchsorted(thread, q_thread, side="right")
    for one in np.unique(q_thread):
        mask = q_thread == one
        a, b = int(first[mask][0]), int(last[mask][0])
        out[mask] = a + np.searchsorted(t[a:b], q_t[mask], side=side)
    return out


def ranges_concat(lo: I64, count: I64) -> I64:
    """Concatenation of arange(lo[i], lo[i] + count[i]) for all i."""
    total = int(count.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(lo - np.concatenate(([0], np.cumsum(count)[:-1])), count)
    return (starts + np.arange(total)).astype(np.int64)


def thread_codes(rng: pl.DataFrame, calls: pl.DataFrame) -> tuple[I64, I64]:
    """One int per (pid, tid) the two frames share, per row of each, for ``search_by_thread``
    (null equals null). Made from each value's rank among the few distinct ones, not by a join:
    the ranges are millions of rows, and a join of them costs 0.3 GB."""
    (r_code, c_code), _ = _ranks(rng, calls, Col.PID)
    (tid_r, tid_c), tids = _ranks(rng, calls, Col.TID)
    # In place: on millions of ranges each temporary is tens of MB, at a diagnosis' peak.
    for code, tid in ((r_code, tid_r), (c_code, tid_c)):
        code *= tids + 1
        code += tid
    return r_code, c_code


def _ranks(rng: pl.DataFrame, calls: pl.DataFrame, col: str) -> tuple[tuple[I64, I64], int]:
    """Rank of each row's ``col`` among the distinct values of both frames (null ranks last, after
    all of them), and how many there are."""
    values = np.sort(pl.concat([f.get_column(col).drop_nulls().unique() for f in (rng, calls)]).unique().to_numpy())

    def rank(frame: pl.DataFrame) -> I64:
        c = frame.get_column(col)
        at = np.searchsorted(values, c.fill_null(values[0] if values.size else 0).to_numpy()).astype(np.int64)
        if c.null_count():
            at[c.is_null().to_numpy()] = values.size
        return at

    return (rank(rng), rank(calls)), int(values.size)


def on_threads(rng: pl.DataFrame, calls: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Both frames with ``_thread`` (``thread_codes``)."""
    r_thread, c_thread = thread_codes(rng, calls)
    return rng.with_columns(pl.Series("_thread", r_thread)), calls.with_columns(pl.Series("_thread", c_thread))


#: (range, operation) rows aggregated at a time by ``_project``: bounds its memory, since a
#: large nsys export nests each call in several ranges (tens of millions of rows in all). On the
#: 606 MB export, 2**19 rather than 2**21 leaves 250 MB less resident after the projection and
#: peaks 65 MB lower, in no more CPU time (2.65 s against 2.9 s); smaller gains nothing more.
_PROJECT_CHUNK: Final = 1 << 19


class _Ops(msgspec.Struct, frozen=True):
    """The operations sorted by their call's position among the calls sorted by (thread, start),
    and where each call's operations begin (``first``, one more than the calls). Times are also
    kept as ranks among all their start and end times (``times``), for the busy-time sweep."""

    call: I64
    ts: I64
    end: I64
    dur: I64
    first: I64
    times: I64
    ts_rank: I64
    end_rank: I64


def _project(rng: tuple[I64, I64, I64], calls: pl.DataFrame, ops: pl.DataFrame) -> tuple[pl.DataFrame, I64]:
    """Per range (``_range``, its row in ``rng``: thread, start, end) its projection columns, and
    the ids of the calls in some range.

    A range's calls are a slice of its thread's calls sorted by start (those that also end in
    it), and a call's operations a slice of the operations sorted by call: so (range, operation)
    rows are gathered from arrays, chunk by chunk of ranges, never as one (range, call) join.
    """
    c = calls.sort(["_thread", Col.TS]).with_row_index("_pos")
    ct, cs, ce = (c.get_column(k).to_numpy() for k in ("_thread", Col.TS, "_end"))
    cid = c.get_column(Col.ID).to_numpy()
    o = ops.join(c.select(pl.col(Col.ID).alias("_call"), "_pos"), on="_call", how="inner").sort("_pos")
    o_ts, o_end = o.get_column(Col.TS).to_numpy(), o.get_column("_end").to_numpy()
    times = np.sort(np.concatenate((o_ts, o_end)))
    times = times[np.concatenate(([True], times[1:] != times[:-1]))] if times.size else times  # distinct
    op = _Ops(call=o.get_column("_call").to_numpy(), ts=o_ts, end=o_end, dur=o.get_column(Col.DUR).to_numpy(),
              first=np.searchsorted(o.get_column("_pos").to_numpy(), np.arange(c.height + 1), side="left"
                                    ).astype(np.int64),
              times=times, ts_rank=np.searchsorted(times, o_ts), end_rank=np.searchsorted(times, o_end))
    del o, c
    rt, rs, re_ = rng
    lo = search_by_thread(ct, cs, rt, rs, "left")
    count = search_by_thread(ct, cs, rt, re_, "right")
    count -= lo
    np.maximum(count, 0, out=count)
    covered = np.zeros(cid.size, dtype=bool)
    parts = [_project_chunk(np.arange(a, b, dtype=np.int64), lo[a:b], count[a:b], re_, ce, op, covered)
             for a, b in _chunks(op.first[lo + count] - op.first[lo], count)]
    proj = pl.concat(parts) if parts else _project_chunk(
        np.zeros(0, dtype=np.int64), lo[:0], count[:0], re_, ce, op, covered)
    return proj, cid[covered]


def _chunks(weight: I64, count: I64) -> list[tuple[int, int]]:
    """Consecutive range rows cut where their operations (``weight``) pass ``_PROJECT_CHUNK``;
    the calls each range spans (``count``) weigh in too, as they are gathered before filtering."""
    total = np.cumsum(weight + count)
    cut = np.searchsorted(total, np.arange(_PROJECT_CHUNK, int(total[-1]) if total.size else 0,
                                           _PROJECT_CHUNK), side="right")
    edges = np.unique(np.concatenate(([0], cut, [weight.size])))
    return [(a, b) for a, b in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True) if b > a]


def _project_chunk(r: I64, lo: I64, count: I64, re_: I64, ce: I64, op: _Ops,
                   covered: npt.NDArray[np.bool_]) -> pl.DataFrame:
    """Projection columns of ranges ``r`` (calls at sorted positions lo..lo+count); marks the
    calls they contain in ``covered``. The (range, operation) rows come grouped by range (``r``
    ascends), so each measure is one ``reduceat`` over the groups."""
    r_idx = np.repeat(r, count)
    c_pos = ranges_concat(lo.astype(np.int64), count.astype(np.int64))
    inside = ce[c_pos] <= re_[r_idx]
    r_idx, c_pos = r_idx[inside], c_pos[inside]
    covered[c_pos] = True
    n_ops = op.first[c_pos + 1] - op.first[c_pos]
    launching = n_ops > 0
    r_idx, c_pos, n_ops = r_idx[launching], c_pos[launching], n_ops[launching]
    if r_idx.size == 0:
        return pl.DataFrame({"_range": r_idx, **dict.fromkeys(list(GPU_WORK_SCHEMA)[1:], r_idx)})
    new = np.concatenate(([True], r_idx[1:] != r_idx[:-1]))
    ranges = r_idx[new]
    calls_per_range = np.diff(np.append(np.flatnonzero(new), r_idx.size))
    o_idx = ranges_concat(op.first[c_pos], n_ops)
    group = np.repeat(np.cumsum(new) - 1, n_ops)  # the range's position in ``ranges``
    starts = np.searchsorted(group, np.arange(ranges.size))
    first_ts = np.minimum.reduceat(op.ts[o_idx], starts)
    return pl.DataFrame({
        "_range": ranges,
        WorkCol.PROJ_START: first_ts,
        WorkCol.PROJ_DUR: np.maximum.reduceat(op.end[o_idx], starts) - first_ts,
        WorkCol.GPU_OPS: calls_per_range.astype(np.int64),  # each call once per range
        WorkCol.GPU_TIME: np.add.reduceat(op.dur[o_idx], starts),
        WorkCol.GPU_BUSY: _busy(group, o_idx, starts, op),
    })


def _busy(group: I64, o_idx: I64, starts: I64, op: _Ops) -> I64:
    """Union length of each group's operations: a sweep over them by start, each adding what it
    covers past the latest end before it in its group. Group and time rank share one int64 key,
    which fits: (groups) x (distinct times) stays under 2**63 for up to ~10**9 operations."""
    width = op.times.size + 1
    order = np.argsort(group * width + op.ts_rank[o_idx], kind="stable")
    o_sorted = o_idx[order]
    band = group[order] * width  # ``group`` is sorted, so ``order`` keeps each group's rows together
    latest = np.maximum.accumulate(band + op.end_rank[o_sorted]) - band  # rank of the latest end so far
    ts = op.ts[o_sorted]
    prev_end = np.empty_like(ts)
    prev_end[1:] = op.times[latest[:-1]]
    prev_end[starts] = ts[starts]  # a group's first operation: nothing before it
    covered = np.clip(op.end[o_sorted] - np.maximum(ts, prev_end), 0, None)
    return np.add.reduceat(covered, starts).astype(np.int64)


def containing(rng: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """(range row, call id) for every call that a range on its thread contains."""
    empty = pl.DataFrame(schema={"_range": pl.Int64(), "_call": pl.Int64()})
    if rng.height == 0 or calls.height == 0:
        return empty
    c = calls.sort(["_thread", Col.TS])
    ct = c.get_column("_thread").to_numpy()
    cs = c.get_column(Col.TS).to_numpy()
    ce = c.get_column("_end").to_numpy()
    cid = c.get_column(Col.ID).to_numpy()
    rt = rng.get_column("_thread").to_numpy()
    rs = rng.get_column(Col.TS).to_numpy()
    re_ = rng.get_column("_end").to_numpy()
    lo = search_by_thread(ct, cs, rt, rs, "left")
    hi = search_by_thread(ct, cs, rt, re_, "right")
    count = np.maximum(hi - lo, 0)
    r_idx = np.repeat(np.arange(rng.height, dtype=np.int64), count)
    c_pos = ranges_concat(lo.astype(np.int64), count.astype(np.int64))
    inside = ce[c_pos] <= re_[r_idx]
    return pl.DataFrame({"_range": r_idx[inside], "_call": cid[c_pos[inside]]})
