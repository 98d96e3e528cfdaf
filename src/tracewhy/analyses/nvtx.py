"""NVTX ranges: their CPU-side summary, their projection onto the GPU, and the step marker
that nsys input defaults to.

The projection follows nsys's ``nvtx_gpu_proj_trace`` / ``nvtx_gpu_proj_sum`` (2023.4):
a GPU operation (kernel, memcpy, memset) belongs to *every* range that contains, on the same
thread, the CUDA API call that launched it (range start <= call start and call end <= range
end). A range's projection spans from its first operation's start to its last operation's
end; ranges without operations are not projected. Ranges that ended on another thread are
left out, as nsys does. Our additions: ``gpu_time_ns`` (sum of the operations' durations) and
``gpu_busy_ns`` (their union), which, unlike the span, leave out GPU idle time.

Annotations from formats without NVTX (Kineto's user annotations) are projected the same way,
as push/pop ranges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.summaries import Summary, summarize
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, LAUNCH_KINDS, Col, Kind, NCol
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]
PROFILER_STEP_PREFIX: Final = "ProfilerStep"
#: A default step marker must repeat at least this often in one process to be a loop.
MIN_STEP_REPEATS: Final = 2
#: NVTX domains libraries open around their own calls, never a training step: "CCCL" (CUB and
#: Thrust, ``NVTXCCCLDomain`` in cub/detail/nvtx.cuh) and "NCCL" (``nccl_domain`` in NCCL's
#: src/include/nvtx.h).
LIBRARY_DOMAINS: Final = frozenset({"CCCL", "NCCL"})
#: torch.autograd.profiler.emit_nvtx's op ranges (api_names.OP_RANGE_SUFFIX): one range per op
#: call, never a step.
OP_RANGE: Final = api_names.OP_RANGE_SUFFIX
#: Ranges whose total time covers at least this share of the span from the first's start to the
#: last's end tile the run (a loop's iterations do; CUB calls between them do not).
TILING_SHARE: Final = 0.5


def ranges(trace: Trace, *, include_marks: bool = False) -> pl.DataFrame:
    """Annotation slices with their NVTX attributes (style PushPop where the format has none).

    Columns: id, name, ts_ns, dur_ns, pid, tid, depth, range_id, style, domain_id, domain,
    end_tid.
    """
    a = trace.of_kind(Kind.ANNOTATION).select(
        Col.ID, pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR, Col.PID, Col.TID, Col.DEPTH
    )
    attrs = trace.nvtx_attrs.select(
        Col.ID, NCol.RANGE_ID, pl.col(NCol.STYLE).cast(pl.String), NCol.DOMAIN_ID, NCol.DOMAIN,
        NCol.END_TID,
    )
    out = a.join(attrs, on=Col.ID, how="left").with_columns(
        pl.col(NCol.RANGE_ID).fill_null(pl.col(Col.ID)),
        pl.col(NCol.STYLE).fill_null("PushPop"),
    )
    return out if include_marks else out.filter(pl.col(NCol.STYLE) != "Mark")


def nvtx_summary(trace: Trace) -> Summary:
    """Range duration per (style, name) on the CPU (nsys ``nvtx_sum``); nesting not subtracted."""
    r = ranges(trace).with_columns(pl.format("{}\t{}", NCol.STYLE, Col.NAME).alias("_key"))
    s = summarize(r.select("_key", Col.DUR), "_key")
    table = s.table.with_columns(
        pl.col("_key").str.split_exact("\t", 1).struct.rename_fields([NCol.STYLE, Col.NAME])
    ).unnest("_key")
    return Summary(table=table.select(NCol.STYLE, Col.NAME, *s.table.columns[1:]),
                   value=s.value, total=s.total)


# --- range tree -------------------------------------------------------------------------------


def range_tree(thread: I64, start: I64, end: I64, order: I64) -> tuple[I64, I64]:
    """Parent (index, -1 for none) and level of each range among ranges of the same thread.

    A range's parent is the range on its thread that contains it (start <= start, end >= end)
    with the least slack (start difference plus end difference), as nsys picks it. Of two
    identical ranges the one earlier in ``order`` is the outer one.
    """
    n = start.shape[0]
    parent = np.full(n, -1, dtype=np.int64)
    level = np.zeros(n, dtype=np.int64)
    if n == 0:
        return parent, level
    # Outer before inner: by thread, start, longest first, then order.
    srt = np.lexsort((order, -end, start, thread))
    t, s, e = thread[srt], start[srt], end[srt]
    # Child candidates of position p: later positions on the same thread starting before p ends.
    hi = _search_by_thread(t, s, t, e, "right")
    lo = np.arange(n) + 1
    count = np.maximum(hi - lo, 0)
    p_idx = np.repeat(np.arange(n), count)
    c_idx = _ranges_concat(lo, count)
    inside = e[c_idx] <= e[p_idx]
    p_idx, c_idx = p_idx[inside], c_idx[inside]
    slack = (s[c_idx] - s[p_idx]) + (e[p_idx] - e[c_idx])
    # Least slack wins; among equals the innermost (latest position) wins.
    pick = np.lexsort((-p_idx, slack, c_idx))
    c_sorted = c_idx[pick]
    first = np.ones(c_sorted.size, dtype=bool)
    first[1:] = c_sorted[1:] != c_sorted[:-1]
    best_parent = np.full(n, -1, dtype=np.int64)
    best_parent[c_sorted[first]] = p_idx[pick][first]
    lv = np.zeros(n, dtype=np.int64)
    bp = best_parent.tolist()
    lvl = lv.tolist()
    for i in range(n):  # parents precede children in this order
        if bp[i] >= 0:
            lvl[i] = lvl[bp[i]] + 1
    parent[srt] = np.where(best_parent >= 0, srt[np.maximum(best_parent, 0)], -1)
    level[srt] = lvl
    return parent, level


#: Banded keys must stay below this; int64 holds up to 2**63 - 1.
_KEY_LIMIT: Final = 2**62


def _search_by_thread(thread: I64, t: I64, q_thread: I64, q_t: I64, side: Literal["left", "right"]) -> I64:
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
        return np.searchsorted(key, (q_thread - lo) * span + (q_t - base), side=side).astype(np.int64)
    out = np.empty(q_t.size, dtype=np.int64)
    first = np.searchsorted(thread, q_thread, side="left")
    last = np.searchsorted(thread, q_thread, side="right")
    for one in np.unique(q_thread):
        mask = q_thread == one
        a, b = int(first[mask][0]), int(last[mask][0])
        out[mask] = a + np.searchsorted(t[a:b], q_t[mask], side=side)
    return out


def _ranges_concat(lo: I64, count: I64) -> I64:
    """Concatenation of arange(lo[i], lo[i] + count[i]) for all i."""
    total = int(count.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(lo - np.concatenate(([0], np.cumsum(count)[:-1])), count)
    return (starts + np.arange(total)).astype(np.int64)


# --- GPU projection ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Unattributed:
    """GPU operations whose launching call is inside no range (nsys's row with no name)."""

    start_ns: int
    dur_ns: int
    num_ops: int


@dataclass(frozen=True)
class ProjectionResult:
    """``table``: one row per projected range, by projected start then longest first.

    Columns: id (the range's slice), name, style, proj_start_ns, proj_dur_ns, ts_ns, dur_ns
    (the range on the CPU), pid, tid, num_gpu_ops (distinct launching calls), gpu_time_ns,
    gpu_busy_ns, level, num_child (projected children), range_id, parent_range_id,
    range_stack (``:id:id...`` from the root).
    ``summary``: per (name, style) as nsys ``nvtx_gpu_proj_sum``.
    """

    table: pl.DataFrame
    summary: pl.DataFrame
    unattributed: Unattributed | None
    ops_without_launch: int


def gpu_projection(trace: Trace) -> ProjectionResult:
    rng = ranges(trace).filter(pl.col(NCol.END_TID).is_null()).select(
        Col.ID, Col.NAME, NCol.STYLE, Col.TS, Col.DUR, Col.PID, Col.TID, NCol.RANGE_ID,
        (pl.col(Col.TS) + pl.col(Col.DUR)).alias("_end"),
    )
    calls = trace.of_kind(*LAUNCH_KINDS).select(
        Col.ID, Col.PID, Col.TID, Col.TS, (pl.col(Col.TS) + pl.col(Col.DUR)).alias("_end")
    )
    gpu = trace.of_kind(*GPU_ACTIVITY_KINDS)
    ops = gpu.filter(pl.col(Col.LAUNCH).is_not_null()).select(
        pl.col(Col.LAUNCH).alias("_call"), Col.TS, (pl.col(Col.TS) + pl.col(Col.DUR)).alias("_end"), Col.DUR
    )
    ops_without_launch = gpu.height - ops.height
    del gpu

    rng, calls = _on_threads(rng, calls)
    parent, level = range_tree(
        rng.get_column("_thread").to_numpy(), rng.get_column(Col.TS).to_numpy(),
        rng.get_column("_end").to_numpy(), rng.get_column(NCol.RANGE_ID).to_numpy(),
    )
    proj, covered = _project(rng, calls, ops)
    del calls
    unattributed = _unattributed(ops.join(pl.DataFrame({"_call": covered}), on="_call", how="anti"))
    del ops
    table = _projection_table(rng, proj, parent, level)
    return ProjectionResult(table=table, summary=_projection_summary(table),
                            unattributed=unattributed, ops_without_launch=ops_without_launch)


def _projection_table(rng: pl.DataFrame, proj: pl.DataFrame, parent: I64, level: I64) -> pl.DataFrame:
    """The projected ranges (``proj``'s rows of ``rng``) with their tree columns, gathered by
    row index from arrays, in their final order: joins and a sort would copy the wide range
    columns once each."""
    range_ids = rng.get_column(NCol.RANGE_ID).to_numpy()
    proj = proj.with_columns(pl.Series("_rid", range_ids[proj.get_column("_range").to_numpy()])).sort(
        ["proj_start_ns", "proj_dur_ns", "_rid"], descending=[False, True, False]
    ).drop("_rid")
    r = proj.get_column("_range").to_numpy()
    par = parent[r]
    num_child = np.bincount(par[par >= 0], minlength=rng.height).astype(np.int64)  # projected children
    stacks = _stacks(r, parent, level, range_ids)
    return rng.select(
        Col.ID, Col.NAME, NCol.STYLE, Col.TS, Col.DUR, Col.PID, Col.TID, NCol.RANGE_ID
    ).gather(r).with_columns(
        *proj.drop("_range").get_columns(),
        pl.Series("level", level[r]),
        pl.Series("num_child", num_child[r]),
        pl.Series("parent_range_id", range_ids[np.maximum(par, 0)]).zip_with(
            pl.Series(par >= 0), pl.Series([None], dtype=pl.Int64).gather(np.zeros(r.size, dtype=np.int64))
        ),
        pl.Series("range_stack", stacks, dtype=pl.String),
    ).select(
        Col.ID, Col.NAME, NCol.STYLE, "proj_start_ns", "proj_dur_ns", Col.TS, Col.DUR, Col.PID,
        Col.TID, "num_gpu_ops", "gpu_time_ns", "gpu_busy_ns", "level", "num_child",
        NCol.RANGE_ID, "parent_range_id", "range_stack",
    )


def _unattributed(loose: pl.DataFrame) -> Unattributed | None:
    """nsys's row with no name: the operations whose launching call is inside no range."""
    if loose.height == 0:
        return None
    first = int(loose.get_column(Col.TS).min())  # type: ignore[arg-type]
    last = int(loose.get_column("_end").max())  # type: ignore[arg-type]
    return Unattributed(first, last - first, int(loose.get_column("_call").n_unique()))


def _on_threads(rng: pl.DataFrame, calls: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Both frames with ``_thread``, one int per (pid, tid) they share, for ``_containing``."""
    threads = pl.concat([rng.select(Col.PID, Col.TID), calls.select(Col.PID, Col.TID)]).unique()
    threads = threads.with_row_index("_thread").with_columns(pl.col("_thread").cast(pl.Int64))
    return (rng.join(threads, on=[Col.PID, Col.TID], how="left", nulls_equal=True),
            calls.join(threads, on=[Col.PID, Col.TID], how="left", nulls_equal=True))


#: (range, operation) rows aggregated at a time by ``_project``: bounds its memory, since a
#: large nsys export nests each call in several ranges (tens of millions of rows in all).
_PROJECT_CHUNK: Final = 1 << 21


def _project(rng: pl.DataFrame, calls: pl.DataFrame, ops: pl.DataFrame) -> tuple[pl.DataFrame, I64]:
    """Per range (``_range``) its projection columns, and the ids of the calls in some range.

    A range's calls are a slice of its thread's calls sorted by start (those that also end in
    it), and a call's operations a slice of the operations sorted by call: so (range, operation)
    rows are gathered from arrays, chunk by chunk of ranges, never as one (range, call) join.
    """
    c = calls.sort(["_thread", Col.TS]).with_row_index("_pos")
    ct, cs, ce = (c.get_column(k).to_numpy() for k in ("_thread", Col.TS, "_end"))
    cid = c.get_column(Col.ID).to_numpy()
    o = ops.join(c.select(pl.col(Col.ID).alias("_call"), "_pos"), on="_call", how="inner").sort("_pos")
    o_pos = o.get_column("_pos").to_numpy()
    o_cols = {k: o.get_column(k).to_numpy() for k in ("_call", Col.TS, "_end", Col.DUR)}
    del o
    first_op = np.searchsorted(o_pos, np.arange(c.height + 1), side="left").astype(np.int64)
    rt, rs, re_ = (rng.get_column(k).to_numpy() for k in ("_thread", Col.TS, "_end"))
    lo = _search_by_thread(ct, cs, rt, rs, "left")
    count = np.maximum(_search_by_thread(ct, cs, rt, re_, "right") - lo, 0)
    covered = np.zeros(c.height, dtype=bool)
    parts = [_project_chunk(r, lo[r], count[r], re_, ce, first_op, o_cols, covered)
             for r in _chunks(first_op[lo + count] - first_op[lo], count)]
    proj = pl.concat(parts) if parts else _project_chunk(
        np.zeros(0, dtype=np.int64), lo[:0], count[:0], re_, ce, first_op, o_cols, covered)
    return proj, cid[covered]


def _chunks(weight: I64, count: I64) -> list[I64]:
    """Consecutive range rows cut where their operations (``weight``) pass ``_PROJECT_CHUNK``;
    the calls each range spans (``count``) weigh in too, as they are gathered before filtering."""
    total = np.cumsum(weight + count)
    cut = np.searchsorted(total, np.arange(_PROJECT_CHUNK, int(total[-1]) if total.size else 0,
                                           _PROJECT_CHUNK), side="right")
    edges = np.unique(np.concatenate(([0], cut, [weight.size])))
    return [np.arange(a, b, dtype=np.int64) for a, b in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True)
            if b > a]


def _project_chunk(
    r: I64, lo: I64, count: I64, re_: I64, ce: I64, first_op: I64,
    o_cols: dict[str, I64], covered: npt.NDArray[np.bool_],
) -> pl.DataFrame:
    """Projection columns of ranges ``r`` (calls at sorted positions lo..lo+count); marks the
    calls they contain in ``covered``."""
    r_idx = np.repeat(r, count)
    c_pos = _ranges_concat(lo.astype(np.int64), count.astype(np.int64))
    inside = ce[c_pos] <= re_[r_idx]
    r_idx, c_pos = r_idx[inside], c_pos[inside]
    covered[c_pos] = True
    n_ops = first_op[c_pos + 1] - first_op[c_pos]
    o_idx = _ranges_concat(first_op[c_pos], n_ops)
    range_ops = pl.DataFrame({"_range": np.repeat(r_idx, n_ops),
                              **{k: v[o_idx] for k, v in o_cols.items()}})
    return range_ops.group_by("_range").agg(
        pl.col(Col.TS).min().alias("proj_start_ns"),
        (pl.col("_end").max() - pl.col(Col.TS).min()).alias("proj_dur_ns"),
        pl.col("_call").n_unique().cast(pl.Int64).alias("num_gpu_ops"),
        pl.col(Col.DUR).sum().alias("gpu_time_ns"),
    ).join(_busy(range_ops), on="_range", how="left")


def _containing(rng: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
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
    lo = _search_by_thread(ct, cs, rt, rs, "left")
    hi = _search_by_thread(ct, cs, rt, re_, "right")
    count = np.maximum(hi - lo, 0)
    r_idx = np.repeat(np.arange(rng.height, dtype=np.int64), count)
    c_pos = _ranges_concat(lo.astype(np.int64), count.astype(np.int64))
    inside = ce[c_pos] <= re_[r_idx]
    return pl.DataFrame({"_range": r_idx[inside], "_call": cid[c_pos[inside]]})


def _busy(range_ops: pl.DataFrame) -> pl.DataFrame:
    """Union length of each range's operations."""
    ordered = range_ops.select("_range", Col.TS, "_end").sort(["_range", Col.TS])
    prev_end = pl.col("_end").cum_max().shift(1).over("_range")
    covered = (pl.col("_end") - pl.max_horizontal(Col.TS, prev_end.fill_null(pl.col(Col.TS)))).clip(
        lower_bound=0
    )
    return ordered.with_columns(covered.alias("_c")).group_by("_range").agg(
        pl.col("_c").sum().cast(pl.Int64).alias("gpu_busy_ns")
    )


def _stacks(rows: I64, parent: I64, level: I64, range_ids: I64) -> pl.Series:
    """The stack ``:id1:id2:...`` from the root down to each of ``rows``, built level by level
    (a parent is one level above its child): a few vectorized steps, not a Python call per
    range (millions of NVTX ranges in a large nsys export)."""
    n = parent.shape[0]
    stacks = pl.Series("range_stack", [""], dtype=pl.String).gather(np.zeros(n, dtype=np.int64))
    ids = pl.Series(range_ids).cast(pl.String)
    by_level = np.argsort(level, kind="stable")
    bounds = np.searchsorted(level[by_level], np.arange(int(level.max()) + 2 if n else 0))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        idx = by_level[lo:hi]
        par = parent[idx]
        prefix = stacks.gather(np.maximum(par, 0)).zip_with(pl.Series(par >= 0), pl.repeat("", idx.size, eager=True))
        stacks.scatter(idx, prefix + ":" + ids.gather(idx))
    return stacks.gather(rows)


def _projection_summary(table: pl.DataFrame) -> pl.DataFrame:
    p = pl.col("proj_dur_ns")
    return (
        table.group_by(Col.NAME, NCol.STYLE)
        .agg(
            p.sum().alias("total_proj_ns"),
            pl.col(Col.DUR).sum().alias("total_range_ns"),
            pl.len().cast(pl.Int64).alias("instances"),
            p.mean().alias("proj_mean_ns"),
            p.median().alias("proj_median_ns"),
            p.min().alias("proj_min_ns"),
            p.max().alias("proj_max_ns"),
            p.std(ddof=1).fill_null(0.0).alias("proj_stddev_ns"),
            pl.col("num_gpu_ops").sum().alias("total_gpu_ops"),
            pl.col("num_gpu_ops").mean().alias("mean_gpu_ops"),
            pl.col("level").mean().alias("mean_level"),
            pl.col("num_child").mean().alias("mean_num_child"),
            pl.col("gpu_time_ns").sum().alias("total_gpu_time_ns"),
            pl.col("gpu_busy_ns").sum().alias("total_gpu_busy_ns"),
        )
        .sort(["total_proj_ns", Col.NAME], descending=[True, False])
    )


# --- default step marker ------------------------------------------------------------------------


@dataclass(frozen=True)
class StepMarker:
    name: str
    repeats: int
    note: str


def nvtx_step_marker(trace: Trace) -> StepMarker | None:
    """The step marker nsys input defaults to when it has no ``ProfilerStep#N`` range.

    A step is a top-level range (ranges are counted per thread, so that work fanned out to a
    thread pool, one range per worker, does not look like a loop). Preferred, in order:

    1. the top-level range name that most often has GPU work projected onto it (``nvtx_gpu_proj``
       semantics), at least ``MIN_STEP_REPEATS`` times on one thread: a loop that drives the GPU;
    2. the only top-level range name with GPU work, however often it occurs (nvFuser's gtests
       run one ``KernelExecutor::runFusion`` amid repeated host-only bookkeeping ranges);
    3. the most repeated top-level range, GPU work or not, and the note says it has none.

    Ties: more repeats, then longer total time, then name. None for other formats, when
    ProfilerStep ranges exist, or when nothing qualifies.
    """
    if trace.meta.format != "nsys":
        return None
    r = ranges(trace)
    if r.filter(pl.col(Col.NAME).str.starts_with(PROFILER_STEP_PREFIX)).height:
        return None
    # A library's own ranges are never the training step (CUB's ranges, nested in the loop but
    # top-level in a few calls after it, were picked once), nor are torch's emit_nvtx op ranges.
    top = r.filter((pl.col(Col.DEPTH) == 0) & ~pl.col(NCol.DOMAIN).fill_null("").is_in(list(LIBRARY_DOMAINS))
                   & ~pl.col(Col.NAME).str.contains(OP_RANGE))
    if top.height == 0:
        return None
    top = top.with_columns(pl.Series("_gpu", _has_gpu_work(trace, top)))
    per_thread = top.group_by(Col.NAME, Col.PID, Col.TID).agg(
        pl.len().alias("n"), pl.col("_gpu").sum().alias("g"), pl.col(Col.DUR).sum().alias("t"),
        ((pl.col(Col.TS) + pl.col(Col.DUR)).max() - pl.col(Col.TS).min()).alias("span"),
    ).with_columns(
        # A loop's ranges tile its run: their period is about their duration.
        ((pl.col("n") >= MIN_STEP_REPEATS) & (pl.col("t") >= TILING_SHARE * pl.col("span"))).alias("tiles")
    )
    by_name = per_thread.group_by(Col.NAME).agg(pl.col("n").max(), pl.col("g").max(), pl.col("t").sum(),
                                                pl.col("tiles").any())
    busy = by_name.filter(pl.col("g") > 0).sort(["tiles", "g", "n", "t", Col.NAME],
                                                 descending=[True, True, True, True, False])
    most = by_name.sort(["n", "t", Col.NAME], descending=[True, True, False]).row(0, named=True)
    hint = "; choose another with --step NAME"
    if busy.height and (busy.row(0, named=True)["g"] >= MIN_STEP_REPEATS or busy.height == 1):
        best = busy.row(0, named=True)
        why = ("the only one with GPU work projected onto it" if best["g"] < MIN_STEP_REPEATS else
               f"the one most often with GPU work projected onto it ({best['g']} times on one thread)")
        if best["tiles"]:
            why += ", and its ranges tile the run"
        skipped = ""
        if most["n"] > best["n"] and most["g"] == 0:
            skipped = f" ({most['name']!r} repeats more, {most['n']} times, but launches no GPU work)"
        elif busy.height > 1:
            second = busy.row(1, named=True)
            skipped = f" (runner-up: {second['name']!r}, {second['g']} times with GPU work)"
        note = f"no ProfilerStep# range: steps are the top-level NVTX range {best['name']!r}, {why}{skipped}{hint}"
        return StepMarker(name=str(best["name"]), repeats=int(best["n"]), note=note)
    if most["n"] < MIN_STEP_REPEATS:
        return None
    note = (f"no ProfilerStep# range: steps are the top-level NVTX range {most['name']!r}, the most "
            f"repeated one ({most['n']} times on one thread); no repeated top-level range has GPU work "
            f"projected onto it, so the steps hold no GPU time{hint}")
    return StepMarker(name=str(most["name"]), repeats=int(most["n"]), note=note)


def _has_gpu_work(trace: Trace, rng: pl.DataFrame) -> npt.NDArray[np.bool_]:
    """Per range: whether a CUDA call inside it, on its thread, launched GPU work."""
    has = np.zeros(rng.height, dtype=np.bool_)
    launching = trace.of_kind(*GPU_ACTIVITY_KINDS).get_column(Col.LAUNCH).drop_nulls().unique()
    calls = trace.of_kind(*LAUNCH_KINDS).filter(pl.col(Col.ID).is_in(launching.implode())).select(
        Col.ID, Col.PID, Col.TID, Col.TS, (pl.col(Col.TS) + pl.col(Col.DUR)).alias("_end")
    )
    # Ranges that end on another thread are not projected (as in gpu_projection).
    inside = rng.with_row_index("_row").filter(pl.col(NCol.END_TID).is_null()).select(
        pl.col("_row").cast(pl.Int64), Col.PID, Col.TID, Col.TS, (pl.col(Col.TS) + pl.col(Col.DUR)).alias("_end"),
    )
    if inside.height == 0 or calls.height == 0:
        return has
    inside, calls = _on_threads(inside, calls)
    pairs = _containing(inside, calls)
    rows = inside.get_column("_row").to_numpy()
    has[rows[pairs.get_column("_range").unique().to_numpy()]] = True
    return has
