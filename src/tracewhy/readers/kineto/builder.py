"""Builds a Kineto trace's columns batch by batch: each batch of decoded events becomes columns
at once (list comprehensions per field, no per-event method calls), and ``Builder.finish``
joins them into the Trace. A helper process (``parallel``) builds its batches with one too.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import msgspec
import numpy as np

# polars passes every numpy array through np.ma.getmask: numpy.ma is loaded with the reader's
# modules, not 16 ms into its first read (a run served from the cache never imports it).
import numpy.ma
import numpy.typing as npt
import polars as pl

from tracewhy.model.schema import (
    KIND_CODE,
    Col,
    Kind,
)
from tracewhy.model.trace import Trace, TraceMeta, Truncation
from tracewhy.readers.kineto.categories import category_kind, not_exported
from tracewhy.readers.kineto.columns import (
    EMPTY_COPY_ATTRS,
    EMPTY_KERNEL_ATTRS,
    EMPTY_OP_ATTRS,
    EMPTY_SYNC_ATTRS,
    NULL_ID,
    Ids,
    as_int,
    code_set,
    copy_attrs_table,
    device_event_kinds,
    float_array,
    int_array,
    kernel_attrs_table,
    op_attrs_table,
    sync_attrs_table,
    to_int,
    us_to_ns,
)
from tracewhy.readers.kineto.document import Body, decode_body
from tracewhy.readers.kineto.events import (
    FLOWS,
    INSTANTS,
    METADATA,
    SLICES,
    Event,
    GpuArgs,
    LinkArgs,
    MemoryArgs,
    MetaArgs,
    OpArgs,
    by_phase,
    decode_args,
    decode_args_marked,
)
from tracewhy.readers.kineto.header import device_table
from tracewhy.readers.kineto.meta import Tally, trace_meta
from tracewhy.readers.kineto.side_events import FLOW_KIND_CODE, flow_frame, memory_frame
from tracewhy.readers.kineto.tables import Batch, join_batches, join_events

# Launch arrows: "ac2g" since PyTorch 1.11; "async" (1.8-1.9), "async_gpu" (2022 builds) and
# "async_cpu_to_gpu" (Meta-internal 2022) before that.
_FLOW_KIND = {"ac2g": "correlation", "async": "correlation", "async_gpu": "correlation",
              "async_cpu_to_gpu": "correlation", "fwdbwd": "fwdbwd"}
#: A batch's kinds are a uint8 array of their codes (KIND_CODE); this turns codes back into kinds.
_KINDS: tuple[str, ...] = tuple(KIND_CODE)
_SPAN = 255  # cat "Trace": the profiler's own capture window, not a slice
# cat "cpu_instant_event" written as a slice: torch's Python exporter (export_chrome_trace(...,
# use_python_export=True), torch 2.13) writes every activity as "X", the [memory] instants
# included, with a meaningless dur and "finished": false. They are instants, read as such.
_INSTANT = 254


#: Device activity: args decoded as GpuArgs. Ops and annotations: OpArgs. The rest: LinkArgs.
_GPU_CODES = code_set(Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_ANNOTATION, Kind.GPU_SYNC,
                       Kind.PROFILER_RANGE)
_GPU_KIND_NAMES = frozenset(k.value for k in (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET))
_OP_CODES = code_set(Kind.CPU_OP, Kind.ANNOTATION)
_I32_MIN, _I32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)
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
_SYNC_CODE = KIND_CODE[Kind.GPU_SYNC.value]
#: From this many events on, ``finish`` joins the memory events, flows and threads beside the slices.
_APART_ROWS = 100_000


@dataclass
class Builder:
    """A file's events in columns, batch by batch (``add``, ``add_json``, or ``merge`` of the
    builder of a later part), until ``finish`` joins them into the Trace."""

    path: Path
    problems: dict[str, int] = field(default_factory=dict)
    batches: list[Batch] = field(default_factory=list)
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
    #: Slices left out for an unreadable start time, by kind (TraceMeta.dropped_events).
    dropped: dict[str, int] = field(default_factory=dict)

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

    def merge(self, part: Builder) -> None:
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
        for key, n in part.dropped.items():
            self.dropped[key] = self.dropped.get(key, 0) + n
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
        groups = by_phase(events)
        xs = groups.pop(SLICES)
        if len(xs) < len(events):
            self._flows(groups.pop(FLOWS))
            self._instants(groups.pop(INSTANTS))
            self._metadata(groups.pop(METADATA))
            for phase, ignored in groups.items():  # (each a phase no group above takes)
                self._count(f"ignored phase {phase!r}", len(ignored))  # (tracewhy's own tracks: no problem)
                self._problem(f"phase {phase!r} is not one this reader reads; ignored", not_exported(ignored))
        if xs:
            self._slices(xs)

    def _flows(self, evs: list[Event]) -> None:
        ts = float_array([e.ts for e in evs])
        usable = np.abs(ts) < _US_MAX
        if not usable.all():
            self._problem("flow event without usable ts skipped", len(evs) - int(usable.sum()))
            evs, ts = [evs[i] for i in np.flatnonzero(usable).tolist()], ts[usable]
        if not evs:
            return
        cats = [e.cat for e in evs]
        by_cat = Counter(cats)
        for cat, n in by_cat.items():
            self._count(f"flow {cat}", n)
        kinds = {cat: FLOW_KIND_CODE[_FLOW_KIND.get(cat or "", "other")] for cat in by_cat}
        codes = np.fromiter(map(kinds.__getitem__, cats), dtype=np.uint8, count=len(cats))
        self.flows.append(flow_frame(evs, ts, codes))

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
        # A kernel or copy written as an instant has no duration: it is not GPU work, and a file
        # of them would otherwise read as "0 kernels" without a word.
        self._problem("GPU activity written as an instant (ph 'i', no duration): not read as GPU work",
                      sum(n for cat, n in Counter([e.cat for e in evs]).items()
                          if cat and category_kind(cat.lower()).value in _GPU_KIND_NAMES))
        # Every other instant counts as one, a [memory] event without usable args included.
        self._count("instant", len(evs) - len(mem) - no_ts)
        if not mem:
            return
        self._count("memory", len(mem))
        self.memory.append(memory_frame(mem, args))

    def _metadata(self, evs: list[Event]) -> None:
        self._count("metadata", len(evs))
        for e, a in zip(evs, decode_args([e.args for e in evs], MetaArgs, self.problems), strict=True):
            if a is None or a.name is None:
                continue
            if e.name == "process_name":
                self.thread_rows.append((to_int(e.pid), None, a.name))
            elif e.name == "thread_name":
                self.thread_rows.append((to_int(e.pid), to_int(e.tid), a.name))

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
        ts = float_array([e.ts for e in evs])
        bad_ts = ~(np.abs(ts) < _US_MAX)  # (NaN: none was written)
        if bad_ts.any():
            self._problem("slice without ts skipped", int(np.isnan(ts).sum()))
            self._problem("slice with ts beyond int64 nanoseconds skipped", int((bad_ts & ~np.isnan(ts)).sum()))
            bad_codes, bad_counts = np.unique(codes[bad_ts], return_counts=True)
            for code, count in zip(bad_codes.tolist(), bad_counts.tolist(), strict=True):
                kind = _KINDS[code]
                self.dropped[kind] = self.dropped.get(kind, 0) + count
            evs, codes, ts = [evs[i] for i in np.flatnonzero(~bad_ts).tolist()], codes[~bad_ts], ts[~bad_ts]
        if not evs:
            return
        big = np.abs(ts) >= _EXACT_US
        if big.any():
            far = ts[big]
            fractional = far[far != np.floor(far)]
            if fractional.size:
                self.quantised_us = max(self.quantised_us, float(np.abs(fractional).max()))
        dur = float_array([e.dur for e in evs])
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
        pid = int_array([e.pid for e in evs])
        tid = int_array([e.tid for e in evs])
        ids = Ids(n)
        kernel_attrs, copy_attrs, op_attrs = EMPTY_KERNEL_ATTRS, EMPTY_COPY_ATTRS, EMPTY_OP_ATTRS
        sync_attrs = EMPTY_SYNC_ATTRS
        on_gpu = _in(codes, _GPU_CODES)
        device = np.full(n, NULL_ID, dtype=np.int64)
        stream = np.full(n, NULL_ID, dtype=np.int64)
        device[on_gpu], stream[on_gpu] = pid[on_gpu], tid[on_gpu]
        rows = np.flatnonzero(on_gpu)
        if rows.size:
            gpu = cast(list[GpuArgs | None], self._decode(evs, rows, GpuArgs))
            for kind, n in device_event_kinds(rows, codes, gpu).items():  # (counted as kernels above)
                self._count(Kind.KERNEL.value, -n)
                self._count(kind, n)
            syncs = rows[codes[rows] == _SYNC_CODE]
            if syncs.size:
                sync_attrs = sync_attrs_table(evs, syncs)
            ids.fill(rows, gpu)
            # GPU events: pid is the device and tid the stream when args lack them.
            device[rows] = int_array([d if a is not None and (d := a.device) is not None else p
                                      for a, p in zip(gpu, pid[rows].tolist(), strict=True)])
            stream[rows] = int_array([(NULL_ID if (v := as_int(a.stream)) is None else v)
                                      if a is not None and a.stream is not None else t
                                      for a, t in zip(gpu, tid[rows].tolist(), strict=True)])
            odd = (device[rows] < _I32_MIN) | (device[rows] > _I32_MAX)  # a corrupt file's
            if odd.any():
                self._problem("device id beyond int32 taken as -1", int(odd.sum()))
                device[rows[odd]] = -1
            kernel_attrs = kernel_attrs_table(rows, codes, gpu)
            copy_attrs = copy_attrs_table(rows, codes, gpu, evs, self.copy_cache)
        on_op = _in(codes, _OP_CODES)
        rows = np.flatnonzero(on_op)
        if rows.size:
            ops = cast(list[OpArgs | None], self._decode(evs, rows, OpArgs))
            ids.fill(rows, ops)
            op_attrs = op_attrs_table(rows, ops)
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
        })  # NULL_ID (not known) becomes null once all batches are joined: one pass, not one a batch
        self.batches.append(Batch(frame=frame, kernel_attrs=kernel_attrs, copy_attrs=copy_attrs, op_attrs=op_attrs,
                                   sync_attrs=sync_attrs))

    def _decode(self, evs: list[Event], rows: npt.NDArray[np.intp], shape: type[LinkArgs]) -> list[LinkArgs | None]:
        """The args of the events at ``rows``, as ``shape``; open slices are counted."""
        args, open_marked = decode_args_marked([evs[i].args for i in rows.tolist()], shape, self.problems, _FINISHED)
        if open_marked:
            self.unfinished += sum(1 for a in args if a is not None and a.finished is False)
        return args

    def _legacy_annotations(self, evs: list[Event], codes: npt.NDArray[np.uint8]) -> None:
        """Re-kind, in place, the record_function scopes that PyTorch < 1.10 wrote as operators."""
        ops = np.flatnonzero(codes == KIND_CODE[Kind.CPU_OP.value]).tolist()
        cache = self.legacy_cache
        for name in {evs[i].name for i in ops} - cache.keys():
            cache[name] = _LEGACY_ANNOTATION.match(name) is not None
        scopes = [i for i in ops if cache[evs[i].name]]
        codes[scopes] = KIND_CODE[Kind.ANNOTATION.value]

    def finish(self, header: dict[str, msgspec.Raw], truncation: Truncation | None) -> Trace:
        """The Trace of every batch taken, with the file's header and how it was cut (if it was).
        From ``_APART_ROWS`` events on, the memory events, flows and threads are joined on a
        second thread beside the slices (polars lets the GIL go while it joins and sorts). The
        metadata is made while the slices' nesting is (``join_batches``): it reads the launches,
        kinds, names and times, never the nesting's columns."""
        devices = device_table(header, self.problems)  # (before the warnings are written)
        tally = Tally(problems=self.problems, counts=self.counts, categories=self.kind_cache.keys(),
                      spans=tuple(self.spans), unfinished=self.unfinished, quantised_us=self.quantised_us,
                      saw_python=self.saw_python, dropped=self.dropped)
        metas: list[TraceMeta] = []
        with contextlib.ExitStack() as stack:
            events = join_events(self.memory, self.flows, self.thread_rows,
                                 stack if self.rows_seen >= _APART_ROWS else None)
            slices, side = join_batches(self.batches, lambda launched, side: metas.append(trace_meta(
                self.path, header, truncation, tally, side["op_attrs"], events.result()[0], launched)))
            memory, flows, threads = events.result()
        return Trace(meta=metas[0], slices=slices, memory=memory, flows=flows, threads=threads,
                     devices=devices, **side)


def _in(codes: npt.NDArray[np.uint8], among: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """Whether each kind code is one of those ``among`` marks (a table indexed by code)."""
    return among[codes]
