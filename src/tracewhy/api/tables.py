"""What the Python API does to every table it hands out: names as plain strings (``pl.String``;
the model keeps them categorical to save memory, and ``str.contains`` needs strings), and every
time on the trace's clock measured from the trace start, as the CLI shows times, with the raw
value beside it.

The trace start is the first event's start (``time_origin_ns``), the origin ``gaps`` and the HTML
report measure from. A time column ``X_ns`` (``ts_ns``, ``start_ns``, ``window_end_ns`` ... :
``TIME_COLUMNS``) holds the time from that origin, and ``X_raw_ns`` beside it the timestamp the
trace holds. Durations (``dur_ns``, ``window_ns`` ...) are left as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import polars as pl

from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import Trace
from tracewhy.reports.inputs import Loader, TraceSource, is_several
from tracewhy.rows import frame_to_pandas

if TYPE_CHECKING:
    from tracewhy.reports.several import SeveralReport

#: A Trace, or the path of a trace file to read first (as ``tracewhy.load`` does).
TraceLike = Trace | str | Path
R = TypeVar("R")

#: The columns that hold a point on the trace's clock (every other ``*_ns`` is a duration).
TIME_COLUMNS: Final = frozenset({
    Col.TS, "start_ns", "end_ns", "gpu_start_ns", "gpu_end_ns", "window_start_ns", "window_end_ns", "own_end_ns",
    "span_start_ns", "proj_start_ns", "host_ts_ns", "gap_start_ns", "gap_end_ns", "arrive_ns",
})
#: What a time column's raw twin ends in: ``ts_ns`` -> ``ts_raw_ns``.
RAW_SUFFIX: Final = "_raw_ns"


def raw_column(name: str) -> str:
    """The column holding ``name``'s timestamp as the trace holds it."""
    return name.removesuffix("_ns") + RAW_SUFFIX


def time_origin_ns(trace: Trace) -> int | None:
    """The trace start: the first event's start; None for a trace without slices."""
    first = trace.slices.get_column(Col.TS).min() if trace.slices.height else None
    return int(first) if first is not None else None  # type: ignore[arg-type]


def public(value: R, origin_ns: int | None = None) -> R:
    """``value`` with every table in it (in nested results, lists and tuples too) made public:
    categorical and enum columns as ``pl.String``, and with ``origin_ns``, each time column
    measured from it and its raw twin beside it. A Trace inside is left as it is."""
    if isinstance(value, pl.DataFrame):
        return _public_table(value, origin_ns)  # type: ignore[return-value]
    if isinstance(value, Trace):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {}
        for f in dataclasses.fields(value):
            old = getattr(value, f.name)
            new = public(old, origin_ns) if f.init else old
            if new is not old:
                changed[f.name] = new
        return dataclasses.replace(value, **changed) if changed else value
    if isinstance(value, dict):
        changed_items = {k: public(v, origin_ns) for k, v in value.items()}
        if any(changed_items[k] is not v for k, v in value.items()):
            return changed_items  # type: ignore[return-value]
        return value
    if isinstance(value, (list, tuple)):
        items = [public(v, origin_ns) for v in value]
        if any(new is not old for new, old in zip(items, value, strict=True)):
            return type(value)(items) if isinstance(value, list) else tuple(items)  # type: ignore[return-value]
    return value


def _public_table(table: pl.DataFrame, origin_ns: int | None) -> pl.DataFrame:
    casts = [pl.col(name).cast(t) for name, dtype in table.schema.items() if (t := _plain_dtype(dtype)) is not None]
    if casts:
        table = table.with_columns(casts)
    if origin_ns is None:
        return table
    timed = [c for c in table.columns if c in TIME_COLUMNS and raw_column(c) not in table.columns
             and table.schema[c].is_integer()]
    if not timed:
        return table
    order = [name for c in table.columns for name in ((c, raw_column(c)) if c in timed else (c,))]
    return table.with_columns(
        *(pl.col(c).alias(raw_column(c)) for c in timed),
        *((pl.col(c) - origin_ns).alias(c) for c in timed),
    ).select(order)


def _plain_dtype(dtype: object) -> pl.DataType | None:
    """String for Categorical and Enum (also inside a List); None for a dtype kept as it is."""
    if isinstance(dtype, (pl.Categorical, pl.Enum)):
        return pl.String()
    if isinstance(dtype, pl.List):
        inner = _plain_dtype(dtype.inner)
        return pl.List(inner) if inner is not None else None
    return None


class Reads:
    """A loader for one API call that keeps what the times of its result are measured from: each
    trace's start, by the path it was read from (not the trace: several traces are let go one by
    one as they are read), and the readers' warnings (which an HTML report carries)."""

    def __init__(self) -> None:
        self.origins: dict[str, int | None] = {}
        self.warnings: list[str] = []
        self.loader = Loader(read=self._read, warn=self._warn, seen=self._seen)

    def _read(self, path: str, kinds: Any) -> Trace:
        from tracewhy.readers import read_trace

        return read_trace(path, kinds=kinds)

    def _seen(self, path: str, trace: Trace) -> None:
        self.origins.setdefault(str(path), time_origin_ns(trace))
        self._warn(path, trace.meta.warnings)

    def _warn(self, source: str | Path, lines: Any) -> None:
        self.warnings += [f"{source}: {line}" for line in lines if f"{source}: {line}" not in self.warnings]

    def trace(self, source: TraceSource) -> Trace:
        """``source`` itself when it is a Trace, else the file read."""
        return self.loader.trace(source)

    def origin(self, source: object) -> int | None:
        """The start of ``source`` (a Trace, or the path of one read), else of the first trace
        read; None without one."""
        if isinstance(source, Trace):
            return time_origin_ns(source)
        if isinstance(source, (str, Path)) and str(source) in self.origins:
            return self.origins[str(source)]
        return next(iter(self.origins.values()), None)


def handed_out(source: TraceSource | None, make: Callable[[Reads], R], top: int | None = None) -> R:
    """What ``make`` computes with a fresh ``Reads``, made public: its times from the start of
    ``source`` (a Trace, or the first trace read; None: several traces, each on its own clock, so
    times are left as they are), and its first ``top`` rows (``Rows.top``) when given."""
    reads = Reads()
    made = make(reads)
    result = public(made, reads.origin(source) if source is not None else None)
    return result.top(top) if top is not None else result  # type: ignore[attr-defined]


#: Several traces (a list or tuple of them), or one (a Trace or a path; a directory of traces).
Sources = TraceLike | Sequence[TraceLike]


def as_sources(sources: Sources) -> list[TraceSource]:
    """``sources`` as the list the commands' reports take."""
    return list(sources) if isinstance(sources, (list, tuple)) else [sources]  # type: ignore[list-item]


def handed_out_several(sources: Sequence[TraceSource], make: Callable[[Reads], SeveralReport[Any]],
                       each: Callable[[Any], Any], top: int | None = None) -> SeveralReport[Any]:
    """What a command computes on several traces (``reports/several.py``), made public: each
    trace's result turned by ``each`` into what the API returns for one trace, its times from
    that trace's start, its first ``top`` rows when given."""
    reads = Reads()
    for source in sources:  # (a Trace given is not read: its start is known now)
        if isinstance(source, Trace):
            reads.origins.setdefault(source.meta.path, time_origin_ns(source))
    made = make(reads)
    inputs = []
    for per in made.inputs:
        result = public(each(per.result), reads.origins.get(per.path))
        inputs.append(dataclasses.replace(per, result=result.top(top) if top is not None else result))
    return public(dataclasses.replace(made, inputs=tuple(inputs)))


def handed_out_one_or_several(trace: Sources, one: Callable[[TraceSource, Loader], Any],
                              several: Callable[[Sequence[TraceSource], Loader], SeveralReport[Any]],
                              shown: Callable[[Any], Any], top: int | None = None) -> Any:
    """A command that takes one trace or several (a list, or a directory), as its report does:
    ``one`` or ``several`` run with a fresh ``Reads``' loader, each trace's result turned by
    ``shown`` into what the API returns for it, made public (``handed_out``, ``handed_out_several``)."""
    sources = as_sources(trace)
    if is_several(sources):
        return handed_out_several(sources, lambda reads: several(sources, reads.loader), shown, top)
    return handed_out(sources[0], lambda reads: shown(one(sources[0], reads.loader)), top)


def slices(trace: TraceLike, *kinds: Kind | str) -> pl.DataFrame:
    """The slices of the given kinds ("kernel", Kind.MEMCPY, ...; every slice when none), names as
    plain strings and times from the trace start (``ts_raw_ns``: as the trace holds them).
    ``trace.of_kind`` gives the model's own rows: categorical names, the trace's clock."""
    t = Reads().trace(trace)
    return public(t.of_kind(*kinds) if kinds else t.slices, time_origin_ns(t))


def to_pandas(value: Any) -> Any:
    """A table (a polars DataFrame) or any result (its main rows: ``result.to_pandas()``) as a
    pandas DataFrame; an ImportError naming the extra to install when pandas or pyarrow is missing."""
    if isinstance(value, pl.DataFrame):
        return frame_to_pandas(value)
    to = getattr(value, "to_pandas", None)
    if to is None:
        raise TypeError(f"to_pandas takes a polars DataFrame or a tracewhy result, not {type(value).__name__}")
    return to()
