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
from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.nvtx_work import (
    GPU_WORK_SCHEMA,
    GpuWork,
    Unattributed,
    WorkCol,
    containing,
    gpu_work,
    on_threads,
    ranges_concat,
    search_by_thread,
    thread_codes,
)
from tracewhy.analyses.summaries import Summary, summarize
from tracewhy.errors import TraceError
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, LAUNCH_KINDS, Col, Kind, NvtxCol
from tracewhy.model.trace import NSYS_FORMAT, Trace

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
    a = trace.kind_columns(
        (Kind.ANNOTATION,), Col.ID, pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR, Col.PID, Col.TID, Col.DEPTH,
    )
    attrs = trace.nvtx_attrs.select(
        Col.ID, NvtxCol.RANGE_ID, pl.col(NvtxCol.STYLE).cast(pl.String), NvtxCol.DOMAIN_ID, NvtxCol.DOMAIN,
        NvtxCol.END_TID,
    )
    out = a.join(attrs, on=Col.ID, how="left").with_columns(
        pl.col(NvtxCol.RANGE_ID).fill_null(pl.col(Col.ID)),
        pl.col(NvtxCol.STYLE).fill_null("PushPop"),
    )
    return out if include_marks else out.filter(pl.col(NvtxCol.STYLE) != "Mark")


def nvtx_summary(trace: Trace) -> Summary:
    """Range duration per (style, name) on the CPU (nsys ``nvtx_sum``); nesting not subtracted."""
    r = ranges(trace).with_columns(pl.format("{}\t{}", NvtxCol.STYLE, Col.NAME).alias("_key"))
    s = summarize(r.select("_key", Col.DUR), "_key")
    table = s.table.with_columns(
        pl.col("_key").str.split_exact("\t", 1).struct.rename_fields([NvtxCol.STYLE, Col.NAME])
    ).unnest("_key")
    return Summary(table=table.select(NvtxCol.STYLE, Col.NAME, *s.table.columns[1:]),
                   value=s.value, total=s.total)


# --- range tree -------------------------------------------------------------------------------


#: The containment candidates ``range_tree`` may weigh (about 40 bytes each): ranges nested d
#: deep give about n x d; 13,513 ranges all at one instant (a fuzzed export) gave 91 million,
#: 2.7 GB from a 322 KB file.
NESTING_PAIRS_FLOOR: Final = 16_000_000
NESTING_PAIRS_PER_RANGE: Final = 64


class NestingTooDense(ValueError):
    """More containment candidates than the bound: ranges piled on one another."""

    def __init__(self, ranges: int, pairs: int) -> None:
        super().__init__(f"{ranges} NVTX ranges give {pairs:,} containment candidates, more than the "
                         f"{max(NESTING_PAIRS_FLOOR, NESTING_PAIRS_PER_RANGE * ranges):,} tracewhy weighs "
                         "(ranges piled at one instant or nested thousands deep): refusing to nest them")


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
    hi = search_by_thread(t, s, t, e, "right")
    lo = np.arange(n) + 1
    count = np.maximum(hi - lo, 0)
    pairs = int(count.sum())
    if pairs > max(NESTING_PAIRS_FLOOR, NESTING_PAIRS_PER_RANGE * n):
        raise NestingTooDense(n, pairs)
    p_idx = np.repeat(np.arange(n), count)
    c_idx = ranges_concat(lo, count)
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
    parent[srt] = np.where(best_parent >= 0, srt[np.maximum(best_parent, 0)], -1)
    level[srt] = _levels(best_parent)
    return parent, level


def _levels(parent: I64) -> I64:
    """Each node's number of ancestors, a level at a time: the nodes whose parent's level is
    known take it plus one (as many numpy passes as the forest is deep, no Python step per range)."""
    level = np.where(parent >= 0, -1, 0)
    pending = np.flatnonzero(parent >= 0)
    while pending.size:
        above = level[parent[pending]]
        known = above >= 0
        level[pending[known]] = above[known] + 1
        pending = pending[~known]
    return level.astype(np.int64)


# --- GPU projection ---------------------------------------------------------------------------


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


def gpu_projection(trace: Trace, work: GpuWork | None = None) -> ProjectionResult:
    """The projection table and summary; ``work`` is ``gpu_work(trace)`` when the caller has it."""
    work = work or gpu_work(trace)
    rng = ranges(trace).filter(pl.col(NvtxCol.END_TID).is_null()).select(
        Col.ID, Col.NAME, NvtxCol.STYLE, Col.TS, Col.DUR, Col.PID, Col.TID, NvtxCol.RANGE_ID,
        (pl.col(Col.TS) + pl.col(Col.DUR)).alias("_end"),
    )
    thread, _ = thread_codes(rng, rng.clear())
    try:
        parent, level = range_tree(
            thread, rng.get_column(Col.TS).to_numpy(), rng.get_column("_end").to_numpy(),
            rng.get_column(NvtxCol.RANGE_ID).to_numpy(),
        )
    except NestingTooDense as e:
        raise TraceError(trace.meta.path, str(e)) from None
    ids = rng.get_column(Col.ID).to_numpy()
    by_id = np.argsort(ids, kind="stable")
    proj = work.table.select(
        pl.Series("_range", by_id[np.searchsorted(ids[by_id], work.table.get_column(WorkCol.ID).to_numpy())]),
        *(c for c in GPU_WORK_SCHEMA if c != WorkCol.ID),
    )
    table = _projection_table(rng, proj, parent, level)
    return ProjectionResult(table=table, summary=_projection_summary(table),
                            unattributed=work.unattributed, ops_without_launch=work.ops_without_launch)


def _projection_table(rng: pl.DataFrame, proj: pl.DataFrame, parent: I64, level: I64) -> pl.DataFrame:
    """The projected ranges (``proj``'s rows of ``rng``) with their tree columns, gathered by
    row index from arrays, in their final order: joins and a sort would copy the wide range
    columns once each."""
    range_ids = rng.get_column(NvtxCol.RANGE_ID).to_numpy()
    proj = proj.with_columns(pl.Series("_rid", range_ids[proj.get_column("_range").to_numpy()])).sort(
        ["proj_start_ns", "proj_dur_ns", "_rid"], descending=[False, True, False]
    ).drop("_rid")
    r = proj.get_column("_range").to_numpy()
    par = parent[r]
    num_child = np.bincount(par[par >= 0], minlength=rng.height).astype(np.int64)  # projected children
    stacks = _stacks(r, parent, level, range_ids)
    return rng.select(
        Col.ID, Col.NAME, NvtxCol.STYLE, Col.TS, Col.DUR, Col.PID, Col.TID, NvtxCol.RANGE_ID
    ).gather(r).with_columns(
        *proj.drop("_range").get_columns(),
        pl.Series("level", level[r]),
        pl.Series("num_child", num_child[r]),
        pl.Series("parent_range_id", range_ids[np.maximum(par, 0)]).zip_with(
            pl.Series(par >= 0), pl.Series([None], dtype=pl.Int64).gather(np.zeros(r.size, dtype=np.int64))
        ),
        pl.Series("range_stack", stacks, dtype=pl.String),
    ).select(
        Col.ID, Col.NAME, NvtxCol.STYLE, "proj_start_ns", "proj_dur_ns", Col.TS, Col.DUR, Col.PID,
        Col.TID, "num_gpu_ops", "gpu_time_ns", "gpu_busy_ns", "level", "num_child",
        NvtxCol.RANGE_ID, "parent_range_id", "range_stack",
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
        table.group_by(Col.NAME, NvtxCol.STYLE)
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


class StepMarker(msgspec.Struct, frozen=True):
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
    if trace.meta.format != NSYS_FORMAT:
        return None
    trace.require(Kind.ANNOTATION)
    marks = trace.nvtx_attrs.filter(pl.col(NvtxCol.STYLE) == "Mark").get_column(NvtxCol.ID).implode()
    annotation = pl.col(Col.KIND) == Kind.ANNOTATION.value
    # Names are tested as categories, before any row becomes a string: a large export holds
    # millions of ranges under a few thousand names (their strings took 1 GB at the peak).
    stepped = trace.slices.lazy().filter(annotation & pl.col(Col.NAME).cat.starts_with(PROFILER_STEP_PREFIX))
    if stepped.filter(~pl.col(Col.ID).is_in(marks)).select(pl.len()).collect().item():
        return None
    # A library's own ranges are never the training step (CUB's ranges, nested in the loop but
    # top-level in a few calls after it, were picked once), nor are torch's emit_nvtx op ranges.
    top = _top_level_ranges(trace, annotation & (pl.col(Col.DEPTH) == 0) & ~pl.col(Col.ID).is_in(marks))
    top = top.filter(~pl.col(NvtxCol.DOMAIN).fill_null("").is_in(list(LIBRARY_DOMAINS))
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


def _top_level_ranges(trace: Trace, rows: pl.Expr) -> pl.DataFrame:
    """The slices ``rows`` selects (top-level ranges, not marks) with their names as strings and
    the NVTX attributes the step marker reads; only these rows are copied, in slice order."""
    r = trace.slices_where(rows, Col.ID, pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR, Col.PID, Col.TID)
    attrs = trace.nvtx_attrs.select(Col.ID, NvtxCol.DOMAIN, NvtxCol.END_TID)
    return r.join(attrs, on=Col.ID, how="left", maintain_order="left")


def _has_gpu_work(trace: Trace, rng: pl.DataFrame) -> npt.NDArray[np.bool_]:
    """Per range: whether a CUDA call inside it, on its thread, launched GPU work."""
    has = np.zeros(rng.height, dtype=np.bool_)
    launching = trace.kind_columns(GPU_ACTIVITY_KINDS, Col.LAUNCH).get_column(Col.LAUNCH).drop_nulls().unique()
    calls = trace.kind_columns(
        LAUNCH_KINDS, Col.ID, Col.PID, Col.TID, Col.TS, (pl.col(Col.TS) + pl.col(Col.DUR)).alias("_end")
    ).filter(pl.col(Col.ID).is_in(launching.implode()))
    # Ranges that end on another thread are not projected (as in gpu_projection).
    inside = rng.with_row_index("_row").filter(pl.col(NvtxCol.END_TID).is_null()).select(
        pl.col("_row").cast(pl.Int64), Col.PID, Col.TID, Col.TS, (pl.col(Col.TS) + pl.col(Col.DUR)).alias("_end"),
    )
    if inside.height == 0 or calls.height == 0:
        return has
    inside, calls = on_threads(inside, calls)
    pairs = containing(inside, calls)
    rows = inside.get_column("_row").to_numpy()
    has[rows[pairs.get_column("_range").unique().to_numpy()]] = True
    return has
