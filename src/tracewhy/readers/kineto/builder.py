"""Reader for PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzipped, PyTorch 1.8 to 2.13.

``document`` gets the header and the events; this module turns each batch of decoded
events into columns at once (list comprehensions per field, no per-event method calls) and
builds the Trace.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msgspec
import numpy as np

# polars passes every numpy array through np.ma.getmask: numpy.ma is loaded with the reader's
# modules, not 16 ms into its first read (a run served from the cache never imports it).
import numpy.ma
import numpy.typing as npt
import polars as pl

from tracewhy.errors import TraceError
from tracewhy.model.linking import link_slices
from tracewhy.model.schema import (
    COPY_ATTRS_SCHEMA,
    COPY_KINDS,
    FLOWS_SCHEMA,
    KERNEL_ATTRS_SCHEMA,
    KIND_CODE,
    KIND_DTYPE,
    MEMORY_KINDS,
    MEMORY_SCHEMA,
    OP_ATTRS_SCHEMA,
    SLICES_SCHEMA,
    SYNC_ATTRS_SCHEMA,
    THREADS_SCHEMA,
    Col,
    Kind,
    OCol,
)
from tracewhy.model.trace import Capture, Trace, TraceMeta, Truncation
from tracewhy.readers.kineto import document, parallel, pieces
from tracewhy.readers.kineto.categories import accelerator, category_kind
from tracewhy.readers.kineto.document import BadCut, Body, decode_body, first_byte, split_document
from tracewhy.readers.kineto.events import (
    Event,
    GpuArgs,
    LinkArgs,
    MemoryArgs,
    MetaArgs,
    OpArgs,
    SyncArgs,
    decode_args,
)
from tracewhy.readers.kineto.header import decode_value, device_table
from tracewhy.readers.kineto.repair import REPAIR_PREFIX, merge_counts, repair_warnings, too_deep
from tracewhy.readers.source import DEFAULT_MAX_INFLATED_BYTES, content_size, gzip_complete, is_gzip, read_bytes

Progress = Callable[[int, int], None]

# Launch arrows: "ac2g" since PyTorch 1.11; "async" (1.8-1.9), "async_gpu" (2022 builds) and
# "async_cpu_to_gpu" (Meta-internal 2022) before that.
_FLOW_KIND = {"ac2g": "correlation", "async": "correlation", "async_gpu": "correlation",
              "async_cpu_to_gpu": "correlation", "fwdbwd": "fwdbwd"}
#: A batch's kinds are a uint8 array of their codes (KIND_CODE); this turns codes back into kinds.
_KINDS: tuple[str, ...] = tuple(KIND_CODE)
_KIND_SERIES = pl.Series(_KINDS, dtype=KIND_DTYPE)
_SPAN = 255  # cat "Trace": the profiler's own capture window, not a slice
# cat "cpu_instant_event" written as a slice: torch's Python exporter (export_chrome_trace(...,
# use_python_export=True), torch 2.13) writes every activity as "X", the [memory] instants
# included, with a meaningless dur and "finished": false. They are instants, read as such.
_INSTANT = 254


def _code_set(*kinds: Kind) -> npt.NDArray[np.bool_]:
    table = np.zeros(256, dtype=np.bool_)
    table[[KIND_CODE[k.value] for k in kinds]] = True
    return table


#: Device activity: args decoded as GpuArgs. Ops and annotations: OpArgs. The rest: LinkArgs.
_GPU_CODES = _code_set(Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_ANNOTATION, Kind.GPU_SYNC,
                       Kind.PROFILER_RANGE)
_OP_CODES = _code_set(Kind.CPU_OP, Kind.ANNOTATION)
#: An id no event has: "not known" while columns are built (null in the table).
_NULL = np.iinfo(np.int64).min
_I32_MIN, _I32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)
_I64_MIN, _I64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
#: Times and durations (microseconds) at or beyond this, or not finite, are not usable: a start
#: plus a duration must fit int64 nanoseconds. Epoch microseconds are 1.8e15 in 2026.
_US_MAX = 4.6e15
#: From this magnitude on, a float64 of microseconds cannot hold every nanosecond (its step is
#: over 1 ns from 2**43 us, 102 days): epoch-based times (1.7e15 us in 2024, step 0.25 us)
#: written with fractions were rounded when the JSON was decoded. Integer ones are exact.
_EXACT_US = float(2**43)
# record_function scopes that PyTorch itself opens. Before 1.10 they were written with cat
# "Operator" like aten ops; they are annotations, not operators.
_LEGACY_ANNOTATION = re.compile(r"^(ProfilerStep#\d+|enumerate\(DataLoader\)#|Optimizer\.(step|zero_grad)#)")
_FINISHED = b'"finished"'  # PyTorch >= 2.4 marks slices left open with "finished": false
_FLOW_PHASES = frozenset(("s", "f", "t"))
_INSTANT_PHASES = frozenset(("i", "I"))
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
    workers: int | None = None,
) -> Trace:
    """Read a Kineto JSON trace (``.json`` or ``.json.gz``) into a Trace.

    A file over ``ONE_PASS_MAX_BYTES`` is read in pieces as it comes off the disk
    (``pieces``) and never held whole; a small one, and one that piece reading cannot
    handle, is read whole (``document``). ``workers``: processes that decode (default:
    two for a file of 256 MB or more, see ``parallel``). The Trace is the same either
    way and for any number of workers.
    """
    path = Path(path)
    try:
        return _read(path, progress, batch_size, max_inflated_bytes, workers)
    except RecursionError:
        # msgspec recurses once per level of nesting (even to skip a value it does not keep).
        raise TraceError(path, too_deep()) from None


def _read(path: Path, progress: Progress | None, batch_size: int, max_inflated_bytes: int,
          workers: int | None) -> Trace:
    size = content_size(path)
    whole_max, piece = document.ONE_PASS_MAX_BYTES, pieces.piece_size(size)
    # Helpers start before the read, so that their start-up overlaps it.
    count = parallel.worker_count(size, workers) if size > whole_max or workers else 1
    scratch = parallel.scratch_dir() if count > 1 else None
    helpers = parallel.start_helpers(count, scratch) if scratch is not None else []
    # The cyclic collector would walk every decoded event object again and again while the
    # batches are built; none of them can form a cycle, so it is paused for the read.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    builder: _Builder | None = None
    try:
        if size > whole_max:
            # Helpers keep the pieces they are sent until they answer: those must not be lent.
            stream = pieces.open_pieces(path, piece, max_inflated_bytes, lent=not helpers)
            try:
                builder = _build(path, ((p, len(p)) for p in stream.pieces()), helpers, size, progress)
            except BadCut:
                # Not a shape piece reading handles, or a cut inside an event: read it whole.
                # Helpers may hold batches of the abandoned read: new ones take over.
                builder = None
                if helpers:
                    _stop(helpers, None)
                    helpers = parallel.start_helpers(count, scratch) if scratch is not None else []
            else:
                assert stream.header is not None
                header, truncation = stream.header, None
                had_events = bool(builder.rows_seen or builder.problems)
            finally:
                stream.close()
        if builder is None:
            buf = read_bytes(path, max_inflated_bytes)
            if not first_byte(buf):  # (never buf.strip(): that would copy the whole file)
                # A gzip file cut inside its first block inflates to nothing: it is not empty.
                raise TraceError(path, "gzip stream ends before any content: the file is cut short"
                                 if is_gzip(path) and not gzip_complete(path) else "file is empty")
            doc = split_document(path, buf, one_pass=not helpers and size <= whole_max)
            del buf
            if doc.events is not None:
                builder = _Builder(path)
                builder.add(doc.events)
                if progress is not None:
                    progress(len(doc.events), len(doc.events))
            else:
                builder = _build(path, doc.bodies(batch_size), helpers, doc.event_count, progress)
            merge_counts(builder.problems, doc.repairs)
            had_events = doc.event_count > 0
            header, truncation = doc.header, doc.truncation
            if truncation is not None and is_gzip(path) and not gzip_complete(path):
                truncation = dataclasses.replace(truncation, stream_cut=True)
            doc.events = doc.raw_events = None  # let the events go before the columns are joined
    finally:
        # Helpers are gone, and the collector back, before the columns are joined.
        _stop(helpers, scratch)
        if gc_was_enabled:
            gc.enable()
    if had_events and not builder.rows_seen:
        _no_usable_events(path, builder)
    return builder.finish(header, truncation)


def _no_usable_events(path: Path, builder: _Builder) -> None:
    first = next(iter(builder.problems), "no event could be decoded")
    raise TraceError(path, f"no usable events ({first})")


def _stop(helpers: list[parallel.Helper], scratch: Path | None) -> None:
    for helper in helpers:
        helper.close()
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


def _build(path: Path, bodies: Iterable[tuple[Body, int]], helpers: list[parallel.Helper],
           total: int, progress: Progress | None) -> _Builder:
    """Build the columns of every batch (bytes of a JSON array of events, and its weight in
    units of ``total``), here or, every other batch, in a helper."""
    builder = _Builder(path)
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(min(done, total), total)

    if helpers:
        for part in parallel.build_parts(helpers, bodies, advance):
            assert isinstance(part, _Builder)
            builder.merge(part)
    else:
        for body, weight in bodies:
            builder.add_json(body)
            advance(weight)
    return builder


def _to_int(value: object) -> int:
    """pid/tid as int: Kineto writes strings for some ("25738", "stream 7", "Spans")."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        digits = value.rsplit(" ", 1)[-1]
        if digits.lstrip("-").isdigit() and _fits_i64(number := int(digits)):
            return number
    return -1


def _as_int(value: int | str | None) -> int | None:
    """An integer arg that some writers quote ("256", "0x0")."""
    if value is None or isinstance(value, int):
        return value
    try:
        number = int(value, 0)
    except ValueError:
        return None
    return number if _fits_i64(number) else None


def _fits_i64(number: float) -> bool:
    return _I64_MIN <= number <= _I64_MAX


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


_EMPTY_FRAME = pl.DataFrame()
_EMPTY_KERNEL_ATTRS = pl.DataFrame(schema=KERNEL_ATTRS_SCHEMA)
_EMPTY_COPY_ATTRS = pl.DataFrame(schema=COPY_ATTRS_SCHEMA)
_EMPTY_OP_ATTRS = pl.DataFrame(schema=OP_ATTRS_SCHEMA)
_EMPTY_SYNC_ATTRS = pl.DataFrame(schema=SYNC_ATTRS_SCHEMA)
_SYNC_CODE = KIND_CODE[Kind.GPU_SYNC.value]


@dataclass
class _Batch:
    """One batch of slices in columns, with side tables keyed by batch-local row."""

    frame: pl.DataFrame
    kernel_attrs: pl.DataFrame
    copy_attrs: pl.DataFrame
    op_attrs: pl.DataFrame
    sync_attrs: pl.DataFrame = field(default_factory=lambda: _EMPTY_SYNC_ATTRS)


@dataclass
class _Builder:
    path: Path
    problems: dict[str, int] = field(default_factory=dict)
    batches: list[_Batch] = field(default_factory=list)
    memory: list[pl.DataFrame] = field(default_factory=list)
    flows: list[pl.DataFrame] = field(default_factory=list)
    thread_rows: list[tuple[int, int | None, str]] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    kind_cache: dict[str | None, int] = field(default_factory=dict)
    legacy_cache: dict[str, bool] = field(default_factory=dict)
    copy_cache: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    rows_seen: int = 0
    unfinished: int = 0
    saw_python: bool = False
    #: Largest |ts| (us) of a slice whose ts had a fraction and was beyond _EXACT_US; 0 if none.
    quantised_us: float = 0.0

    def _count(self, key: str, n: int) -> None:
        if n:
            self.counts[key] = self.counts.get(key, 0) + n

    def _problem(self, key: str, n: int) -> None:
        if n:
            self.problems[key] = self.problems.get(key, 0) + n

    def _kind_codes(self, evs: list[Event]) -> tuple[npt.NDArray[np.uint8], bool]:
        """Each event's kind as its position in ``KIND_DTYPE`` (``_SPAN`` for the profiler's own
        window), and whether the legacy category "Operator" (PyTorch < 1.10) is among them:
        only then are record_function scopes written as operators."""
        cache = self.kind_cache
        cats = [e.cat for e in evs]
        seen = set(cats)
        for cat in seen - cache.keys():
            low = (cat or "").lower()
            cache[cat] = _SPAN if low == "trace" else _INSTANT if low == "cpu_instant_event" \
                else KIND_CODE[category_kind(low).value]
        legacy = any(cat is not None and cat.lower() == "operator" for cat in seen)
        return np.fromiter(map(cache.__getitem__, cats), dtype=np.uint8, count=len(cats)), legacy

    def merge(self, part: _Builder) -> None:
        """Take over what a builder of a later part of the same file has built."""
        self.rows_seen += part.rows_seen
        self.unfinished += part.unfinished
        self.saw_python = self.saw_python or part.saw_python
        self.kind_cache.update(part.kind_cache)
        self.quantised_us = max(self.quantised_us, part.quantised_us)
        for key, n in part.counts.items():
            self._count(key, n)
        for key, n in part.problems.items():
            self._problem(key, n)
        self.batches += part.batches
        self.memory += part.memory
        self.flows += part.flows
        self.thread_rows += part.thread_rows
        self.spans += part.spans

    def add_json(self, body: Body) -> None:
        """Take the events of a JSON array (a piece or batch of a file). Raises BadCut as
        ``decode_body`` does."""
        self.add(decode_body(body, self.problems))

    def add(self, events: list[Event]) -> None:
        """Take a batch of events."""
        self.rows_seen += len(events)
        xs = [e for e in events if e.ph == "X"]
        if len(xs) < len(events):
            rest = [e for e in events if e.ph != "X"]
            self._flows([e for e in rest if e.ph in _FLOW_PHASES])
            self._instants([e for e in rest if e.ph in _INSTANT_PHASES])
            self._metadata([e for e in rest if e.ph == "M"])
            for e in rest:
                if e.ph not in _FLOW_PHASES and e.ph not in _INSTANT_PHASES and e.ph != "M":
                    self._count(f"ignored phase {e.ph!r}", 1)
                    self._problem(f"phase {e.ph!r} is not one this reader reads; ignored", 1)
        if xs:
            self._slices(xs)

    def _flows(self, evs: list[Event]) -> None:
        usable = [e for e in evs if abs(e.ts) < _US_MAX]
        self._problem("flow event without usable ts skipped", len(evs) - len(usable))
        evs = usable
        if not evs:
            return
        for cat in {e.cat for e in evs}:
            self._count(f"flow {cat}", sum(1 for e in evs if e.cat == cat))
        self.flows.append(pl.DataFrame({
            "flow_id": _int_array([e.id for e in evs]),
            "kind": [_FLOW_KIND.get(e.cat or "", "other") for e in evs],
            "phase": [e.ph for e in evs],
            "ts_ns": us_to_ns(np.array([e.ts for e in evs], dtype=np.float64)),
            "pid": _int_array([e.pid for e in evs]),
            "tid": _int_array([e.tid for e in evs]),
        }).cast(dict(FLOWS_SCHEMA)))  # type: ignore[arg-type]

    def _instants(self, evs: list[Event]) -> None:
        # "finished": false on an instant (ROCm builds write it on [memory] events) means
        # nothing: an instant has no end. Only slices count as unfinished.
        named = [e for e in evs if e.name == "[memory]"]
        mem = [e for e in named if abs(e.ts) < _US_MAX]
        no_ts = len(named) - len(mem)
        self._problem("memory event without usable ts skipped", no_ts)
        decoded = decode_args([e.args for e in mem], MemoryArgs, self.problems)
        args = [a for a in decoded if a is not None]
        if len(args) < len(mem):
            mem = [e for e, a in zip(mem, decoded, strict=True) if a is not None]
        # Every other instant counts as one, a [memory] event without usable args included.
        self._count("instant", len(evs) - len(mem) - no_ts)
        if not mem:
            return
        self._count("memory", len(mem))
        self.memory.append(pl.DataFrame({
            "ts_ns": us_to_ns(np.array([e.ts for e in mem], dtype=np.float64)),
            "pid": _int_array([e.pid for e in mem]),
            "tid": _int_array([e.tid for e in mem]),
            "device_type": [a.device_type for a in args],
            "device_id": [a.device_id for a in args],
            "bytes": [a.mem_bytes for a in args],
            "total_allocated": [a.total_allocated for a in args],
            "total_reserved": [a.total_reserved for a in args],
            "addr": [a.addr for a in args],
        }, schema=MEMORY_SCHEMA))

    def _metadata(self, evs: list[Event]) -> None:
        self._count("metadata", len(evs))
        for e, a in zip(evs, decode_args([e.args for e in evs], MetaArgs, self.problems), strict=True):
            if a is None or a.name is None:
                continue
            if e.name == "process_name":
                self.thread_rows.append((_to_int(e.pid), None, a.name))
            elif e.name == "thread_name":
                self.thread_rows.append((_to_int(e.pid), _to_int(e.tid), a.name))

    def _slices(self, evs: list[Event]) -> None:
        codes, legacy = self._kind_codes(evs)
        special = np.flatnonzero(codes >= _INSTANT)
        if special.size:
            # The profiler's own window (one or a few events) and instants written as slices:
            # taken out.
            for i in special.tolist():
                e = evs[i]
                if codes[i] == _SPAN and abs(e.ts) < _US_MAX:
                    t = us_to_ns(np.array([e.ts, e.ts + (e.dur if 0 <= e.dur < _US_MAX else 0.0)]))
                    self.spans.append((int(t[0]), int(t[1])))
            self._instants([evs[i] for i in special.tolist() if codes[i] == _INSTANT])
            keep = codes < _INSTANT
            evs, codes = [evs[i] for i in np.flatnonzero(keep).tolist()], codes[keep]
        if legacy:
            self._legacy_annotations(evs, codes)
        ts = np.array([e.ts for e in evs], dtype=np.float64)
        bad_ts = ~(np.abs(ts) < _US_MAX)  # (NaN: none was written)
        if bad_ts.any():
            self._problem("slice without ts skipped", int(np.isnan(ts).sum()))
            self._problem("slice with ts beyond int64 nanoseconds skipped", int((bad_ts & ~np.isnan(ts)).sum()))
            evs, codes, ts = [evs[i] for i in np.flatnonzero(~bad_ts).tolist()], codes[~bad_ts], ts[~bad_ts]
        if not evs:
            return
        big = np.abs(ts) >= _EXACT_US
        if big.any():
            far = ts[big]
            fractional = far[far != np.floor(far)]
            if fractional.size:
                self.quantised_us = max(self.quantised_us, float(np.abs(fractional).max()))
        dur = np.array([e.dur for e in evs], dtype=np.float64)
        no_dur = np.isnan(dur)
        if no_dur.any():
            self._problem("slice without dur taken as 0", int(no_dur.sum()))
            dur[no_dur] = 0.0
        negative = dur < 0
        if negative.any():
            self._problem("negative dur taken as 0", int(negative.sum()))
            dur[negative] = 0.0
        huge = dur >= _US_MAX
        if huge.any():
            self._problem("dur beyond int64 nanoseconds taken as 0", int(huge.sum()))
            dur[huge] = 0.0
        for code, count in enumerate(np.bincount(codes, minlength=len(_KINDS)).tolist()):
            self._count(_KINDS[code], count)
        n = len(evs)
        pid = _int_array([e.pid for e in evs])
        tid = _int_array([e.tid for e in evs])
        ids = _Ids(n)
        kernel_attrs, copy_attrs, op_attrs = _EMPTY_KERNEL_ATTRS, _EMPTY_COPY_ATTRS, _EMPTY_OP_ATTRS
        sync_attrs = _EMPTY_SYNC_ATTRS
        on_gpu = _in(codes, _GPU_CODES)
        device = np.full(n, _NULL, dtype=np.int64)
        stream = np.full(n, _NULL, dtype=np.int64)
        device[on_gpu], stream[on_gpu] = pid[on_gpu], tid[on_gpu]
        rows = np.flatnonzero(on_gpu)
        if rows.size:
            gpu = cast(list[GpuArgs | None], self._decode(evs, rows, GpuArgs))
            syncs = rows[codes[rows] == _SYNC_CODE]
            if syncs.size:
                sync_attrs = self._sync_attrs(evs, syncs)
            ids.fill(rows, gpu)
            # GPU events: pid is the device and tid the stream when args lack them.
            device[rows] = [d if a is not None and (d := a.device) is not None else p
                            for a, p in zip(gpu, pid[rows].tolist(), strict=True)]
            stream[rows] = [(_NULL if (v := _as_int(a.stream)) is None else v)
                            if a is not None and a.stream is not None else t
                            for a, t in zip(gpu, tid[rows].tolist(), strict=True)]
            odd = (device[rows] < _I32_MIN) | (device[rows] > _I32_MAX)  # a corrupt file's
            if odd.any():
                self._problem("device id beyond int32 taken as -1", int(odd.sum()))
                device[rows[odd]] = -1
            kernel_attrs = _kernel_attrs(rows, codes, gpu)
            copy_attrs = self._copy_attrs(rows, codes, gpu, evs)
        on_op = _in(codes, _OP_CODES)
        rows = np.flatnonzero(on_op)
        if rows.size:
            ops = cast(list[OpArgs | None], self._decode(evs, rows, OpArgs))
            ids.fill(rows, ops)
            op_attrs = _op_attrs(rows, ops)
        python = codes == KIND_CODE[Kind.PYTHON.value]
        rows = np.flatnonzero(~(on_gpu | python | on_op))
        if rows.size:
            ids.fill(rows, self._decode(evs, rows, LinkArgs))
        if python.any():
            # Python frames' args (frame ids) nothing reads; they are decoded only to count
            # frames that say "finished": false (their joined bytes are a tenth of the file's:
            # looking there costs a fifth of looking through the whole piece).
            rows = np.flatnonzero(python)
            if _FINISHED in b",".join([evs[i].args for i in rows.tolist()]):
                self._decode(evs, rows, LinkArgs)
        self.saw_python = self.saw_python or bool(python.any())
        frame = pl.DataFrame({
            Col.KIND: codes,  # the Enum once all batches are joined
            Col.NAME: pl.Series([e.name for e in evs], dtype=pl.Categorical()),
            Col.TS: us_to_ns(ts),
            Col.DUR: np.rint(dur * 1000.0).astype(np.int64),
            Col.PID: pid,
            Col.TID: tid,
            Col.DEVICE: device,
            Col.STREAM: stream,
            Col.CORRELATION: ids.correlation,
            Col.EXTERNAL_ID: ids.external,
        })  # _NULL (not known) becomes null once all batches are joined: one pass, not one a batch
        self.batches.append(_Batch(frame=frame, kernel_attrs=kernel_attrs, copy_attrs=copy_attrs, op_attrs=op_attrs,
                                   sync_attrs=sync_attrs))

    def _decode(self, evs: list[Event], rows: npt.NDArray[np.intp], shape: type[LinkArgs]) -> list[LinkArgs | None]:
        """The args of the events at ``rows``, as ``shape``; open slices are counted."""
        args = decode_args([evs[i].args for i in rows.tolist()], shape, self.problems)
        self.unfinished += sum(1 for a in args if a is not None and a.finished is False)
        return args

    def _sync_attrs(self, evs: list[Event], syncs: npt.NDArray[np.intp]) -> pl.DataFrame:
        """Sync rows' wait targets (their args decoded again, with the keys only they carry: the
        other device rows are not slowed by them); -1 is none."""
        args = decode_args([evs[i].args for i in syncs.tolist()], SyncArgs, {})
        waits = [(i, a.wait_on_stream, a.wait_record_correlation) for i, a in zip(syncs.tolist(), args, strict=True)
                 if a is not None and a.wait_on_stream is not None and a.wait_on_stream >= 0]
        if not waits:
            return _EMPTY_SYNC_ATTRS
        return pl.DataFrame({
            "id": [i for i, _, _ in waits],
            "wait_stream": [w for _, w, _ in waits],
            "wait_record_correlation": [c if c is not None and c >= 0 else None for _, _, c in waits],
        }, schema=SYNC_ATTRS_SCHEMA)

    def _legacy_annotations(self, evs: list[Event], codes: npt.NDArray[np.uint8]) -> None:
        """Re-kind, in place, the record_function scopes that PyTorch < 1.10 wrote as operators."""
        ops = np.flatnonzero(codes == KIND_CODE[Kind.CPU_OP.value]).tolist()
        cache = self.legacy_cache
        for name in {evs[i].name for i in ops} - cache.keys():
            cache[name] = _LEGACY_ANNOTATION.match(name) is not None
        scopes = [i for i in ops if cache[evs[i].name]]
        codes[scopes] = KIND_CODE[Kind.ANNOTATION.value]

    def _copy_attrs(self, rows: npt.NDArray[np.intp], codes: npt.NDArray[np.uint8], gpu: list[GpuArgs | None],
                    evs: list[Event]) -> pl.DataFrame:
        memcpy, memset = KIND_CODE[Kind.MEMCPY.value], KIND_CODE[Kind.MEMSET.value]
        pick = _with_args(rows, codes, gpu, (memcpy, memset))
        if not pick:
            return _EMPTY_COPY_ATTRS
        parsed = [self._copy_kind(evs[i].name) if c == memcpy else (None, None, None) for i, c, _ in pick]
        return pl.DataFrame({
            "id": [i for i, _, _ in pick],
            "bytes": [_as_int(a.bytes) for _, _, a in pick],
            "copy_kind": [p[0] for p in parsed],
            "src_mem": [p[1] for p in parsed],
            "dst_mem": [p[2] for p in parsed],
        }, schema=COPY_ATTRS_SCHEMA)

    def _copy_kind(self, name: str) -> tuple[str, str, str]:
        parsed = self.copy_cache.get(name)
        if parsed is None:
            m = _COPY_NAME.match(name)
            parsed = ("unknown", "unknown", "unknown") if m is None else (
                _known(m.group(1), COPY_KINDS), _known(m.group(2), MEMORY_KINDS), _known(m.group(3), MEMORY_KINDS))
            self.copy_cache[name] = parsed
        return parsed

    def finish(self, header: dict[str, msgspec.Raw], truncation: Truncation | None) -> Trace:
        offsets = np.cumsum([0] + [b.frame.height for b in self.batches])
        slices, remap = self._slices_table()
        side = {
            name: _side_table([getattr(b, name) for b in self.batches], offsets, remap, schema)
            for name, schema in (("kernel_attrs", KERNEL_ATTRS_SCHEMA), ("copy_attrs", COPY_ATTRS_SCHEMA),
                                 ("sync_attrs", SYNC_ATTRS_SCHEMA),
                                 ("op_attrs", OP_ATTRS_SCHEMA))
        }
        self.batches.clear()
        memory = pl.concat(self.memory).sort("ts_ns", maintain_order=True) if self.memory \
            else pl.DataFrame(schema=MEMORY_SCHEMA)
        flows = pl.concat(self.flows).sort("ts_ns", maintain_order=True) if self.flows \
            else pl.DataFrame(schema=FLOWS_SCHEMA)
        threads = pl.DataFrame(self.thread_rows, schema=THREADS_SCHEMA, orient="row").unique(maintain_order=True)
        devices = device_table(header, self.problems)  # (before the warnings are written)
        meta = self._meta(header, truncation, side["op_attrs"], memory, slices)
        return Trace(meta=meta, slices=slices, memory=memory, flows=flows, threads=threads,
                     devices=devices, **side)

    def _slices_table(self) -> tuple[pl.DataFrame, npt.NDArray[np.int64]]:
        if not self.batches:
            return pl.DataFrame(schema=SLICES_SCHEMA), np.zeros(0, dtype=np.int64)
        # One copy of the columns at a time: the batches' frames are joined without copying
        # (chunked), the sort makes the one contiguous copy, and the batches let theirs go.
        frame = pl.concat([b.frame for b in self.batches], rechunk=False)
        for b in self.batches:
            b.frame = _EMPTY_FRAME
        # Sort by start time (file order breaks ties) so that ids follow time.
        order = np.argsort(frame.get_column(Col.TS).to_numpy(), kind="stable")
        frame = frame[order]
        remap = np.empty_like(order)
        remap[order] = np.arange(order.size)
        frame = frame.with_columns(
            pl.Series(Col.ID, np.arange(frame.height, dtype=np.int64)),
            _KIND_SERIES.gather(frame.get_column(Col.KIND)).alias(Col.KIND),
            *(pl.when(pl.col(c) != _NULL).then(pl.col(c)).alias(c)
              for c in (Col.STREAM, Col.CORRELATION, Col.EXTERNAL_ID)),
            pl.when(pl.col(Col.DEVICE) != _NULL).then(pl.col(Col.DEVICE)).cast(pl.Int32).alias(Col.DEVICE),
            pl.lit(None, dtype=pl.Int32).alias(Col.DEPTH),
            pl.lit(None, dtype=pl.Int64).alias(Col.PARENT),
            pl.lit(None, dtype=pl.Int64).alias(Col.LAUNCH),
            pl.lit(None, dtype=pl.Int64).alias(Col.OP),
        ).select(list(SLICES_SCHEMA))
        return link_slices(frame), remap.astype(np.int64)

    def _meta(self, header: dict[str, msgspec.Raw], truncation: Truncation | None, op_attrs: pl.DataFrame,
              memory: pl.DataFrame, slices: pl.DataFrame) -> TraceMeta:
        values = {k: decode_value(v, self.problems) for k, v in header.items()
                  if k not in ("deviceProperties", "computeProperties")}
        warnings: list[str] = []
        if truncation is not None:
            warnings.append(_truncation_warning(truncation))
        warnings += repair_warnings(self.problems)
        warnings += [f"{count} events: {problem}" for problem, count in sorted(self.problems.items())
                     if not problem.startswith(REPAIR_PREFIX)]
        if self.unfinished:
            warnings.append(f"{self.unfinished} events were still open when the profiler stopped")
        distributed = values.get("distributedInfo")
        schema_version = values.get("schemaVersion")
        base = values.get("baseTimeNanoseconds")
        versions = {k: str(values[k]) for k in _VERSION_KEYS if k in values}
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
            accelerator=_accelerator(self.kind_cache, versions, slices),
            ts_step_ns=_ts_step_ns(self.quantised_us),
            capture=self._capture(values, op_attrs, memory, slices),
            distributed=distributed if isinstance(distributed, dict) else {},
            profiler_spans_ns=tuple(self.spans),
            event_counts=dict(sorted(self.counts.items())),
            unfinished_events=self.unfinished,
            truncation=truncation,
            warnings=tuple(warnings),
        )

    def _capture(self, values: dict[str, Any], op_attrs: pl.DataFrame, memory: pl.DataFrame,
                 slices: pl.DataFrame) -> Capture:
        # PyTorch >= 2.1 writes the options that were on as top-level "record_shapes": 1 etc.;
        # older files say nothing, so the options are inferred from what the events carry.
        if any(k in values for k in _CAPTURE_KEYS):
            return Capture(**{k: bool(values.get(k)) for k in _CAPTURE_KEYS}, source="header")
        has = op_attrs.select(
            pl.col(OCol.INPUT_DIMS).is_not_null().any().alias("shapes"),
            pl.col(OCol.CALL_STACK).is_not_null().any().alias("stack"),
            pl.col(OCol.FLOPS).is_not_null().any().alias("flops"),
        ).row(0, named=True)
        return Capture(
            record_shapes=bool(has["shapes"]),
            profile_memory=memory.height > 0,
            with_stack=bool(has["stack"]) or self.saw_python,
            with_flops=bool(has["flops"]),
            with_modules=self.saw_python and _has_module_frames(slices),
            source="inferred",
        )


def _truncation_warning(t: Truncation) -> str:
    lost = t.bytes_total - t.bytes_recovered
    if t.stream_cut:
        return (f"the gzip stream ends early (the file was cut while being written or copied): recovered "
                f"{t.events_recovered} complete events; how many came after the cut cannot be told")
    if t.events_lost_estimate == 0:
        return (f"file is cut after its events: all {t.events_recovered} events are complete; only fields "
                "written after them (such as traceName, baseTimeNanoseconds) are cut off")
    # The file's tail after its last complete event is only what was written when it was cut:
    # what the run would have written after that is not in the file, so it cannot be counted.
    return (f"file ends mid-event: recovered {t.events_recovered} complete events; the "
            f"{lost} bytes after the last of them (about {t.events_lost_estimate} events) are cut short, and "
            "how many events the run wrote after the cut cannot be told")


def _accelerator(categories: Iterable[str | None], versions: dict[str, str], slices: pl.DataFrame) -> str | None:
    """As ``categories.accelerator``; a CUDA-named trace without version keys (ROCm
    before 6.x wrote none, e.g. the hta MI250 toy) is ROCm if its runtime calls are hip*."""
    found = accelerator(categories, versions)
    if found != "CUDA" or versions:
        return found
    names = slices.filter(pl.col(Col.KIND) == Kind.RUNTIME.value).get_column(Col.NAME).unique()
    return "ROCm" if bool(names.cast(pl.String).str.starts_with("hip").any()) else found


def _ts_step_ns(largest_us: float) -> int:
    """The float64 step (ns, rounded up) at the largest fractional epoch time; 0 if none."""
    return math.ceil(float(np.spacing(largest_us)) * 1000.0) if largest_us else 0


def _has_module_frames(slices: pl.DataFrame) -> bool:
    """with_modules=True writes a Python frame "nn.Module: <class>" per module call."""
    names = slices.filter(pl.col(Col.KIND) == Kind.PYTHON.value).get_column(Col.NAME).unique()
    return bool(names.cast(pl.String).str.starts_with("nn.Module:").any())


def _known(value: str | None, allowed: tuple[str, ...]) -> str:
    return value if value is not None and value in allowed else "unknown"


def _triple(values: list[int] | str | None) -> tuple[int | None, int | None, int | None]:
    if isinstance(values, list) and len(values) == 3:
        return values[0], values[1], values[2]
    return None, None, None


def _in(codes: npt.NDArray[np.uint8], among: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """Whether each kind code is one of those ``among`` marks (a table indexed by code)."""
    return among[codes]


class _Ids:
    """The correlation and external ids of a batch's slices, ``_NULL`` where not known."""

    def __init__(self, n: int) -> None:
        self.correlation = np.full(n, _NULL, dtype=np.int64)
        self.external = np.full(n, _NULL, dtype=np.int64)

    def fill(self, rows: npt.NDArray[np.intp], args: Sequence[LinkArgs | None]) -> None:
        self.correlation[rows] = [_NULL if a is None or (c := a.correlation) is None else c for a in args]
        # "External id" since PyTorch 1.10, "external id" before.
        self.external[rows] = [_NULL if a is None else x if (x := a.external_id) is not None else
                               _NULL if (y := a.external_id_legacy) is None else y for a in args]


def _with_args(rows: npt.NDArray[np.intp], codes: npt.NDArray[np.uint8], gpu: list[GpuArgs | None],
               kinds: tuple[int, ...]) -> list[tuple[int, int, GpuArgs]]:
    """(row, kind code, args) of the device activities at ``rows`` of these kinds that have args."""
    return [(i, c, a) for i, c, a in zip(rows.tolist(), codes[rows].tolist(), gpu, strict=True)
            if a is not None and c in kinds]


def _kernel_attrs(rows: npt.NDArray[np.intp], codes: npt.NDArray[np.uint8], gpu: list[GpuArgs | None]) -> pl.DataFrame:
    kernel = KIND_CODE[Kind.KERNEL.value]
    pick = _with_args(rows, codes, gpu, (kernel,))
    if not pick:
        return _EMPTY_KERNEL_ATTRS
    a = [x for _, _, x in pick]
    grid = [_triple(x.grid) for x in a]
    block = [_triple(x.block) for x in a]
    return pl.DataFrame({
        "id": [i for i, _, _ in pick],
        "grid_x": [g[0] for g in grid], "grid_y": [g[1] for g in grid], "grid_z": [g[2] for g in grid],
        "block_x": [b[0] for b in block], "block_y": [b[1] for b in block], "block_z": [b[2] for b in block],
        "registers_per_thread": [x.registers for x in a],
        "shared_mem_bytes": [x.shared_memory for x in a],
        "blocks_per_sm": [x.blocks_per_sm for x in a],
        "warps_per_sm": [x.warps_per_sm for x in a],
        "est_occupancy_pct": [x.occupancy_pct for x in a],
    }, schema=KERNEL_ATTRS_SCHEMA)


def _op_attrs(rows: npt.NDArray[np.intp], ops: list[OpArgs | None]) -> pl.DataFrame:
    """The attributes of the ops and annotations at ``rows``: one row for each that has any."""
    pick = [(i, x) for i, x in zip(rows.tolist(), ops, strict=True) if x is not None]
    if not pick:
        return _EMPTY_OP_ATTRS
    a = [x for _, x in pick]
    table = pl.DataFrame({
        "id": [i for i, _ in pick],
        # Whitespace dropped from shapes so that "[[2, 3]]" and "[[2,3]]" group together.
        "input_dims": _texts([x.input_dims for x in a], squeeze=True),
        "input_types": _texts([x.input_types for x in a]),
        "sequence_number": [x.sequence for x in a],
        "fwd_thread_id": [x.fwd_tid for x in a],
        "flops": [int(x.flops) if x.flops is not None and _fits_i64(x.flops) else None for x in a],
        "call_stack": [x.call_stack for x in a],
        "collective_name": [x.collective for x in a],
        "in_msg_nelems": [x.in_nelems for x in a],
        "out_msg_nelems": [x.out_nelems for x in a],
        "group_size": [x.group_size for x in a],
        "dtype": [x.dtype for x in a],
        "process_group": [x.pg_name for x in a],
    }, schema=OP_ATTRS_SCHEMA)
    # Only ops that carry one of these are rows (the others come with one of them).
    return table.filter(pl.any_horizontal(pl.col(c).is_not_null() for c in (
        "input_dims", "sequence_number", "flops", "call_stack", "collective_name")))


def _texts(raws: list[msgspec.Raw], *, squeeze: bool = False) -> list[str | None]:
    """Raw JSON values as text (None for an absent one), without spaces if ``squeeze``. JSON
    text has no NUL byte, so one joined decode, split at NULs, gives each."""
    joined = b"\x00".join(raws)
    if squeeze:
        joined = joined.translate(None, b" ")  # (a space byte is never part of a UTF-8 sequence)
    return [t or None for t in joined.decode("utf-8", "replace").split("\x00")]


def _side_table(parts: list[pl.DataFrame], offsets: npt.NDArray[np.int64], remap: npt.NDArray[np.int64],
                schema: pl.Schema) -> pl.DataFrame:
    """Concatenate per-batch side tables, turning batch-local rows into final slice ids."""
    shifted = [p.with_columns(pl.col(Col.ID) + int(offsets[k])) for k, p in enumerate(parts) if p.height]
    if not shifted:
        return pl.DataFrame(schema=schema)
    table = pl.concat(shifted)
    ids = remap[table.get_column(Col.ID).to_numpy()]
    return table.with_columns(pl.Series(Col.ID, ids, dtype=pl.Int64)).sort(Col.ID)
