"""The normalized Trace: columnar tables plus what the file said about how it was captured."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Final, TypeVar

import polars as pl

from tracewhy.model.schema import (
    GPU_ACTIVITY_KINDS,
    LAUNCH_KINDS,
    NVTX_ATTRS_SCHEMA,
    SYNC_ATTRS_SCHEMA,
    TABLE_SCHEMAS,
    Col,
    DeviceCol,
    Kind,
    empty,
)

#: ``TraceMeta.format`` of a torch.profiler (Kineto) trace and of an Nsight Systems export, the
#: timeline formats whose captures differ in what an analysis may rely on (Kineto: torch's own
#: record_function annotations; Nsight Systems: NVTX ranges, NVIDIA GPUs only). Their readers
#: set these, and the reader registry names the two formats by them.
KINETO_FORMAT: Final = "kineto"
NSYS_FORMAT: Final = "nsys"


@dataclass(frozen=True)
class Capture:
    """Profiler options the trace was captured with; None where the file does not say.

    ``source`` tells whether the flags come from the file's header (PyTorch >= 2.1 writes
    them) or were inferred from the events (older files).
    """

    record_shapes: bool | None = None
    profile_memory: bool | None = None
    with_stack: bool | None = None
    with_flops: bool | None = None
    with_modules: bool | None = None
    source: str = "unknown"


@dataclass(frozen=True)
class Truncation:
    """What was lost when a file ended mid-event (crashed jobs write such traces)."""

    bytes_total: int
    bytes_recovered: int
    events_recovered: int
    events_lost_estimate: int  # 0: the events array closed; only fields after it were cut
    #: The gzip stream itself ends early: the bytes after the cut are not known, so neither
    #: is how many events were lost.
    stream_cut: bool = False


@dataclass(frozen=True)
class TraceMeta:
    """Everything about a trace that is not a table."""

    path: str
    format: str
    schema_version: int | None = None
    display_time_unit: str | None = None
    base_time_ns: int | None = None
    versions: dict[str, str] = field(default_factory=dict)
    capture: Capture = field(default_factory=Capture)
    distributed: dict[str, Any] = field(default_factory=dict)
    profiler_spans_ns: tuple[tuple[int, int], ...] = ()
    event_counts: dict[str, int] = field(default_factory=dict)
    unfinished_events: int = 0
    truncation: Truncation | None = None
    warnings: tuple[str, ...] = ()
    #: How the profiler was run, as the file records it (nsys: META_DATA_CAPTURE without the
    #: environment, the session start and any windowing of a derived file); empty for Kineto.
    capture_settings: dict[str, str] = field(default_factory=dict)
    #: None for a whole trace. A partial read (``read_trace(path, kinds=...)``) lists the slice
    #: kinds it read, sorted: other kinds' rows, their side tables and the links to them (a
    #: kernel's ``launch_id`` without runtime calls) are absent, not zero. Never cached.
    kinds_read: tuple[str, ...] | None = None
    #: Tables (nsys) the reader had to skip whole: the events they hold are missing, not zero.
    skipped_tables: tuple[str, ...] = ()
    #: The accelerator backend whose device work the trace holds ("CUDA", "ROCm", "XPU", "MTIA",
    #: "HPU", "PrivateUse1", ...), as its event categories name it; None when not known or none.
    accelerator: str | None = None
    #: Kineto: start times were epoch-based microseconds with fractions, which a float64 holds
    #: only to this many ns (250 at 1.7e15 us): they are quantised to it. 0: exact.
    ts_step_ns: int = 0
    #: Slices the reader found but had to leave out (a start time it could not read: none, NaN,
    #: beyond int64 ns; a duration longer than the capture), by kind: missing, not zero, from
    #: every figure that counts that kind (``check`` fails on them as on a cut file).
    dropped_events: dict[str, int] = field(default_factory=dict)

    @property
    def missing_events(self) -> tuple[str, ...]:
        """Why the file holds fewer events than the run recorded, one reason each (empty when
        it holds them all): a cut file, events still open when the profiler stopped, tables
        the reader had to skip. Notes on a whole file (an odd clock) are not among them."""
        out: list[str] = []
        t = self.truncation
        if t is not None and (t.events_lost_estimate > 0 or t.stream_cut):
            out.append("the file is cut off: events after the cut are missing")
        if self.unfinished_events:
            out.append(f"{self.unfinished_events} events were still open when the profiler stopped")
        out.extend(f"table {name} could not be read" for name in self.skipped_tables)
        return tuple(out)

    @property
    def rank(self) -> int | None:
        value = self.distributed.get("rank")
        return value if isinstance(value, int) else None

    @property
    def world_size(self) -> int | None:
        value = self.distributed.get("world_size")
        return value if isinstance(value, int) else None


class ModelError(AssertionError):
    """A Trace broke one of its invariants: a bug in a reader, never the user's fault."""


class PartialTraceError(ModelError):
    """An analysis asked a partial Trace for slices it was read without: a bug in the caller,
    who must read the trace whole or with the kinds that analysis needs."""


def as_kind(value: Kind | str) -> Kind:
    """The Kind a user means by ``value`` ("kernel" or Kind.KERNEL); a ValueError naming the
    valid kinds for anything else, so a typo is told apart from a kind the trace lacks."""
    try:
        return Kind(value)
    except ValueError:
        raise ValueError(f"unknown slice kind {value!r}; valid kinds: {', '.join(k.value for k in Kind)}") from None


T = TypeVar("T")

#: ``Trace.of_kind`` keeps results of at most 1/this of the slices ...
_KEEP_OF_KIND_SHARE = 8
#: ... and any result of a table of at most this many slices (a copy of at most ~12 MB): the
#: GPU activity of a 2.3 MB nsys export is 16% of its slices, and ``diagnose`` filtered it 12
#: times (7 for its kernels), each ~0.5 ms.
_KEEP_OF_KIND_ROWS = 100_000


@dataclass(frozen=True)
class Trace:
    """One profiled process (or one nsys capture) in normalized tables.

    ``slices`` holds every timed event; side tables hold attributes keyed by slice ``id``.
    A partial Trace (``is_partial``) holds only ``meta.kinds_read``: ``of_kind`` refuses the
    other kinds, and analyses reading ``slices`` directly call ``require_whole`` first.
    """

    meta: TraceMeta
    slices: pl.DataFrame
    kernel_attrs: pl.DataFrame
    copy_attrs: pl.DataFrame
    op_attrs: pl.DataFrame
    memory: pl.DataFrame
    flows: pl.DataFrame
    threads: pl.DataFrame
    devices: pl.DataFrame
    #: Nsight Systems NVTX attributes; readers of formats without NVTX leave it empty.
    nvtx_attrs: pl.DataFrame = field(default_factory=lambda: empty(NVTX_ATTRS_SCHEMA))
    #: What synchronization slices waited on (Kineto cuda_sync args); empty where not written.
    sync_attrs: pl.DataFrame = field(default_factory=lambda: empty(SYNC_ATTRS_SCHEMA))

    def table(self, name: str) -> pl.DataFrame:
        value = getattr(self, name)
        assert isinstance(value, pl.DataFrame)
        return value

    @property
    def span_ns(self) -> int:
        """From the first slice's start to the last one's end: what the file holds (0 when empty)."""
        if self.slices.height == 0:
            return 0
        span = self.slices.select((pl.col(Col.TS) + pl.col(Col.DUR)).max() - pl.col(Col.TS).min()).item()
        return int(span or 0)

    @property
    def is_partial(self) -> bool:
        """True when only some slice kinds were read (``meta.kinds_read``)."""
        return self.meta.kinds_read is not None

    def require(self, *kinds: Kind | str) -> None:
        """Raise PartialTraceError unless every given kind was read (always true when whole)."""
        wanted = [as_kind(k) for k in kinds]
        read = self.meta.kinds_read
        if read is None:
            return
        missing = sorted(k.value for k in wanted if k.value not in read)
        if missing:
            raise PartialTraceError(f"{self.meta.path}: read with only {', '.join(read) or 'no'} slices; "
                                    f"this needs {', '.join(missing)} too")

    def require_whole(self) -> None:
        """Raise PartialTraceError on a partial Trace: every analysis that reads ``slices``
        directly (rather than through ``of_kind``) calls this first."""
        read = self.meta.kinds_read
        if read is not None:
            raise PartialTraceError(f"{self.meta.path}: read with only {', '.join(read) or 'no'} slices; "
                                    "this analysis needs the whole trace")

    def kept(self, name: str, compute: Callable[[], T]) -> T:
        """``compute()`` once per Trace, kept under ``name``: what an analysis derives from the
        trace alone and several analyses ask for (a Trace never changes; one made from another
        with ``dataclasses.replace`` starts with nothing kept)."""
        if name not in self.__dict__:
            self.__dict__[name] = compute()
        value: T = self.__dict__[name]
        return value

    def of_kind(self, *kinds: Kind | str) -> pl.DataFrame:
        """The slices of the given kinds; on a partial Trace, only kinds that were read.

        A result of at most an eighth of the rows is kept for the next caller: ``diagnose``
        asks for the GPU activity 13 times and the launch calls 7 times (0.2 s of filtering
        on a 1 GB trace). A larger one (the host slices) is not, unless the table is small
        (``_KEEP_OF_KIND_ROWS``): it would hold a copy of most of the table for as long as the
        Trace. Tables are never changed in place.
        """
        wanted = tuple(as_kind(k) for k in kinds)
        self.require(*wanted)
        key = frozenset(k.value for k in wanted)
        kept: dict[frozenset[str], pl.DataFrame] = self.__dict__.setdefault("_of_kind", {})
        found = kept.get(key)
        if found is None:
            found = self.slices.filter(pl.col(Col.KIND).is_in(sorted(key)))
            if found.height * _KEEP_OF_KIND_SHARE <= self.slices.height or self.slices.height <= _KEEP_OF_KIND_ROWS:
                kept[key] = found
        return found

    def count(self, *kinds: Kind | str) -> int:
        """How many slices are of these kinds: ``of_kind(...).height`` without copying the rows
        (a 600 MB nsys export's 1.9 M launch calls, asked for only to see whether there are any,
        were a 0.23 GB copy at ``diagnose``'s peak)."""
        self.require(*kinds)
        return int(self.slices.select(pl.col(Col.KIND).is_in([as_kind(k).value for k in kinds]).sum()).item())

    def kind_columns(self, kinds: Sequence[Kind | str], *columns: str | pl.Expr) -> pl.DataFrame:
        """``of_kind(*kinds).select(*columns)`` without first copying every column of the
        matching rows (4.8 M annotations of 15 columns are 0.6 GB on a large nsys export)."""
        wanted = tuple(as_kind(k) for k in kinds)
        self.require(*wanted)
        return self.slices_where(pl.col(Col.KIND).is_in([k.value for k in wanted]), *columns)

    def slices_where(self, predicate: pl.Expr, *columns: str | pl.Expr) -> pl.DataFrame:
        """``slices.filter(predicate).select(*columns)``, rows filtered before any column is
        copied, each column one contiguous chunk. (polars 2's default engine returns a filter of
        8 M rows in 80 chunks: every ``to_numpy`` of them copies, and the first operation that
        meets a one-chunk column copies the whole frame, 0.2 GB at diagnose's peak.) On a
        partial Trace the caller checks the kinds it filters on (``require``)."""
        return self.slices.lazy().filter(predicate).select(*columns).collect(engine="in-memory")

    def __repr__(self) -> str:
        """A few lines about the trace (file, format, slices by kind, devices, span, whether it is
        whole): the generated repr printed every table in full."""
        m = self.meta
        counts = self.slices.group_by(Col.KIND).len("n").sort(["n", Col.KIND], descending=[True, False])
        by_kind = ", ".join(f"{kind} {n:,}" for kind, n in counts.iter_rows())
        names = self.devices.group_by(DeviceCol.NAME).len("n").sort(["n", DeviceCol.NAME], descending=[True, False])
        devices = ", ".join(f"{n} × {name}" if n > 1 else str(name) for name, n in names.iter_rows())
        whole = "partial" if self.is_partial or m.missing_events else "complete"
        lines = [
            f"Trace {PurePath(m.path).name} ({m.format}, {whole}): {self.slices.height:,} slices over "
            f"{self.span_ns / 1e6:,.3f} ms",
            f"  slices by kind: {by_kind or 'none'}",
            f"  devices: {devices or 'none described'}",
        ]
        if m.kinds_read is not None:
            lines.append(f"  partial read: only {', '.join(m.kinds_read) or 'no'} slices")
        if m.missing_events:
            lines.append(f"  incomplete: {'; '.join(m.missing_events)}")
        return "\n".join(lines)

    def check(self) -> None:
        """Verify the invariants every analysis relies on; raise ModelError on the first break."""
        for name, schema in TABLE_SCHEMAS.items():
            got = self.table(name).schema
            if dict(got) != dict(schema):
                diff = {k: (got.get(k), v) for k, v in schema.items() if got.get(k) != v}
                extra = sorted(set(got) - set(schema))
                raise ModelError(f"table {name}: schema mismatch {diff} extra={extra}")
        s = self.slices
        n = s.height
        if n == 0:
            return
        self._check_slices(s, n)
        for name in ("kernel_attrs", "copy_attrs", "op_attrs", "nvtx_attrs", "sync_attrs"):
            ref = self.table(name).get_column(Col.ID)
            if ref.len() and (ref.min() < 0 or ref.max() >= n or ref.n_unique() != ref.len()):  # type: ignore[operator]
                raise ModelError(f"{name}.id must be unique slice ids")

    @staticmethod
    def _check_slices(s: pl.DataFrame, n: int) -> None:
        """The slices table's invariants, as one query that polars runs on every core: 0.02 s
        on 1.9M slices where one filter per rule took 0.07 s (it runs on every read, cache hit
        included). A link out of range is reported before the rules that follow it."""
        kind, ts = pl.col(Col.KIND), pl.col(Col.TS)
        gpu = kind.is_in([k.value for k in GPU_ACTIVITY_KINDS])
        linked = gpu & pl.col(Col.LAUNCH).is_not_null()

        def out_of_range(c: str) -> pl.Expr:
            return (pl.col(c).is_not_null() & ~pl.col(c).is_between(0, n - 1)).sum()

        def target(c: str, linked_rows: pl.Expr) -> pl.Expr:
            return pl.col(c).filter(linked_rows).clip(0, n - 1)  # clipped: out of range is reported first

        r = s.select(
            ids_ok=(pl.col(Col.ID) == pl.int_range(pl.len(), dtype=pl.Int64)).all(),
            negative=(pl.col(Col.DUR) < 0).sum(),
            nulls=ts.null_count() + pl.col(Col.DUR).null_count(),
            gpu_no_device=(gpu & pl.col(Col.DEVICE).is_null()).sum(),
            bad_launch=out_of_range(Col.LAUNCH), bad_op=out_of_range(Col.OP), bad_parent=out_of_range(Col.PARENT),
            launch_kind_ok=kind.gather(target(Col.LAUNCH, linked)).is_in([k.value for k in LAUNCH_KINDS]).all(),
            launch_corr_ok=pl.col(Col.CORRELATION).gather(target(Col.LAUNCH, linked))
            .eq_missing(pl.col(Col.CORRELATION).filter(linked)).all(),
            op_kind_ok=(kind.gather(target(Col.OP, pl.col(Col.OP).is_not_null())) == Kind.CPU_OP.value).all(),
            parent_late=(
                ts.gather(target(Col.PARENT, pl.col(Col.PARENT).is_not_null()))
                > ts.filter(pl.col(Col.PARENT).is_not_null())
            ).any(),
        ).row(0, named=True)
        if not r["ids_ok"]:
            raise ModelError("slices.id must equal the row number")
        if r["negative"]:
            raise ModelError(f"{r['negative']} slices have negative dur_ns")
        if r["nulls"]:
            raise ModelError("ts_ns and dur_ns must never be null")
        if r["gpu_no_device"]:
            raise ModelError("every GPU activity needs a device")
        for col, count in ((Col.LAUNCH, r["bad_launch"]), (Col.OP, r["bad_op"]), (Col.PARENT, r["bad_parent"])):
            if count:
                raise ModelError(f"{count} slices have {col} outside the slices table")
        if not r["launch_kind_ok"]:
            raise ModelError("launch_id must point at a runtime or driver call")
        if not r["launch_corr_ok"]:
            raise ModelError("a GPU slice and its launch must share the correlation id")
        if not r["op_kind_ok"]:
            raise ModelError("op_id must point at a CPU op")
        if r["parent_late"]:
            raise ModelError("a host slice starts before its parent")
