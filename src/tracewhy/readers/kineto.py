"""Reader for PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzipped, PyTorch 1.8 to 2.13.

The file is decoded in two passes: msgspec first splits ``traceEvents`` into raw byte spans
(cheap views), then decodes them in batches into typed structs that are turned into columns
at once. Peak memory is the file's bytes plus one batch, not the whole event list as objects.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.errors import TraceError
from tracewhy.model.linking import link_slices
from tracewhy.model.schema import (
    COPY_ATTRS_SCHEMA,
    COPY_KINDS,
    DEVICES_SCHEMA,
    FLOWS_SCHEMA,
    KERNEL_ATTRS_SCHEMA,
    KIND_DTYPE,
    MEMORY_KINDS,
    MEMORY_SCHEMA,
    OP_ATTRS_SCHEMA,
    SLICES_SCHEMA,
    THREADS_SCHEMA,
    Col,
    DCol,
    Kind,
    OCol,
)
from tracewhy.model.trace import Capture, Trace, TraceMeta, Truncation
from tracewhy.readers.kineto_events import (
    EVENT_DECODER,
    EVENTS_DECODER,
    RAW_DICT_DECODER,
    RAW_LIST_DECODER,
    Event,
    EventArgs,
)
from tracewhy.readers.source import DEFAULT_MAX_INFLATED_BYTES, read_bytes

Progress = Callable[[int, int], None]

# Category spellings, lower-cased. PyTorch 1.8-1.9 wrote capitalized names (Operator,
# Runtime, Kernel, Memcpy, Memset); 1.10+ writes cpu_op, cuda_runtime, kernel, gpu_memcpy...
# ROCm builds use the same CUDA-named categories with hip* API names.
_CATEGORY_KIND: dict[str, Kind] = {
    "cpu_op": Kind.CPU_OP,
    "operator": Kind.CPU_OP,
    "user_annotation": Kind.ANNOTATION,
    "python_function": Kind.PYTHON,
    "cuda_runtime": Kind.RUNTIME,
    "runtime": Kind.RUNTIME,
    "cuda_driver": Kind.DRIVER,
    "kernel": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY,
    "memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "memset": Kind.MEMSET,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
    "cuda_sync": Kind.GPU_SYNC,
    "cuda_profiler_range": Kind.PROFILER_RANGE,
    "overhead": Kind.OVERHEAD,
}
# Launch arrows: "ac2g" since PyTorch 1.11; "async" (1.8-1.9), "async_gpu" (2022 builds) and
# "async_cpu_to_gpu" (Meta-internal 2022) before that.
_FLOW_KIND = {"ac2g": "correlation", "async": "correlation", "async_gpu": "correlation",
              "async_cpu_to_gpu": "correlation", "fwdbwd": "fwdbwd"}
_GPU_KINDS = frozenset({Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_ANNOTATION,
                        Kind.GPU_SYNC, Kind.PROFILER_RANGE})
_OP_ATTR_KINDS = frozenset({Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON})
_TRACE_SPAN = "trace_span"  # cat "Trace": the profiler's own capture window
_COPY_NAME = re.compile(r"Memcpy\s+(\w+)\s*(?:\((\w+)\s*->\s*(\w+)\))?")
_VERSION_KEYS = ("cuda_runtime_version", "cuda_driver_version", "cupti_version",
                 "hip_runtime_version", "hip_driver_version", "roctracer_version")
_CAPTURE_KEYS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
DEFAULT_BATCH = 100_000


def read_kineto(
    path: str | Path,
    *,
    progress: Progress | None = None,
    batch_size: int = DEFAULT_BATCH,
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
) -> Trace:
    """Read a Kineto JSON trace (``.json`` or ``.json.gz``) into a Trace."""
    path = Path(path)
    buf = read_bytes(path, max_inflated_bytes)
    if not buf.strip():
        raise TraceError(path, "file is empty")
    header, raws, truncation = _split_document(path, buf)
    del buf
    builder = _Builder(path)
    total = len(raws)
    for start in range(0, total, batch_size):
        builder.add(_decode_batch(raws[start : start + batch_size], builder.problems))
        if progress is not None:
            progress(min(start + batch_size, total), total)
    del raws
    if total and not builder.rows_seen:
        first = next(iter(builder.problems), "no event could be decoded")
        raise TraceError(path, f"no usable events ({first})")
    return builder.finish(header, truncation)


# --- document level -------------------------------------------------------------------------


def _split_document(
    path: Path, buf: bytes | bytearray
) -> tuple[dict[str, msgspec.Raw], list[msgspec.Raw], Truncation | None]:
    """Return (top-level fields but traceEvents, raw events, truncation info)."""
    first = _first_byte(buf)
    if first not in (b"{", b"["):
        raise TraceError(path, "not JSON: expected a Kineto trace object or event array")
    try:
        if first == b"[":
            raws = RAW_LIST_DECODER.decode(buf)
            if raws and _first_byte(bytes(raws[0])[:64]) == b"[":
                raise TraceError(
                    path, "a list of rows, not events: this looks like a memory-timeline export, "
                    "not a profiler trace"
                )
            return {}, raws, None
        top = RAW_DICT_DECODER.decode(buf)
    except msgspec.DecodeError as e:
        if "truncated" not in str(e):
            raise TraceError(path, f"not valid JSON ({e})") from None
        return _recover_truncated(path, buf, first == b"[")
    return _events_of(path, top), _raw_events(path, top), None


def _first_byte(buf: bytes | bytearray) -> bytes:
    for i in range(min(len(buf), 4096)):
        c = buf[i : i + 1]
        if c not in (b" ", b"\t", b"\r", b"\n", b"\xef", b"\xbb", b"\xbf"):
            return bytes(c)
    return b""


def _events_of(path: Path, top: dict[str, msgspec.Raw]) -> dict[str, msgspec.Raw]:
    if "traceEvents" not in top:
        if "nodes" in top and "schema" in top:
            raise TraceError(path, "this is a PyTorch execution trace (Chakra ET), not a profiler trace")
        keys = ", ".join(sorted(top)[:5]) or "none"
        raise TraceError(path, f"JSON object has no traceEvents list (keys: {keys}); not a Kineto trace")
    return {k: v for k, v in top.items() if k != "traceEvents"}


def _raw_events(path: Path, top: dict[str, msgspec.Raw]) -> list[msgspec.Raw]:
    try:
        return RAW_LIST_DECODER.decode(top["traceEvents"])
    except msgspec.DecodeError:
        raise TraceError(path, "traceEvents is not a list") from None


def _recover_truncated(
    path: Path, buf: bytes | bytearray, bare_array: bool
) -> tuple[dict[str, msgspec.Raw], list[msgspec.Raw], Truncation]:
    """Keep every complete event before the cut of a file that ends mid-way."""
    header: dict[str, msgspec.Raw] = {}
    if bare_array:
        start = bytes(buf[:4096]).index(b"[") + 1
    else:
        m = re.search(rb'"traceEvents"\s*:\s*\[', buf)
        if m is None:
            raise TraceError(path, "JSON ends early, before any traceEvents")
        start = m.end()
        # Kineto writes schemaVersion, deviceProperties and distributedInfo before the events,
        # so they survive a cut; traceName/displayTimeUnit/baseTimeNanoseconds come after.
        try:
            header = RAW_DICT_DECODER.decode(bytes(buf[: m.start()]) + b'"traceEvents": []}')
        except msgspec.DecodeError:
            header = {}
    pos = len(buf)
    for _ in range(32):
        cut = _last_event_boundary(buf, start, pos)
        if cut is None:
            break
        try:
            raws = RAW_LIST_DECODER.decode(b"[" + bytes(buf[start:cut]) + b"]")
        except msgspec.DecodeError:
            pos = cut - 1
            continue
        lost_bytes = len(buf) - cut
        per_event = max(1, (cut - start) // max(1, len(raws)))
        return header, raws, Truncation(
            bytes_total=len(buf),
            bytes_recovered=cut,
            events_recovered=len(raws),
            events_lost_estimate=lost_bytes // per_event + 1,
        )
    raise TraceError(path, "JSON ends early and no complete event could be recovered")


def _last_event_boundary(buf: bytes | bytearray, start: int, end: int) -> int | None:
    """Index just past the last ``}`` that is followed by ``,`` and ``{`` before ``end``."""
    pos = end
    while True:
        brace = buf.rfind(b"{", start, pos)
        if brace < 0:
            return None
        j = brace - 1
        while j > start and buf[j] in b" \t\r\n":
            j -= 1
        if buf[j : j + 1] == b",":
            j -= 1
            while j > start and buf[j] in b" \t\r\n":
                j -= 1
            if buf[j : j + 1] == b"}":
                return j + 1
        pos = brace


# --- event level ----------------------------------------------------------------------------


class _EventNoArgs(msgspec.Struct):
    ph: str = ""
    cat: str | None = None
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float = math.nan
    dur: float = math.nan
    id: int | str | None = None


_EVENT_NO_ARGS = msgspec.json.Decoder(_EventNoArgs)


def _decode_batch(raws: Sequence[msgspec.Raw], problems: Counter[str]) -> list[Event]:
    try:
        return EVENTS_DECODER.decode(b"[" + b",".join(raws) + b"]")
    except msgspec.ValidationError:
        pass
    events: list[Event] = []
    for raw in raws:
        try:
            events.append(EVENT_DECODER.decode(raw))
            continue
        except msgspec.ValidationError as e:
            reason = str(e)
        try:
            bare = _EVENT_NO_ARGS.decode(raw)
        except msgspec.ValidationError as e:
            problems[f"event skipped: {e}"] += 1
            continue
        problems[f"args ignored: {reason}"] += 1
        events.append(Event(bare.ph, bare.cat, bare.name, bare.pid, bare.tid, bare.ts, bare.dur, bare.id))
    return events


def _to_int(value: object) -> int:
    """pid/tid as int: Kineto writes strings for some ("25738", "stream 7", "Spans")."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        digits = value.rsplit(" ", 1)[-1]
        if digits.lstrip("-").isdigit():
            return int(digits)
    return -1


def _as_int(value: int | str | None) -> int | None:
    """An integer arg that some writers quote ("256", "0x0")."""
    if value is None or isinstance(value, int):
        return value
    try:
        return int(value, 0)
    except ValueError:
        return None


def _int_array(values: list[Any]) -> npt.NDArray[np.int64]:
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([_to_int(v) for v in values], dtype=np.int64)


def us_to_ns(us: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Microseconds (float) to integer nanoseconds without the rounding of ``us * 1000``.

    Epoch-based microsecond values (~1.7e15) leave float64 no room for nanoseconds once
    multiplied; splitting off the integer part first keeps every digit the double holds.
    """
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


@dataclass
class _Batch:
    """One batch of slices in columns, with side-table rows keyed by batch-local index."""

    kind: list[str]
    name: pl.Series
    ts_ns: npt.NDArray[np.int64]
    dur_ns: npt.NDArray[np.int64]
    pid: npt.NDArray[np.int64]
    tid: npt.NDArray[np.int64]
    device: list[int | None]
    stream: list[int | None]
    correlation: list[int | None]
    external_id: list[int | None]
    kernel_rows: list[tuple[Any, ...]]
    copy_rows: list[tuple[Any, ...]]
    op_rows: list[tuple[Any, ...]]


@dataclass
class _Builder:
    path: Path
    problems: Counter[str] = field(default_factory=Counter)
    batches: list[_Batch] = field(default_factory=list)
    memory_rows: list[tuple[Any, ...]] = field(default_factory=list)
    flow_rows: list[tuple[Any, ...]] = field(default_factory=list)
    thread_rows: list[tuple[Any, ...]] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    kind_cache: dict[str | None, str] = field(default_factory=dict)
    copy_cache: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    rows_seen: int = 0
    unfinished: int = 0
    saw_python: bool = False
    saw_modules: bool = False

    def _kind_of(self, cat: str | None) -> str:
        kind = self.kind_cache.get(cat)
        if kind is None:
            low = (cat or "").lower()
            kind = _TRACE_SPAN if low == "trace" else _CATEGORY_KIND.get(low, Kind.OTHER).value
            self.kind_cache[cat] = kind
        return kind

    def add(self, events: list[Event]) -> None:
        slices: list[Event] = []
        for e in events:
            ph = e.ph
            if ph == "X":
                slices.append(e)
            elif ph in ("s", "f", "t"):
                self._flow(e)
            elif ph in ("i", "I"):
                self._instant(e)
            elif ph == "M":
                self._metadata(e)
            else:
                self.counts[f"ignored phase {ph!r}"] += 1
        self.rows_seen += len(events)
        if slices:
            self._slices(slices)

    def _flow(self, e: Event) -> None:
        self.counts[f"flow {e.cat}"] += 1
        fid = e.id if isinstance(e.id, int) else _to_int(e.id)
        if math.isnan(e.ts):
            return
        self.flow_rows.append(
            (fid, _FLOW_KIND.get(e.cat or "", "other"), e.ph, e.ts, _to_int(e.pid), _to_int(e.tid))
        )

    def _instant(self, e: Event) -> None:
        a = e.args
        if e.name == "[memory]" and a is not None and not math.isnan(e.ts):
            # "finished": false on an instant (ROCm builds write it on [memory] events) means
            # nothing: an instant has no end. Only slices count as unfinished.
            self.counts["memory"] += 1
            self.memory_rows.append(
                (e.ts, _to_int(e.pid), _to_int(e.tid), a.device_type, a.device_id, a.mem_bytes,
                 a.total_allocated, a.total_reserved, a.addr)
            )
        else:
            self.counts["instant"] += 1

    def _metadata(self, e: Event) -> None:
        self.counts["metadata"] += 1
        a = e.args
        if a is None or a.name is None:
            return
        if e.name == "process_name":
            self.thread_rows.append((_to_int(e.pid), None, a.name))
        elif e.name == "thread_name":
            self.thread_rows.append((_to_int(e.pid), _to_int(e.tid), a.name))

    def _slices(self, evs: list[Event]) -> None:
        kind_of = self._kind_of
        kinds = [kind_of(e.cat) for e in evs]
        if _TRACE_SPAN in kinds:
            keep = [i for i, k in enumerate(kinds) if k != _TRACE_SPAN]
            for i, k in enumerate(kinds):
                if k == _TRACE_SPAN and not math.isnan(evs[i].ts):
                    t = us_to_ns(np.array([evs[i].ts, evs[i].ts + evs[i].dur]))
                    self.spans.append((int(t[0]), int(t[1])))
            evs = [evs[i] for i in keep]
            kinds = [kinds[i] for i in keep]
        if not evs:
            return
        ts = np.array([e.ts for e in evs], dtype=np.float64)
        dur = np.array([e.dur for e in evs], dtype=np.float64)
        bad_ts = np.isnan(ts)
        if bad_ts.any():
            self.problems["slice without ts skipped"] += int(bad_ts.sum())
            keep_idx = np.flatnonzero(~bad_ts).tolist()
            evs = [evs[i] for i in keep_idx]
            kinds = [kinds[i] for i in keep_idx]
            ts, dur = ts[~bad_ts], dur[~bad_ts]
        no_dur = np.isnan(dur)
        if no_dur.any():
            self.problems["slice without dur taken as 0"] += int(no_dur.sum())
            dur[no_dur] = 0.0
        negative = dur < 0
        if negative.any():
            self.problems["negative dur taken as 0"] += int(negative.sum())
            dur[negative] = 0.0
        for k in kinds:
            self.counts[k] += 1
        args = [e.args for e in evs]
        pid = _int_array([e.pid for e in evs])
        tid = _int_array([e.tid for e in evs])
        correlation = [a.correlation if a is not None else None for a in args]
        external = [
            (a.external_id if a.external_id is not None else a.external_id_legacy)
            if a is not None else None
            for a in args
        ]
        device: list[int | None] = [None] * len(evs)
        stream: list[int | None] = [None] * len(evs)
        kernel_rows: list[tuple[Any, ...]] = []
        copy_rows: list[tuple[Any, ...]] = []
        op_rows: list[tuple[Any, ...]] = []
        gpu_values = {k.value for k in _GPU_KINDS}
        op_values = {k.value for k in _OP_ATTR_KINDS}
        for i, k in enumerate(kinds):
            a = args[i]
            if k in gpu_values:
                # GPU events: pid is the device and tid the stream when args lack them.
                device[i] = a.device if a is not None and a.device is not None else int(pid[i])
                stream[i] = _as_int(a.stream) if a is not None and a.stream is not None else int(tid[i])
                if a is None:
                    continue
                if k == "kernel":
                    kernel_rows.append(_kernel_row(i, a))
                elif k == "memcpy" or k == "memset":
                    copy_rows.append(self._copy_row(i, evs[i].name, k, a))
            elif a is not None:
                if a.finished is False:
                    self.unfinished += 1
                if k in op_values:
                    if k == "python":
                        self.saw_python = True
                        if evs[i].name.startswith("nn.Module:"):
                            self.saw_modules = True
                    row = _op_row(i, a)
                    if row is not None:
                        op_rows.append(row)
        self.batches.append(
            _Batch(
                kind=kinds,
                name=pl.Series(Col.NAME, [e.name for e in evs], dtype=pl.Categorical),
                ts_ns=us_to_ns(ts),
                dur_ns=np.rint(dur * 1000.0).astype(np.int64),
                pid=pid,
                tid=tid,
                device=device,
                stream=stream,
                correlation=correlation,
                external_id=external,
                kernel_rows=kernel_rows,
                copy_rows=copy_rows,
                op_rows=op_rows,
            )
        )

    def _copy_row(self, i: int, name: str, kind: str, a: EventArgs) -> tuple[Any, ...]:
        if kind == "memset":
            return (i, _as_int(a.bytes), None, None, None)
        parsed = self.copy_cache.get(name)
        if parsed is None:
            m = _COPY_NAME.match(name)
            if m is None:
                parsed = ("unknown", "unknown", "unknown")
            else:
                parsed = (_known(m.group(1), "copy"), _known(m.group(2), "mem"), _known(m.group(3), "mem"))
            self.copy_cache[name] = parsed
        return (i, _as_int(a.bytes), *parsed)

    def finish(self, header: dict[str, msgspec.Raw], truncation: Truncation | None) -> Trace:
        slices, remap = self._slices_table()
        kernel_attrs = _side_table(self.batches, "kernel_rows", KERNEL_ATTRS_SCHEMA, remap)
        copy_attrs = _side_table(self.batches, "copy_rows", COPY_ATTRS_SCHEMA, remap)
        op_attrs = _side_table(self.batches, "op_rows", OP_ATTRS_SCHEMA, remap)
        self.batches.clear()
        memory = _rows_table(self.memory_rows, MEMORY_SCHEMA, time_cols=(0,))
        flows = _rows_table(self.flow_rows, FLOWS_SCHEMA, time_cols=(3,))
        threads = pl.DataFrame(self.thread_rows, schema=THREADS_SCHEMA, orient="row").unique(
            maintain_order=True
        )
        meta = self._meta(header, truncation, slices, op_attrs, memory)
        return Trace(
            meta=meta,
            slices=slices,
            kernel_attrs=kernel_attrs,
            copy_attrs=copy_attrs,
            op_attrs=op_attrs,
            memory=memory,
            flows=flows,
            threads=threads,
            devices=_devices(header),
        )

    def _slices_table(self) -> tuple[pl.DataFrame, npt.NDArray[np.int64]]:
        if not self.batches:
            return pl.DataFrame(schema=SLICES_SCHEMA), np.zeros(0, dtype=np.int64)
        b = self.batches
        frame = pl.DataFrame(
            {
                Col.KIND: pl.Series([k for x in b for k in x.kind], dtype=KIND_DTYPE),
                Col.NAME: pl.concat([x.name for x in b]),
                Col.TS: np.concatenate([x.ts_ns for x in b]),
                Col.DUR: np.concatenate([x.dur_ns for x in b]),
                Col.PID: np.concatenate([x.pid for x in b]),
                Col.TID: np.concatenate([x.tid for x in b]),
                Col.DEVICE: pl.Series([v for x in b for v in x.device], dtype=pl.Int32),
                Col.STREAM: pl.Series([v for x in b for v in x.stream], dtype=pl.Int64),
                Col.CORRELATION: pl.Series([v for x in b for v in x.correlation], dtype=pl.Int64),
                Col.EXTERNAL_ID: pl.Series([v for x in b for v in x.external_id], dtype=pl.Int64),
            }
        )
        # Sort by start time (file order breaks ties) so that ids follow time.
        order = np.argsort(frame.get_column(Col.TS).to_numpy(), kind="stable")
        frame = frame[order]
        remap = np.empty_like(order)
        remap[order] = np.arange(order.size)
        frame = frame.with_columns(
            pl.Series(Col.ID, np.arange(frame.height, dtype=np.int64)),
            pl.lit(None, dtype=pl.Int32).alias(Col.DEPTH),
            pl.lit(None, dtype=pl.Int64).alias(Col.PARENT),
            pl.lit(None, dtype=pl.Int64).alias(Col.LAUNCH),
            pl.lit(None, dtype=pl.Int64).alias(Col.OP),
        ).select(list(SLICES_SCHEMA))
        return link_slices(frame).cast(dict(SLICES_SCHEMA)), remap  # type: ignore[arg-type]

    def _meta(
        self,
        header: dict[str, msgspec.Raw],
        truncation: Truncation | None,
        slices: pl.DataFrame,
        op_attrs: pl.DataFrame,
        memory: pl.DataFrame,
    ) -> TraceMeta:
        values = {k: _decode_any(v) for k, v in header.items() if k not in ("deviceProperties", "computeProperties")}
        warnings: list[str] = []
        if truncation is not None:
            warnings.append(
                f"file ends mid-event: recovered {truncation.events_recovered} complete events; "
                f"about {truncation.events_lost_estimate} events "
                f"({truncation.bytes_total - truncation.bytes_recovered} bytes) after the cut were lost"
            )
        for problem, count in sorted(self.problems.items()):
            warnings.append(f"{count} events: {problem}")
        if self.unfinished:
            warnings.append(f"{self.unfinished} events were still open when the profiler stopped")
        distributed = values.get("distributedInfo")
        versions = {k: str(values[k]) for k in _VERSION_KEYS if k in values}
        schema_version = values.get("schemaVersion")
        base = values.get("baseTimeNanoseconds")
        unit = values.get("displayTimeUnit")
        return TraceMeta(
            path=str(self.path),
            format="kineto",
            schema_version=schema_version if isinstance(schema_version, int) else None,
            # displayTimeUnit is a viewer hint only: Chrome-trace ts/dur are always microseconds
            # (a 2024 V100 trace says "ns" over microsecond values; see the hta MANIFEST).
            display_time_unit=unit if isinstance(unit, str) else None,
            base_time_ns=base if isinstance(base, int) else None,
            versions=versions,
            capture=self._capture(values, op_attrs, memory),
            distributed=distributed if isinstance(distributed, dict) else {},
            profiler_spans_ns=tuple(self.spans),
            event_counts=dict(sorted(self.counts.items())),
            unfinished_events=self.unfinished,
            truncation=truncation,
            warnings=tuple(warnings),
        )

    def _capture(self, values: dict[str, Any], op_attrs: pl.DataFrame, memory: pl.DataFrame) -> Capture:
        # PyTorch >= 2.1 writes the options that were on as top-level "record_shapes": 1 etc.;
        # older files say nothing, so the options are inferred from what the events carry.
        if any(k in values for k in _CAPTURE_KEYS):
            flags = {k: bool(values.get(k)) for k in _CAPTURE_KEYS}
            return Capture(**flags, source="header")
        has = op_attrs.select(
            pl.col(OCol.INPUT_DIMS).is_not_null().any().alias("shapes"),
            pl.col(OCol.CALL_STACK).is_not_null().any().alias("stack"),
            pl.col(OCol.FLOPS).is_not_null().any().alias("flops"),
        ).row(0, named=True) if op_attrs.height else {"shapes": False, "stack": False, "flops": False}
        return Capture(
            record_shapes=bool(has["shapes"]),
            profile_memory=memory.height > 0,
            with_stack=bool(has["stack"]) or self.saw_python,
            with_flops=bool(has["flops"]),
            with_modules=self.saw_modules,
            source="inferred",
        )


def _known(value: str | None, what: str) -> str:
    allowed = COPY_KINDS if what == "copy" else MEMORY_KINDS
    return value if value is not None and value in allowed else "unknown"


def _kernel_row(i: int, a: EventArgs) -> tuple[Any, ...]:
    g = a.grid if isinstance(a.grid, list) and len(a.grid) == 3 else (None, None, None)
    b = a.block if isinstance(a.block, list) and len(a.block) == 3 else (None, None, None)
    return (i, *g, *b, a.registers, a.shared_memory, a.blocks_per_sm, a.warps_per_sm, a.occupancy_pct)


def _op_row(i: int, a: EventArgs) -> tuple[Any, ...] | None:
    if (
        not a.input_dims
        and a.sequence is None
        and a.flops is None
        and a.call_stack is None
        and a.collective is None
        and a.py_id is None
    ):
        return None
    return (
        i,
        # Whitespace dropped so that "[[2, 3]]" and "[[2,3]]" group together.
        bytes(a.input_dims).replace(b" ", b"").decode("utf-8", "replace") if a.input_dims else None,
        bytes(a.input_types).decode("utf-8", "replace") if a.input_types else None,
        a.sequence,
        a.fwd_tid,
        None if a.flops is None else int(a.flops),
        a.call_stack,
        a.collective,
        a.in_nelems,
        a.out_nelems,
        a.group_size,
        a.dtype,
        a.pg_name,
        a.py_id,
        a.py_parent_id,
    )


def _side_table(
    batches: list[_Batch], attr: str, schema: pl.Schema, remap: npt.NDArray[np.int64]
) -> pl.DataFrame:
    rows: list[tuple[Any, ...]] = []
    offset = 0
    for b in batches:
        for row in getattr(b, attr):
            rows.append((int(remap[offset + row[0]]), *row[1:]))
        offset += len(b.kind)
    if not rows:
        return pl.DataFrame(schema=schema)
    return pl.DataFrame(rows, schema=schema, orient="row").sort(Col.ID)


def _rows_table(rows: list[tuple[Any, ...]], schema: pl.Schema, time_cols: tuple[int, ...]) -> pl.DataFrame:
    if not rows:
        return pl.DataFrame(schema=schema)
    names = list(schema)
    columns = list(zip(*rows, strict=False))
    data: dict[str, Any] = {}
    for j, name in enumerate(names):
        if j in time_cols:
            data[name] = us_to_ns(np.array(columns[j], dtype=np.float64))
        else:
            data[name] = pl.Series(name, columns[j], dtype=schema[name], strict=False)
    return pl.DataFrame(data).cast(dict(schema)).sort(names[time_cols[0]], maintain_order=True)  # type: ignore[arg-type]


def _decode_any(raw: msgspec.Raw) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


def _devices(header: dict[str, msgspec.Raw]) -> pl.DataFrame:
    # tb_plugin's 2021 test fixture calls the list "computeProperties".
    raw = header.get("deviceProperties", header.get("computeProperties"))
    items = _decode_any(raw) if raw is not None else None
    if not isinstance(items, list):
        return pl.DataFrame(schema=DEVICES_SCHEMA)
    keys = {
        DCol.DEVICE: "id",
        DCol.NAME: "name",
        DCol.TOTAL_MEM: "totalGlobalMem",
        DCol.CC_MAJOR: "computeMajor",
        DCol.CC_MINOR: "computeMinor",
        DCol.NUM_SMS: "numSms",
        DCol.MAX_THREADS_PER_SM: "maxThreadsPerMultiprocessor",
        DCol.REGS_PER_SM: "regsPerMultiprocessor",
        DCol.SHARED_MEM_PER_SM: "sharedMemPerMultiprocessor",
    }
    rows = []
    for item in items:
        if isinstance(item, dict):
            rows.append({col: _scalar(item.get(key), DEVICES_SCHEMA[col]) for col, key in keys.items()})
    if not rows:
        return pl.DataFrame(schema=DEVICES_SCHEMA)
    return pl.DataFrame(rows, schema=DEVICES_SCHEMA)


def _scalar(value: Any, dtype: pl.DataType) -> Any:
    if dtype == pl.String:
        return value if isinstance(value, str) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
