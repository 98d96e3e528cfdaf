"""One compact summary per rank, small enough to travel back from where the rank's trace was
read (a worker process or a Dask worker; ``reports/ranks`` reads them): step time, compute,
exposed communication, idle and input per step, the rank's collective calls, and what its step
thread spent the step on (its blocks, its largest unrecorded gaps, and a compact timeline of the
innermost annotation, op and Python frame open on it, from which ``rank_compare`` says what a
straggler was doing while the others waited for it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.api_names import is_dataloader
from tracewhy.analyses.collectives import collectives
from tracewhy.analyses.intervals import covered_ns
from tracewhy.analyses.overlap import OverlapCol, OverlapOptions, overlap
from tracewhy.analyses.stats import nearest_ns
from tracewhy.analyses.steps import StepsOptions, WindowCol, steady_span, step_windows, steps
from tracewhy.errors import TraceError
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, HOST_KINDS, Col, DeviceCol, Kind
from tracewhy.model.trace import Trace

#: Rank in a file name: "rank3", "rank_3", "rank-3" ("sampled_rank-0.json.gz", "trace_rank12.json").
_RANK_IN_NAME: Final = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
#: Blocks and gaps kept per rank: enough to say what a straggler did instead, small to ship.
TOP_BLOCKS: Final = 8
TOP_GAPS: Final = 3
#: Activity timeline: the kinds kept (what each is called in statements), and the shortest
#: segment kept: shorter ones cannot carry a share of a wait worth naming, and dropping them
#: keeps the timeline a few thousand rows per rank even with Python frames on.
ACTIVITY_KINDS: Final = {Kind.ANNOTATION.value: "annotation", Kind.CPU_OP.value: "op", Kind.PYTHON.value: "python"}
ACTIVITY_MIN_NS: Final = 2_000
#: RankSummary's per-step GPU times and the overlap column each comes from.
_GPU_PARTS: Final = (("compute", OverlapCol.COMPUTE), ("comm", OverlapCol.COMM),
                     ("exposed", OverlapCol.COMM_EXPOSED), ("idle", OverlapCol.IDLE))


@dataclass(frozen=True)
class RanksOptions:
    step_marker: str | None = None
    warmup: int | None = None


@dataclass(frozen=True)
class RankSummary:
    """What ``ranks`` needs from one rank's trace. Per-step values are means over the rank's
    steady steps (per capture when it has no steps); GPU values are None for CPU-only ranks.

    ``collectives``: step (number, null outside steps), steady, process_group, op, label,
    size, timing, dur_ns, arrive_ns (when the call began on this rank: its host range, or its
    first kernel; this rank's own clock, so only ever compared with this rank's times),
    msg_bytes, group_size, link, link_bytes_per_s (``collective_bandwidth.with_bandwidth``), in
    host order. ``activity``: step, kind ("annotation", "op", "python"), name, start_ns, end_ns: per
    steady step, the innermost slice of each kind open on the step's thread, as segments on this
    rank's clock (ProfilerStep excluded; segments under ``ACTIVITY_MIN_NS`` dropped); empty when
    the rank has no host-timed collective, the only kind it is read against.
    ``blocks``: name, ns_per_step (direct children of the step on its thread). ``gaps``: after,
    before, ns_per_step (holes between those children: host time the profiler saw no op or
    annotation for).
    """

    rank: int
    source: str
    rank_from: str
    world_size: int | None
    backend: str | None
    steps: int
    steady_step_numbers: tuple[int, ...]
    #: Steady step durations' median and p90 (rounded to the nearest nanosecond, as is the mean).
    step_p50_ns: int | None
    step_p90_ns: int | None
    #: Mean steady step: what per-step means (waits, lateness) are a share of.
    step_mean_ns: int | None
    compute_ns_per_step: float | None
    comm_ns_per_step: float | None
    comm_exposed_ns_per_step: float | None
    idle_ns_per_step: float | None
    input_ns_per_step: float
    collectives: pl.DataFrame
    blocks: pl.DataFrame
    gaps: pl.DataFrame
    note: str | None
    activity: pl.DataFrame
    #: The reader's warnings on this rank's file, for the command to show.
    warnings: tuple[str, ...] = ()
    #: Why this rank's file lacks events (TraceMeta.missing_events): a cut rank's collectives
    #: stop early, which is not a rank issuing different collectives.
    missing_events: tuple[str, ...] = ()
    #: The models of the GPUs this rank's work ran on (deviceProperties names), sorted: ranks of
    #: one job run on one kind of GPU, so different models say the files are of different jobs.
    device_names: tuple[str, ...] = ()


def rank_from_name(path: str) -> int | None:
    found = _RANK_IN_NAME.findall(Path(path).name)
    return int(found[-1]) if found else None


def summarize_trace(trace: Trace, source: str, options: RanksOptions = RanksOptions()) -> list[RankSummary]:
    trace.require_whole()
    pids = _gpu_pids(trace)
    rank = trace.meta.rank
    if rank is not None or len(pids) <= 1:
        rank_from = "distributedInfo"
        if rank is None:
            rank, rank_from = rank_from_name(source), "file name"
        if rank is None:
            raise TraceError(source, "cannot tell which rank this is: no distributedInfo rank in the trace and no "
                                     "'rankN' in the file name (rename it, e.g. job_rank3.json.gz)")
        return [_summarize(trace, source, options, rank, rank_from, None)]
    # One nsys capture of several processes (torchrun under nsys): a rank per process, numbered
    # by the GPU it drives, which is its local rank under the usual one-GPU-per-process launch.
    return [_summarize(trace, source, options, i, "nsys process (by GPU)", pid) for i, pid in enumerate(pids)]


def _gpu_pids(trace: Trace) -> list[int]:
    """Processes that launched GPU work, ordered by the lowest device each drives."""
    s = trace.slices
    g = trace.of_kind(*GPU_ACTIVITY_KINDS).filter(pl.col(Col.LAUNCH).is_not_null()).select(Col.LAUNCH, Col.DEVICE)
    if g.height == 0:
        return []
    g = g.with_columns(s.get_column(Col.PID).gather(g.get_column(Col.LAUNCH)).alias("_pid"))
    first = g.group_by("_pid").agg(pl.col(Col.DEVICE).min()).sort(Col.DEVICE, "_pid")
    return [int(p) for p in first.get_column("_pid").to_list() if p is not None]


def _summarize(trace: Trace, source: str, options: RanksOptions, rank: int, rank_from: str,
               pid: int | None) -> RankSummary:
    steps_result = steps(trace, StepsOptions(marker=options.step_marker, warmup=options.warmup))
    windows = step_windows(trace, steps_result)
    if pid is not None:
        windows = windows.filter(pl.col(WindowCol.PID) == pid)
    steady = windows.filter(pl.col(WindowCol.STEADY))
    n = max(steady.height, 1)
    durs = steady.get_column(WindowCol.DUR).to_numpy()
    p50, p90 = (nearest_ns(float(v)) for v in np.percentile(durs, [50, 90])) if durs.size else (None, None)
    coll = collectives(trace)
    ov = overlap(trace, OverlapOptions(options.step_marker, options.warmup), steps_result=steps_result,
                 collectives_result=coll)
    devices = _devices_of(trace, pid)
    dev_steady = ov.steady.filter(pl.col(OverlapCol.DEVICE).is_in(devices)) if devices is not None else ov.steady
    dev_all = ov.devices.filter(pl.col(OverlapCol.DEVICE).is_in(devices)) if devices is not None else ov.devices
    # Steady rows are already means per step; without steps the totals are per capture (n = 1).
    gpu: dict[str, float | None] = {"compute": None, "comm": None, "exposed": None, "idle": None}
    if dev_steady.height:
        gpu = {k: float(dev_steady.get_column(c).sum()) for k, c in _GPU_PARTS}
    elif dev_all.height:  # GPU work but no steps: per capture
        gpu = {k: float(dev_all.get_column(c).sum()) for k, c in _GPU_PARTS}
    table = coll.table if pid is None else coll.table.filter(pl.col(Col.PID) == pid)
    calls = _with_steps(table, windows).select(
        "step", WindowCol.STEADY, pl.col("process_group").fill_null(""), pl.col("op").fill_null(pl.col("label")),
        "label", "size", "timing", Col.DUR, pl.col("start_ns").alias("arrive_ns"), "msg_bytes", "group_size", "link",
        "link_bytes_per_s",
    )
    blocks, gaps = _step_children(trace, steady)
    backend = trace.meta.distributed.get("backend")
    return RankSummary(
        rank=rank, source=source, rank_from=rank_from,
        world_size=trace.meta.world_size, backend=backend if isinstance(backend, str) else None, steps=steady.height,
        steady_step_numbers=tuple(int(x) for x in steady.get_column(WindowCol.NUMBER).drop_nulls().to_list()),
        step_p50_ns=p50, step_p90_ns=p90, step_mean_ns=nearest_ns(float(durs.mean())) if durs.size else None,
        compute_ns_per_step=gpu["compute"], comm_ns_per_step=gpu["comm"],
        comm_exposed_ns_per_step=gpu["exposed"], idle_ns_per_step=gpu["idle"],
        input_ns_per_step=_input_ns(trace, steady, pid) / n,
        collectives=calls, blocks=blocks, gaps=gaps, note=steps_result.note,
        # Only host-timed calls (gloo, MPI) are read against the timeline: build it only for them.
        activity=_activity(trace, steady if (calls.get_column("timing") == "host").any() else steady.head(0)),
        warnings=trace.meta.warnings, missing_events=trace.meta.missing_events,
        device_names=_device_names(trace, devices),
    )


def _device_names(trace: Trace, devices: list[int] | None) -> tuple[str, ...]:
    """The models of the devices GPU work ran on (of ``devices`` when given), as the trace names them."""
    used = trace.of_kind(*GPU_ACTIVITY_KINDS).get_column(Col.DEVICE).drop_nulls().unique().to_list()
    wanted = set(used) if devices is None else set(used) & set(devices)
    props = trace.devices
    if props.height == 0 or not wanted:
        return ()
    names = props.filter(pl.col(DeviceCol.DEVICE).is_in(sorted(wanted))).get_column(DeviceCol.NAME)
    return tuple(sorted({str(n) for n in names.drop_nulls().to_list() if n}))


def _devices_of(trace: Trace, pid: int | None) -> list[int] | None:
    if pid is None:
        return None
    s = trace.slices
    g = trace.of_kind(*GPU_ACTIVITY_KINDS).filter(pl.col(Col.LAUNCH).is_not_null()).select(Col.LAUNCH, Col.DEVICE)
    g = g.filter(s.get_column(Col.PID).gather(g.get_column(Col.LAUNCH)) == pid)
    return [int(d) for d in g.get_column(Col.DEVICE).unique().to_list()]


def _with_steps(table: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Each call with the step (number, steady) whose window holds its host start."""
    if windows.height == 0:
        return table.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"), pl.lit(True).alias(WindowCol.STEADY))
    w = windows.select(WindowCol.WINDOW_START, WindowCol.WINDOW_END, WindowCol.NUMBER, WindowCol.STEADY).sort(
        WindowCol.WINDOW_START)
    inside = pl.col("host_ts_ns") < pl.col(WindowCol.WINDOW_END)
    return table.sort("host_ts_ns").join_asof(
        w, left_on="host_ts_ns", right_on=WindowCol.WINDOW_START, strategy="backward"
    ).with_columns(
        pl.when(inside).then(pl.col(WindowCol.NUMBER)).alias("step"),
        (pl.col(WindowCol.STEADY).fill_null(False) & inside).fill_null(False).alias(WindowCol.STEADY),
    ).sort("call")


def _input_ns(trace: Trace, steady: pl.DataFrame, pid: int | None) -> int:
    """Union of DataLoader fetch spans inside the steady windows (whole capture without steps)."""
    h = trace.kind_columns(HOST_KINDS, pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR, Col.PID)
    names = [n for n in h.get_column(Col.NAME).unique().to_list() if is_dataloader(n)]
    h = h.filter(pl.col(Col.NAME).is_in(names))
    if pid is not None:
        h = h.filter(pl.col(Col.PID) == pid)
    s = h.get_column(Col.TS).to_numpy()
    e = s + h.get_column(Col.DUR).to_numpy()
    span = steady_span(steady)
    if span is not None:
        lo, hi = span
        s, e = np.clip(s, lo, hi), np.clip(e, lo, hi)
    return covered_ns(s, e)


def _step_children(trace: Trace, steady: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per steady step: time in each direct child of the step on its thread (blocks), and the
    holes between children (gaps, keyed by the children around them), both per step."""
    blocks_schema = {Col.NAME: pl.String, "ns_per_step": pl.Float64}
    gaps_schema = {"after": pl.String, "before": pl.String, "ns_per_step": pl.Float64}
    if steady.height == 0:
        return pl.DataFrame(schema=blocks_schema), pl.DataFrame(schema=gaps_schema)
    n = steady.height
    step_ids = steady.get_column(WindowCol.STEP_ID).to_list()
    s = trace.slices
    kids = s.filter(pl.col(Col.PARENT).is_in(step_ids) & pl.col(Col.KIND).is_in([k.value for k in HOST_KINDS])).select(
        pl.col(Col.PARENT), pl.col(Col.NAME).cast(pl.String), Col.TS, (pl.col(Col.TS) + pl.col(Col.DUR)).alias("_end")
    ).sort(Col.PARENT, Col.TS)
    blocks = (
        kids.group_by(Col.NAME).agg(((pl.col("_end") - pl.col(Col.TS)).sum() / n).alias("ns_per_step"))
        .sort(["ns_per_step", Col.NAME], descending=[True, False]).head(TOP_BLOCKS)
    )
    gap_rows: dict[tuple[str, str], int] = {}
    by_step = {k[0]: v for k, v in kids.group_by(Col.PARENT)}
    for sid, ts, dur in steady.select(WindowCol.STEP_ID, WindowCol.WINDOW_START, WindowCol.DUR).iter_rows():
        k = by_step.get(sid)
        children = k.select(Col.NAME, Col.TS, "_end").iter_rows() if k is not None else iter(())
        prev, covered_to = "step start", ts
        for name, start, end in children:
            if start > covered_to:
                gap_rows[(prev, name)] = gap_rows.get((prev, name), 0) + start - covered_to
            if end > covered_to:
                prev, covered_to = name, end
        if ts + dur > covered_to:
            gap_rows[(prev, "step end")] = gap_rows.get((prev, "step end"), 0) + ts + dur - covered_to
    gaps = pl.DataFrame(
        [{"after": a, "before": b, "ns_per_step": v / n} for (a, b), v in gap_rows.items()], schema=gaps_schema
    ).sort(["ns_per_step", "after", "before"], descending=[True, False, False]).head(TOP_GAPS)
    return blocks, gaps


def _activity(trace: Trace, steady: pl.DataFrame) -> pl.DataFrame:
    """Per steady step and kind, the innermost slice of that kind open at each instant on the
    step's thread, as non-overlapping segments (adjacent ones of one name merged)."""
    schema = {"step": pl.Int64, "kind": pl.String, Col.NAME: pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64}
    if steady.height == 0 or steady.get_column(WindowCol.NUMBER).null_count() == steady.height:
        return pl.DataFrame(schema=schema)
    s = trace.slices
    marks = s.filter(pl.col(Col.ID).is_in(steady.get_column(WindowCol.STEP_ID).drop_nulls().to_list())).select(
        Col.ID, Col.PID, Col.TID)
    where = {i: (p, t) for i, p, t in marks.iter_rows()}
    rows: list[tuple[int, str, str, int, int]] = []
    host = s.filter(pl.col(Col.KIND).is_in(list(ACTIVITY_KINDS))).select(
        Col.ID, Col.KIND, Col.NAME, Col.TS, Col.DUR, Col.PID, Col.TID)
    for number, sid, lo, hi in steady.select(WindowCol.NUMBER, WindowCol.STEP_ID, WindowCol.WINDOW_START,
                                              WindowCol.WINDOW_END).iter_rows():
        if number is None or sid not in where:
            continue
        pid, tid = where[sid]
        mine = host.filter((pl.col(Col.PID) == pid) & (pl.col(Col.TID) == tid) & (pl.col(Col.ID) != sid)
                           & (pl.col(Col.TS) < hi) & (pl.col(Col.TS) + pl.col(Col.DUR) > lo))
        for kind, label in ACTIVITY_KINDS.items():
            k = mine.filter(pl.col(Col.KIND) == kind).sort([Col.TS, Col.DUR], descending=[False, True])
            names = k.get_column(Col.NAME).cast(pl.String).to_list()
            starts = np.clip(k.get_column(Col.TS).to_numpy(), lo, hi)
            ends = np.clip(k.get_column(Col.TS).to_numpy() + k.get_column(Col.DUR).to_numpy(), lo, hi)
            rows += [(number, label, n, a, b) for n, a, b in _innermost(names, starts, ends)]
    return pl.DataFrame(rows, schema=schema, orient="row")


def _innermost(names: list[str], starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
               ) -> list[tuple[str, int, int]]:
    """Slices of one thread (nested, sorted by start then longest first) as the segments in which
    each is the innermost one open, adjacent segments of one name merged, short ones dropped."""
    out: list[tuple[str, int, int]] = []
    stack: list[tuple[str, int]] = []  # (name, end), outermost first
    at = 0  # time up to which segments are written

    def emit(name: str, a: int, b: int) -> None:
        if b > a:
            if out and out[-1][0] == name and out[-1][2] == a:
                out[-1] = (name, out[-1][1], b)
            else:
                out.append((name, a, b))

    for name, a, b in zip(names, starts.tolist(), ends.tolist(), strict=True):
        while stack and stack[-1][1] <= a:
            top, end = stack.pop()
            emit(top, at, end)
            at = max(at, end)
        if stack:
            emit(stack[-1][0], at, a)
        at = a
        stack.append((name, min(b, stack[-1][1]) if stack else b))
    while stack:
        top, end = stack.pop()
        emit(top, at, end)
        at = max(at, end)
    return [x for x in out if x[2] - x[1] >= ACTIVITY_MIN_NS]
