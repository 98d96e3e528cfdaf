"""Measurements behind the six ``nsys analyze`` rules (nsys 2023.4), from any input format.

Each function returns every matching row, longest first; nsys prints the first 50. Findings
turn these into statements; here only the measuring criteria live, with NVIDIA's defaults:

- ``pageable_async_memcpy``: async copies from/to pageable memory, which run synchronously.
- ``sync_memcpy``: synchronous ``cudaMemcpy*`` copies (small pageable HtoD ones excepted).
- ``sync_memset``: synchronous ``cudaMemset*`` on pinned or managed memory.
- ``sync_api_calls``: ``cudaDeviceSynchronize`` / ``cudaStreamSynchronize`` calls.
- ``gpu_gaps``: stretches where a process's device runs nothing for longer than a threshold.
- ``gpu_low_utilization``: equal time chunks of a device's active span with low in-use time.

Differences from nsys, all deliberate: a GPU operation is matched to its API call within its
own process (nsys matches the correlation id alone, which repeats across processes); the
model does not keep CUPTI's src/dst device ids, so the same-device exclusion of
``cuda_memcpy_sync`` is not applied (CUPTI fills them for peer copies only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, CopyAttrCol, Kind
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]

#: cuda_memcpy_sync skips HtoD copies of at most this many bytes: the driver stages small
#: pageable copies through a pinned buffer and returns at once (nsys docs say "64 KB").
SMALL_HTOD_BYTES: Final = 64_000
#: gpu_gaps: a device idle longer than this within its active span is reported (nsys: 500 ms).
GPU_GAP_NS: Final = 500_000_000
#: gpu_time_util: chunks whose in-use time is below this percentage are reported (nsys: 50).
LOW_UTIL_PCT: Final = 50.0
#: gpu_time_util: a device's active span is cut into this many equal chunks (nsys: 30).
UTIL_CHUNKS: Final = 30
#: Profiler overhead nsys counts as GPU-busy, so it is not blamed on the user (PROFILER_OVERHEAD
#: names of nsys 2023.4; newer captures name their flushes differently).
BUSY_OVERHEAD_NAMES: Final = ("CUDA profiling data flush overhead", "CUDA profiling stop overhead",
                              "CUDA profiling overhead")
# SQL LIKE patterns (case-insensitive) nsys matches API names with.
ASYNC_MEMCPY_API: Final = "cudaMemcpy%Async%"
SYNC_MEMCPY_API: Final = "cudaMemcpy%"
SYNC_MEMSET_API: Final = "cudaMemset%"
SYNC_APIS: Final = ("cudaDeviceSynchronize%", "cudaStreamSynchronize%")


@lru_cache(maxsize=32)
def like_regex(pattern: str) -> str:
    """An SQL LIKE pattern (``%`` any run, ``_`` one character, case-insensitive for ASCII, as
    SQLite's LIKE) as a regular expression."""
    body = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern)
    return f"(?is)^{body}$"


def _matches(names: pl.Expr, pattern: str) -> pl.Expr:
    return names.str.contains(like_regex(pattern))


@dataclass(frozen=True)
class CopyRuleResult:
    """Memory operations a rule flags, longest first.

    Columns: id, ts_ns, dur_ns, pid, device, stream, bytes, copy_kind, src_mem, dst_mem, api.
    """

    table: pl.DataFrame


def copies_with_api(trace: Trace, kind: Kind) -> pl.DataFrame:
    """The copies (or memsets) of ``kind`` with their attributes and the name of the API call that
    launched each (the rows the copy rules filter)."""
    trace.require_whole()
    s = trace.slices
    ops = trace.of_kind(kind).filter(pl.col(Col.LAUNCH).is_not_null()).select(
        Col.ID, Col.TS, Col.DUR, Col.PID, Col.DEVICE, Col.STREAM, Col.LAUNCH
    )
    # The launching call's name, gathered by id (ids are row numbers): only these rows' names
    # become strings, not the whole table's.
    ops = ops.with_columns(s.get_column(Col.NAME).gather(ops.get_column(Col.LAUNCH)).cast(pl.String).alias("api"))
    attrs = trace.copy_attrs.with_columns(
        pl.col(CopyAttrCol.COPY_KIND).cast(pl.String), pl.col(CopyAttrCol.SRC_MEM).cast(pl.String),
        pl.col(CopyAttrCol.DST_MEM).cast(pl.String),
    )
    return ops.join(attrs, on=Col.ID, how="left").select(
        Col.ID, Col.TS, Col.DUR, Col.PID, Col.DEVICE, Col.STREAM, CopyAttrCol.BYTES, CopyAttrCol.COPY_KIND,
        CopyAttrCol.SRC_MEM, CopyAttrCol.DST_MEM, "api",
    )


def _longest_first(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort([Col.DUR, Col.TS], descending=[True, False])


def pageable_async_memcpy(trace: Trace, *, copies: pl.DataFrame | None = None) -> CopyRuleResult:
    """Async copies with a pageable side: the driver copies them synchronously (nsys
    ``cuda_memcpy_async``; no size or duration threshold). ``copies``: the trace's
    ``copies_with_api(trace, Kind.MEMCPY)``, when the caller has it."""
    c = (copies if copies is not None else copies_with_api(trace, Kind.MEMCPY)).filter(
        _matches(pl.col("api"), ASYNC_MEMCPY_API)
        & ((pl.col(CopyAttrCol.SRC_MEM) == "Pageable") | (pl.col(CopyAttrCol.DST_MEM) == "Pageable"))
    )
    return CopyRuleResult(_longest_first(c))


def sync_memcpy(trace: Trace, small_htod_bytes: int = SMALL_HTOD_BYTES, *,
                copies: pl.DataFrame | None = None) -> CopyRuleResult:
    """Synchronous ``cudaMemcpy*`` copies, which block the calling thread (nsys
    ``cuda_memcpy_sync``), except HtoD copies of at most ``small_htod_bytes``. ``copies``: as
    ``pageable_async_memcpy`` takes it."""
    c = (copies if copies is not None else copies_with_api(trace, Kind.MEMCPY)).filter(
        _matches(pl.col("api"), SYNC_MEMCPY_API)
        & ~_matches(pl.col("api"), "%Async%")
        & ~((pl.col(CopyAttrCol.BYTES) <= small_htod_bytes) & (pl.col(CopyAttrCol.COPY_KIND) == "HtoD"))
    )
    return CopyRuleResult(_longest_first(c))


def sync_memset(trace: Trace) -> CopyRuleResult:
    """Synchronous ``cudaMemset*`` on pinned or managed memory (nsys ``cuda_memset_sync``)."""
    c = copies_with_api(trace, Kind.MEMSET).filter(
        _matches(pl.col("api"), SYNC_MEMSET_API)
        & ~_matches(pl.col("api"), "%async%")
        & pl.col(CopyAttrCol.DST_MEM).is_in(["Pinned", "Managed"])
    )
    return CopyRuleResult(_longest_first(c))


@dataclass(frozen=True)
class SyncApiResult:
    """Host-blocking synchronization calls, longest first. Columns: id, ts_ns, dur_ns, pid,
    tid, api."""

    table: pl.DataFrame
    patterns: tuple[str, ...]


def sync_api_calls(trace: Trace, patterns: tuple[str, ...] = SYNC_APIS) -> SyncApiResult:
    """CUDA API calls whose name matches one of the LIKE ``patterns`` (nsys ``cuda_api_sync``:
    device and stream synchronize; cudaEventSynchronize is what nsys recommends instead)."""
    calls = trace.kind_columns((Kind.RUNTIME, Kind.DRIVER), Col.ID, Col.TS, Col.DUR, Col.PID, Col.TID,
                               pl.col(Col.NAME).alias("api"))
    # The patterns are matched on the distinct names, and only the calls kept get their name as a
    # string (1.9 M calls on a 600 MB export).
    names = calls.select(pl.col("api").unique().drop_nulls().cast(pl.String))
    hit = pl.lit(False)
    for p in patterns:
        hit = hit | _matches(pl.col("api"), p)
    matching = names.filter(hit).get_column("api")
    kept = calls.filter(pl.col("api").is_in(matching.implode())).with_columns(pl.col("api").cast(pl.String))
    return SyncApiResult(_longest_first(kept), patterns)


# --- GPU idle time ------------------------------------------------------------------------------


def gpu_busy_intervals(trace: Trace) -> pl.DataFrame:
    """What counts as a device being busy for gaps and utilization, as nsys counts it.

    Kernels, copies and memsets (start > 0) per (pid, device), all streams together, plus
    profiler overhead named in ``BUSY_OVERHEAD_NAMES`` that lies strictly inside a (pid,
    device)'s active span. Columns: pid, device, ts_ns, end_ns.
    """
    gpu = trace.of_kind(*GPU_ACTIVITY_KINDS).filter(pl.col(Col.TS) > 0).select(
        Col.PID, Col.DEVICE, Col.TS, (pl.col(Col.TS) + pl.col(Col.DUR)).alias("end_ns")
    )
    spans = gpu.group_by(Col.PID, Col.DEVICE).agg(
        pl.col(Col.TS).min().alias("_lo"), pl.col("end_ns").max().alias("_hi")
    )
    overhead = trace.of_kind(Kind.OVERHEAD).filter(
        pl.col(Col.NAME).cast(pl.String).is_in(list(BUSY_OVERHEAD_NAMES))
    ).select(Col.PID, Col.TS, (pl.col(Col.TS) + pl.col(Col.DUR)).alias("end_ns"))
    inside = overhead.join(spans, on=Col.PID, how="inner").filter(
        (pl.col(Col.TS) > pl.col("_lo")) & (pl.col("end_ns") < pl.col("_hi"))
    ).select(Col.PID, Col.DEVICE, Col.TS, "end_ns")
    return pl.concat([gpu, inside.cast(gpu.schema)])


@dataclass(frozen=True)
class GpuGapsRuleResult:
    """Idle stretches longer than ``min_gap_ns``, longest first.

    Columns: pid, device, gap_start_ns, gap_end_ns, dur_ns.
    """

    table: pl.DataFrame
    min_gap_ns: int


def gpu_gaps(trace: Trace, min_gap_ns: int = GPU_GAP_NS, *, busy: pl.DataFrame | None = None) -> GpuGapsRuleResult:
    """Stretches within a (pid, device)'s active span where nothing runs on any stream for
    more than ``min_gap_ns`` (nsys ``gpu_gaps``, which also uses a strict ">"). ``busy``: the
    trace's ``gpu_busy_intervals``, when the caller has them."""
    rows: list[tuple[int, int, int, int]] = []
    busy = busy if busy is not None else gpu_busy_intervals(trace)
    for (pid, device), group in busy.group_by([Col.PID, Col.DEVICE], maintain_order=True):
        starts = np.sort(group.get_column(Col.TS).to_numpy())
        ends = np.sort(group.get_column("end_ns").to_numpy())
        # With starts and ends sorted apart, end[k-1] < start[k] means every operation that
        # started before start[k] had ended: (end[k-1], start[k]) is idle, and every idle
        # stretch shows up this way.
        gap = starts[1:] - ends[:-1]
        for k in np.flatnonzero(gap > min_gap_ns).tolist():
            rows.append((int(pid), int(device), int(ends[k]), int(starts[k + 1])))
    table = pl.DataFrame(
        rows, schema={Col.PID: pl.Int64(), Col.DEVICE: pl.Int32(), "gap_start_ns": pl.Int64(),
                      "gap_end_ns": pl.Int64()}, orient="row",
    ).with_columns((pl.col("gap_end_ns") - pl.col("gap_start_ns")).alias(Col.DUR))
    return GpuGapsRuleResult(table.sort([Col.DUR, "gap_start_ns"], descending=[True, False]), min_gap_ns)


@dataclass(frozen=True)
class LowUtilizationResult:
    """Runs of consecutive low-use chunks, merged, lowest use first.

    Columns: pid, device, ts_ns, dur_ns, in_use_pct (duration-weighted mean over the run's
    chunks; concurrent operations add up, so a chunk can exceed 100), first_chunk, chunks.
    ``chunk_ns`` gives each (pid, device)'s chunk length.
    """

    table: pl.DataFrame
    chunk_ns: pl.DataFrame
    threshold_pct: float
    num_chunks: int


def gpu_low_utilization(
    trace: Trace, threshold_pct: float = LOW_UTIL_PCT, num_chunks: int = UTIL_CHUNKS, *,
    busy: pl.DataFrame | None = None,
) -> LowUtilizationResult:
    """nsys ``gpu_time_util``: each (pid, device)'s span from its first operation's start to
    its last one's end is cut into ``num_chunks`` chunks of ceil(span / num_chunks) ns (the
    last one clipped); chunks whose in-use time is below ``threshold_pct`` are reported.
    ``busy``: as ``gpu_gaps`` takes them."""
    if not 1 <= num_chunks <= 1000:
        raise ValueError("num_chunks must be between 1 and 1000")
    rows: list[tuple[int, int, int, int, float, int, int]] = []
    chunk_rows: list[tuple[int, int, int]] = []
    busy = busy if busy is not None else gpu_busy_intervals(trace)
    for (pid, device), group in busy.group_by([Col.PID, Col.DEVICE], maintain_order=True):
        ts = group.get_column(Col.TS).to_numpy()
        end = group.get_column("end_ns").to_numpy()
        lo, hi = int(ts.min()), int(end.max())
        size = -(-(hi - lo) // num_chunks)
        chunk_rows.append((int(pid), int(device), size))
        if size == 0:
            continue
        c_start = lo + size * np.arange(num_chunks, dtype=np.int64)
        c_end = np.minimum(c_start + size, hi)
        keep = c_start < c_end
        c_start, c_end = c_start[keep], c_end[keep]
        pct = _in_use(ts, end, c_start, c_end) * 100.0
        low = np.flatnonzero(pct < threshold_pct)
        for run in np.split(low, np.flatnonzero(np.diff(low) != 1) + 1) if low.size else []:
            widths = (c_end[run] - c_start[run]).astype(np.float64)
            rows.append((int(pid), int(device), int(c_start[run[0]]),
                         int(c_end[run[-1]] - c_start[run[0]]),
                         float((widths * pct[run]).sum() / widths.sum()), int(run[0]), int(run.size)))
    table = pl.DataFrame(
        rows, orient="row",
        schema={Col.PID: pl.Int64(), Col.DEVICE: pl.Int32(), Col.TS: pl.Int64(), Col.DUR: pl.Int64(),
                "in_use_pct": pl.Float64(), "first_chunk": pl.Int64(), "chunks": pl.Int64()},
    ).sort(["in_use_pct", Col.DUR], descending=[False, False])
    chunks = pl.DataFrame(chunk_rows, orient="row",
                          schema={Col.PID: pl.Int64(), Col.DEVICE: pl.Int32(), "chunk_ns": pl.Int64()})
    return LowUtilizationResult(table, chunks, threshold_pct, num_chunks)


def _in_use(ts: I64, end: I64, c_start: I64, c_end: I64) -> npt.NDArray[np.float64]:
    """Per chunk: the summed overlap of the operations with it, over its length."""
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    out = np.zeros(c_start.size, dtype=np.float64)
    # Operations overlapping chunk i start before its end; the longest operation bounds how far
    # back one can start and still reach into the chunk.
    longest = int((end - ts).max()) if ts.size else 0
    for i in range(c_start.size):
        a = np.searchsorted(ts, c_start[i] - longest, side="left")
        b = np.searchsorted(ts, c_end[i], side="left")
        seg_s, seg_e = ts[a:b], end[a:b]
        overlap = np.minimum(seg_e, c_end[i]) - np.maximum(seg_s, c_start[i])
        out[i] = float(overlap[overlap > 0].sum()) / float(c_end[i] - c_start[i])
    return out
