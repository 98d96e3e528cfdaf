"""The annotated trace for Perfetto and chrome://tracing: the original events, untouched, plus
tracks that show what tracewhy found.

Added tracks (every added event has ``"cat": "tracewhy"``):

- on each GPU's process: "tracewhy: GPU idle gaps" (one slice per idle gap, named by its class,
  with the host activity in its args), "tracewhy: annotations on GPU N" (annotation / NVTX
  ranges projected onto the GPU, in as many lanes as overlaps need) and a "GPU utilization"
  counter (busy share per bin, percent);
- a "tracewhy findings" process with one thread per finding, its slice spanning the steady
  window (or the ranges in ``evidence["time_ranges_ns"]``), the statement in its args;
- with ``profile_memory``, "memory allocated (DEVICE)" and "memory reserved (DEVICE)" counters
  (bytes, the allocator's own totals, a point at each change) on each GPU's process, and the
  host's on a "tracewhy: host memory" process;
- a "tracewhy critical path" process with one "critical path" thread: per analysed step, one
  slice per stretch of its critical path, named by the slice the time was spent in (by its
  category for idle time and stream gaps), with category, edge, step and slice id in its args.

For Kineto input the original events are copied as the exact bytes the file holds (the model
drops fields, so it is never re-serialized). For other input (Nsight Systems) the model is
written as Chrome-trace events with Kineto's categories, so tracewhy and the viewers read it
like a Kineto trace. Times are written as exact decimal microseconds.
"""

from __future__ import annotations

import gzip
from typing import Any, Final

import msgspec
import polars as pl

from tracewhy import __version__
from tracewhy.analyses.critical_path import CriticalPathResult, PathCol
from tracewhy.analyses.gaps import CLASS_COLUMNS, GapCol
from tracewhy.analyses.memory import MemoryResult
from tracewhy.findings.model import Finding
from tracewhy.model.raw_events import RawEvents
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, CopyAttrCol, Kind, LaunchAttrCol, MemEventCol
from tracewhy.model.trace import Trace
from tracewhy.renderers.jsonout import to_jsonable
from tracewhy.reports.overview import Overview

CAT: Final = "tracewhy"
#: Synthetic ids: above any Linux pid/tid (at most 2**22) and any CUDA stream id Kineto writes.
FINDINGS_PID: Final = 1_000_000_000
GAPS_TID: Final = 1_000_000_001
ANNOTATION_TID_BASE: Final = 1_000_000_100
UTILIZATION_COUNTER: Final = "GPU utilization"
#: The process that holds the host's memory counters (a GPU's go on that GPU's process).
HOST_MEMORY_PID: Final = 1_000_000_002
CRITICAL_PATH_PID: Final = 1_000_000_003
CRITICAL_PATH_TID: Final = 1

#: Kineto's category for each kind, for traces written from the model.
_KINETO_CAT: Final = {
    Kind.CPU_OP.value: "cpu_op", Kind.ANNOTATION.value: "user_annotation", Kind.PYTHON.value: "python_function",
    Kind.RUNTIME.value: "cuda_runtime", Kind.DRIVER.value: "cuda_driver", Kind.KERNEL.value: "kernel",
    Kind.MEMCPY.value: "gpu_memcpy", Kind.MEMSET.value: "gpu_memset", Kind.GPU_ANNOTATION.value: "gpu_user_annotation",
    Kind.GPU_SYNC.value: "cuda_sync", Kind.PROFILER_RANGE.value: "cuda_profiler_range",
    Kind.OVERHEAD.value: "overhead", Kind.OTHER.value: "other",
}
_GPU_ROW_KINDS: Final = frozenset(k.value for k in (*GPU_ACTIVITY_KINDS, Kind.GPU_ANNOTATION, Kind.GPU_SYNC))


def us(ns: int) -> msgspec.Raw:
    """Integer nanoseconds as exact decimal microseconds (float64 would round epoch times)."""
    sign = "-" if ns < 0 else ""
    ns = abs(int(ns))
    return msgspec.Raw(f"{sign}{ns // 1000}.{ns % 1000:03d}".encode())


def us_column(ns: pl.Expr) -> pl.Expr:
    """``us`` of every value of an integer column, as text: one polars pass instead of a Python
    call per row (two per slice of a trace written from the model)."""
    whole = ns.abs()
    return (pl.when(ns < 0).then(pl.lit("-")).otherwise(pl.lit("")) + (whole // 1000).cast(pl.String) + pl.lit(".")
            + (whole % 1000).cast(pl.String).str.zfill(3))


def render_perfetto(ov: Overview, source: RawEvents | None, trace: Trace | None = None, *,
                    gz: bool = True) -> bytes:
    """The annotated trace document. ``source``: the original Kineto events; without it
    ``trace`` is written from the model."""
    added = added_events(ov)
    if source is not None:
        header = dict(source.header)
        original = [bytes(e) for e in source.events]
        count = len(original)
    else:
        if trace is None:
            raise ValueError("need the original events or the trace")
        header = {"schemaVersion": msgspec.Raw(b"1"),
                  "traceName": msgspec.Raw(msgspec.json.encode(trace.meta.path))}
        slices, names = _model_events(trace)
        # (the slices' events joined in polars: ",\n" cannot occur inside one, JSON escapes a newline)
        original = [*([slices.str.join(",\n").item().encode()] if slices.len() else []), *names]
        count = slices.len() + len(names)
    header["tracewhyExport"] = msgspec.Raw(msgspec.json.encode({
        "tool_version": __version__, "source_format": ov.info.format, "added_events": len(added),
        "original_events": count, "original_written_from": "file" if source is not None else "model",
    }, order="sorted"))
    parts = [msgspec.json.encode(k) + b":" + bytes(v) for k, v in header.items() if k != "traceEvents"]
    events = b",\n".join([*original, *(msgspec.json.encode(e) for e in added)])
    doc = b"{" + b",\n".join([*parts, b'"traceEvents":[\n' + events + b"\n]"]) + b"}\n"
    return gzip.compress(doc, compresslevel=6, mtime=0) if gz else doc


def added_events(ov: Overview) -> list[Any]:
    """tracewhy's events: dicts, and events already encoded (``msgspec.Raw``)."""
    out: list[Any] = []
    pids = ov.device_pids
    default_pid = next(iter(pids.values()), 0)
    out += _gap_events(ov.report.gaps.gaps, pids, default_pid)
    out += _annotation_events(ov.projection, pids, default_pid)
    out += _utilization_events(ov.utilization.series, pids, default_pid)
    out += memory_counter_events(ov.report.memory, pids)
    out += _finding_events(ov.report.findings, _findings_window(ov))
    out += critical_path_events(ov.critical_path)
    return out


def _meta(pid: int, tid: int | None, what: str, name: str) -> dict[str, Any]:
    e: dict[str, Any] = {"ph": "M", "cat": CAT, "name": what, "pid": pid, "args": {"name": name}}
    if tid is not None:
        e["tid"] = tid
    return e


def _gap_events(g: pl.DataFrame, pids: dict[int, int], default_pid: int) -> list[Any]:
    """Per device, a thread name and each gap's event, written in one polars pass: the host
    activity and next activity where known, the step where there is one, the classes with time."""
    out: list[Any] = []
    if g.height == 0:
        return out
    args = pl.concat_str([
        *(_key(k) + json_text(g, k) for k in (GapCol.HOST_INNERMOST, GapCol.HOST_OP, GapCol.HOST_ANNOTATION,
                                             GapCol.HOST_PYTHON, GapCol.NEXT_ACTIVITY)),
        _key(GapCol.STEP) + pl.col(GapCol.STEP).cast(pl.String),
        *(pl.when(pl.col(c) != 0).then(_key(c) + pl.col(c).cast(pl.String)) for c in CLASS_COLUMNS),
    ], separator=",", ignore_nulls=True)
    name = json_text(g, GapCol.GAP_CLASS).fill_null("null")
    for device in sorted(g.get_column(GapCol.DEVICE).unique().to_list()):
        pid = pids.get(int(device), default_pid)
        out.append(_meta(pid, GAPS_TID, "thread_name", "tracewhy: GPU idle gaps"))
        rows = g.filter(pl.col(GapCol.DEVICE) == device).sort(GapCol.START)
        out += map(msgspec.Raw, rows.select(pl.concat_str([
            pl.lit(f'{{"ph":"X","cat":{_json(CAT)},"name":'), name,
            pl.lit(f',"pid":{pid},"tid":{GAPS_TID},"ts":'), us_column(pl.col(GapCol.START)),
            pl.lit(',"dur":'), us_column(pl.col(GapCol.DUR)), pl.lit(',"args":{'), args, pl.lit("}}"),
        ])).to_series().to_list())
    return out


def _json(value: object) -> str:
    return msgspec.json.encode(value).decode()


def _key(name: str) -> pl.Expr:
    """``"name":``, the start of a JSON member."""
    return pl.lit(_json(name) + ":")


def _annotation_events(p: pl.DataFrame, pids: dict[int, int], default_pid: int) -> list[Any]:
    """The projected ranges in lanes per GPU process, a thread name before each lane's first.
    Lanes are assigned in Python over three integer columns; each range's event is written in
    one polars pass (a dict per range, encoded, took 4.5 us a range)."""
    out: list[Any] = []
    if p.height == 0:
        return out
    p = p.sort(["proj_start_ns", "proj_dur_ns"], descending=[False, True])
    devices = p.get_column(Col.DEVICE).to_list() if Col.DEVICE in p.columns else [None] * p.height
    lanes: dict[tuple[int, int], int] = {}  # (pid, lane) -> end of its last range
    named: dict[int, dict[str, Any]] = {}  # row -> the thread name that goes before it
    seen: set[tuple[int, int]] = set()
    pid_of, tid_of = [], []
    for i, (device, start, dur) in enumerate(zip(
            devices, p.get_column("proj_start_ns").to_list(), p.get_column("proj_dur_ns").to_list(), strict=True)):
        pid = pids.get(int(device), default_pid) if device is not None else default_pid
        lane = 0
        while lanes.get((pid, lane), -(1 << 62)) > start:  # lanes hold disjoint ranges only
            lane += 1
        lanes[(pid, lane)] = start + dur
        tid = ANNOTATION_TID_BASE + lane
        if (pid, tid) not in seen:
            label = f"tracewhy: annotations on GPU {device if device is not None else ''}".rstrip()
            named[i] = _meta(pid, tid, "thread_name", f"{label} ({lane + 1})" if lane else label)
            seen.add((pid, tid))
        pid_of.append(pid)
        tid_of.append(tid)

    def number(c: str) -> pl.Expr:
        return pl.col(c).cast(pl.String).fill_null("null")

    events = p.select(pl.concat_str([
        pl.lit(f'{{"ph":"X","cat":{_json(CAT)},"name":'), json_text(p, Col.NAME).fill_null("null"),
        pl.lit(',"pid":'), pl.Series(pid_of, dtype=pl.Int64).cast(pl.String),
        pl.lit(',"tid":'), pl.Series(tid_of, dtype=pl.Int64).cast(pl.String),
        pl.lit(',"ts":'), us_column(pl.col("proj_start_ns")), pl.lit(',"dur":'), us_column(pl.col("proj_dur_ns")),
        pl.lit(',"args":{"cpu_ts_us":'), us_column(pl.col(Col.TS)), pl.lit(',"cpu_dur_ns":'), number(Col.DUR),
        pl.lit(',"gpu_ops":'), number("num_gpu_ops"), pl.lit(',"gpu_time_ns":'), number("gpu_time_ns"),
        pl.lit(',"gpu_busy_ns":'), number("gpu_busy_ns"), pl.lit("}}"),
    ])).to_series().to_list()
    for i, e in enumerate(events):
        if i in named:
            out.append(named[i])
        out.append(msgspec.Raw(e))
    return out


def json_text(frame: pl.DataFrame, column: str) -> pl.Expr:
    """``column`` (text) of ``frame`` as JSON strings (null where null): each distinct value
    encoded once by msgspec, so escapes are exactly those of a dict of it encoded."""
    names = frame.get_column(column).unique().drop_nulls().cast(pl.String).to_list()
    return pl.col(column).cast(pl.String).replace_strict(names, [_json(n) for n in names], default=None)


def _utilization_events(series: pl.DataFrame, pids: dict[int, int], default_pid: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for device in sorted(series.get_column(Col.DEVICE).unique().to_list()) if series.height else []:
        pid = pids.get(int(device), default_pid)
        rows = series.filter(pl.col(Col.DEVICE) == device).sort("start_ns")
        for start, share in rows.select("start_ns", "busy_share").iter_rows():
            out.append({"ph": "C", "cat": CAT, "name": UTILIZATION_COUNTER, "pid": pid, "ts": us(start),
                        "args": {"busy %": round(100 * share, 2)}})
        out.append({"ph": "C", "cat": CAT, "name": UTILIZATION_COUNTER, "pid": pid,
                    "ts": us(int(rows.get_column("end_ns").max())), "args": {"busy %": 0}})  # type: ignore[arg-type]
    return out


def memory_counter_name(what: str, device: str) -> str:
    """"memory allocated (cuda:0)", "memory reserved (cpu)"."""
    return f"memory {what} ({device})"


def memory_counter_events(r: MemoryResult | None, pids: dict[int, int]) -> list[dict[str, Any]]:
    """Allocated and reserved bytes per device as counters, one point where the value changes."""
    out: list[dict[str, Any]] = []
    for d in r.devices if r is not None else ():
        kind, _, index = d.device.partition(":")
        pid = pids.get(int(index), int(index)) if kind != "cpu" and index.isdigit() else HOST_MEMORY_PID
        if pid == HOST_MEMORY_PID and not any(e["pid"] == pid for e in out):
            out.append(_meta(pid, None, "process_name", "tracewhy: host memory"))
        for what, col in (("allocated", MemEventCol.TOTAL_ALLOCATED), ("reserved", MemEventCol.TOTAL_RESERVED)):
            values = d.timeline.select(MemEventCol.TS, pl.col(col).fill_null(strategy="forward")).drop_nulls()
            changes = values.filter(pl.col(col) != pl.col(col).shift(1).fill_null(-1))
            name = memory_counter_name(what, d.device)
            out += [{"ph": "C", "cat": CAT, "name": name, "pid": pid, "ts": us(ts), "args": {"bytes": int(v)}}
                    for ts, v in changes.iter_rows()]
    return out


def critical_path_events(r: CriticalPathResult | None) -> list[dict[str, Any]]:
    """The critical path as one track: a slice per segment, in time order; the segments of a
    step are contiguous, so the slices of a step sum to its path's total."""
    if r is None or r.segments.height == 0:
        return []
    out = [_meta(CRITICAL_PATH_PID, None, "process_name", "tracewhy critical path"),
           _meta(CRITICAL_PATH_PID, CRITICAL_PATH_TID, "thread_name", "critical path")]
    for step, ts, dur, category, edge, sid, name in r.segments.select(
            PathCol.STEP, Col.TS, Col.DUR, PathCol.CATEGORY, PathCol.EDGE, Col.ID, Col.NAME).iter_rows():
        out.append({"ph": "X", "cat": CAT, "name": name if name is not None else category, "pid": CRITICAL_PATH_PID,
                    "tid": CRITICAL_PATH_TID, "ts": us(ts), "dur": us(dur),
                    "args": {"category": category, "edge": edge, "step": step, "id": sid}})
    return out


def _findings_window(ov: Overview) -> tuple[int, int]:
    window = ov.steady_window_ns
    if window is not None:
        return window
    first, last = ov.info.first_ts_ns, ov.info.last_end_ns
    return (first or 0, last or first or 0)


def _finding_events(findings: list[Finding], window: tuple[int, int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not findings:
        return out
    out.append(_meta(FINDINGS_PID, None, "process_name", "tracewhy findings"))
    for i, f in enumerate(findings):
        tid = i + 1
        out.append(_meta(FINDINGS_PID, tid, "thread_name", f"{i + 1}. {f.code}"))
        ranges = f.evidence.get("time_ranges_ns") or [window]
        args = {"statement": f.statement, "next_step": f.next_step, "severity": f.severity.value,
                "recoverable_ns_per_step": f.recoverable_ns_per_step, "evidence": to_jsonable(f.evidence)}
        for start, end in ranges:
            out.append({"ph": "X", "cat": CAT, "name": f"[{f.severity.value}] {f.code}: {f.statement}",
                        "pid": FINDINGS_PID, "tid": tid, "ts": us(int(start)), "dur": us(max(int(end) - int(start), 0)),
                        "args": args})
    return out


def model_events(trace: Trace) -> list[bytes]:
    """The trace's slices and thread names as Kineto-style Chrome-trace events, each one's JSON
    as msgspec writes a dict (keys in this order, no spaces)."""
    slices, names = _model_events(trace)
    return [e.encode() for e in slices.to_list()] + names


def _model_events(trace: Trace) -> tuple[pl.Series, list[bytes]]:
    """``model_events``: the slices' events as a column of text, then the process and thread
    names. A slice's event is put together in one polars pass over the slice table with its
    launch and copy attributes joined, its name encoded once per distinct name: a trace written
    from the model has an event per slice (a dict per slice, then encoded, took 2.6 µs a slice)."""
    trace.require_whole()
    s = trace.slices
    launch = trace.kernel_attrs.select(LaunchAttrCol.ID, LaunchAttrCol.GRID_X, LaunchAttrCol.GRID_Y,
                                       LaunchAttrCol.GRID_Z, LaunchAttrCol.BLOCK_X, LaunchAttrCol.BLOCK_Y,
                                       LaunchAttrCol.BLOCK_Z, LaunchAttrCol.REGISTERS, LaunchAttrCol.SHARED_MEM,
                                       pl.lit(True).alias("_launch"))
    copy = trace.copy_attrs.select(CopyAttrCol.ID, CopyAttrCol.BYTES)
    kind = pl.col(Col.KIND).cast(pl.String)
    gpu_row = kind.is_in(list(_GPU_ROW_KINDS)) & pl.col(Col.DEVICE).is_not_null()
    stream = pl.col(Col.STREAM)

    def text(e: pl.Expr) -> pl.Expr:
        return e.cast(pl.String)

    def listed(*cols: str) -> pl.Expr:
        return pl.lit("[") + pl.concat_str([text(pl.col(c)).fill_null("null") for c in cols], separator=",") + "]"

    args = pl.concat_str([
        pl.when(gpu_row).then(pl.lit('"device":') + text(pl.col(Col.DEVICE))),
        pl.when(gpu_row & stream.is_not_null()).then(pl.lit('"stream":') + text(stream)),
        pl.lit('"correlation":') + text(pl.col(Col.CORRELATION)),
        pl.lit('"External id":') + text(pl.col(Col.EXTERNAL_ID)),
        pl.when(pl.col("_launch")).then(pl.lit('"grid":') + listed(LaunchAttrCol.GRID_X, LaunchAttrCol.GRID_Y,
                                                                    LaunchAttrCol.GRID_Z)),
        pl.when(pl.col("_launch")).then(pl.lit('"block":') + listed(LaunchAttrCol.BLOCK_X, LaunchAttrCol.BLOCK_Y,
                                                                     LaunchAttrCol.BLOCK_Z)),
        pl.lit('"registers per thread":') + text(pl.col(LaunchAttrCol.REGISTERS)),
        pl.lit('"shared memory":') + text(pl.col(LaunchAttrCol.SHARED_MEM)),
        pl.lit('"bytes":') + text(pl.col(CopyAttrCol.BYTES)),
    ], separator=",", ignore_nulls=True)
    pid = pl.when(gpu_row).then(pl.col(Col.DEVICE).cast(pl.Int64)).otherwise(pl.col(Col.PID)).fill_null(0)
    tid = pl.when(gpu_row).then(stream).otherwise(pl.col(Col.TID)).fill_null(0)
    events = s.join(launch, on=Col.ID, how="left", maintain_order="left").join(
        copy, on=Col.ID, how="left", maintain_order="left").select(
        pl.concat_str([
            pl.lit('{"ph":"X","cat":"'), kind.replace_strict(_KINETO_CAT, default="other"), pl.lit('","name":'),
            json_text(s, Col.NAME).fill_null("null"),
            pl.lit(',"pid":'), text(pid), pl.lit(',"tid":'), text(tid),
            pl.lit(',"ts":'), us_column(pl.col(Col.TS)), pl.lit(',"dur":'), us_column(pl.col(Col.DUR)),
            pl.lit(',"args":{'), args, pl.lit("}}"),
        ]).alias("event"),
        pl.when(gpu_row).then(pl.col(Col.DEVICE).cast(pl.Int64)).alias("gpu_pid"),
    )
    gpu_pids = set(events.get_column("gpu_pid").drop_nulls().unique().to_list())
    meta: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"GPU {pid}"}}
                                  for pid in sorted(gpu_pids)]
    for p, t, name in trace.threads.select(Col.PID, Col.TID, "name").iter_rows():
        if p is None or p in gpu_pids:
            continue
        if t is None:
            meta.append({"ph": "M", "name": "process_name", "pid": p, "args": {"name": name}})
        else:
            meta.append({"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": name}})
    return events.get_column("event"), [msgspec.json.encode(e) for e in meta]
