"""Reader for Nsight Systems exports: ``nsys export --type sqlite`` files (schema 2.9, nsys
2022.2, to 3.25, nsys 2026.2), plain or gzipped, and ``.nsys-rep``/``.qdrep`` reports through
``nsys`` itself.

Timestamps stay as the export wrote them: integer ns on the capture's clock (the target's
monotonic clock unless exported with ``--ts-normalize``), so they can be compared with
``nsys stats`` output line by line. ``meta.profiler_spans_ns`` is the session
(ANALYSIS_DETAILS start and stop) and ``meta.base_time_ns`` the UTC epoch of timestamp 0.
GPU rows carry the process id of the launching process in ``pid`` (their ``tid`` is null) and
are linked to their CUDA API call by correlation id *within that process*: correlation ids
repeat across the processes of one capture.
"""

from __future__ import annotations

import gzip
import sqlite3
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import polars as pl

from tracewhy.errors import TraceError
from tracewhy.model.linking import link_slices
from tracewhy.model.schema import (
    COPY_ATTRS_SCHEMA,
    FLOWS_SCHEMA,
    GPU_ACTIVITY_KINDS,
    KERNEL_ATTRS_SCHEMA,
    KIND_DTYPE,
    MEMORY_SCHEMA,
    NVTX_ATTRS_SCHEMA,
    OP_ATTRS_SCHEMA,
    SLICES_SCHEMA,
    Col,
    Kind,
    NCol,
)
from tracewhy.model.trace import Capture, Trace, TraceMeta
from tracewhy.readers import nsys_meta as meta
from tracewhy.readers.nsys_arrow import ArrowFetch, open_arrow
from tracewhy.readers.nsys_db import ColumnTypeError, Db, Strings
from tracewhy.readers.nsys_export import export_report
from tracewhy.readers.nsys_open import open_export
from tracewhy.readers.nsys_repair import plausible_duration_ns, repair_keys
from tracewhy.readers.nsys_tables import (
    KEY,
    empty_part,
    kernels_part,
    memcpy_part,
    memset_part,
    nvtx_part,
    osrt_part,
    overhead_part,
    runtime_part,
    sync_part,
)
from tracewhy.readers.source import DEFAULT_MAX_INFLATED_BYTES, GZIP_MAGIC, SQLITE_MAGIC

Progress = Callable[[int, int], None]

#: The first bytes of a raw capture stream, which only NVIDIA's QdstrmImporter converts.
QDSTRM_MAGIC: Final = b"U3w[END]NVIDIA Nsight Systems Stream"
#: The report container has no documented magic; its suffix is the only sign we can trust.
REPORT_SUFFIXES: Final = (".nsys-rep", ".qdrep")
_CHUNK = 16 * 1024 * 1024
_STEPS = 10


def sniff_nsys(path: Path) -> str | None:
    """'sqlite', 'sqlite.gz', 'qdstrm' or 'report' for Nsight Systems input, else None."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head.startswith(GZIP_MAGIC):
                f.seek(0)
                with gzip.open(f, "rb") as g:
                    inner = g.read(len(SQLITE_MAGIC))
                return "sqlite.gz" if inner == SQLITE_MAGIC else None
    except (OSError, EOFError, zlib.error):
        return None
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    if head.startswith(QDSTRM_MAGIC):
        return "qdstrm"
    if path.name.endswith(REPORT_SUFFIXES) and head[:1] not in (b"{", b"["):
        return "report"
    return None


def read_nsys(
    path: str | Path,
    *,
    progress: Progress | None = None,
    nsys_binary: str | None = None,
    cache_dir: Path | None = None,
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
    kinds: Collection[Kind] | None = None,
) -> Trace:
    """Read an Nsight Systems export or report into a Trace; the input is only ever read.

    ``kinds``: read only the tables holding these slice kinds (plus strings, devices and
    names), the way ``nsys stats -r cuda_gpu_kern_sum`` reads one table; see ``select_tables``.
    The Trace then says what it holds in ``meta.kinds_read``. None reads everything.
    """
    path = Path(path)
    kind = sniff_nsys(path)
    selection = select_tables(kinds)
    if kind == "sqlite":
        return _read_export(path, path, progress, selection)
    if kind == "sqlite.gz":
        with tempfile.TemporaryDirectory(prefix="tracewhy-nsys-") as tmp:
            plain = Path(tmp) / "export.sqlite"
            _inflate_to(path, plain, max_inflated_bytes)
            return _read_export(plain, path, progress, selection)
    if kind == "report":
        exported = export_report(path, nsys=nsys_binary, cache_dir=cache_dir)
        try:
            return _read_export(exported, path, progress, selection)
        except TraceError:
            # nsys can exit 0 and still write an unusable file; kept, it would fail every later
            # read without another export.
            exported.unlink(missing_ok=True)
            raise
    if kind == "qdstrm":
        raise TraceError(path, "a raw Nsight Systems capture stream (.qdstrm): convert it to a "
                         ".nsys-rep with NVIDIA's QdstrmImporter, then export it with "
                         "`nsys export --type sqlite`")
    raise TraceError(path, "not an Nsight Systems export (expected SQLite from "
                     "`nsys export --type sqlite`, gzipped or not, or a .nsys-rep report)")


#: Tables that hold events (the rest hold strings, enums and metadata): one skipped means the
#: Trace lacks events (``TraceMeta.missing_events``), which ``check`` fails as partial-trace.
_EVENT_TABLE_PREFIXES: Final = ("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS", "OSRT_API", "PROFILER_OVERHEAD")
#: The slice kinds each group of export tables yields, in reading order. A group is read whole
#: (runtime and driver calls share one table).
_TABLE_KINDS: Final[dict[str, tuple[Kind, ...]]] = {
    "runtime": (Kind.RUNTIME, Kind.DRIVER),
    "kernel": (Kind.KERNEL,),
    "memcpy": (Kind.MEMCPY,),
    "memset": (Kind.MEMSET,),
    "sync": (Kind.GPU_SYNC,),
    "nvtx": (Kind.ANNOTATION,),
    "osrt": (Kind.OTHER,),
    "overhead": (Kind.OVERHEAD,),
}
#: Groups another group cannot be read without: sync records are named by the API call that
#: made them.
_GROUP_NEEDS: Final = {"sync": "runtime"}


@dataclass(frozen=True)
class Selection:
    """What a partial read reads: table groups, and the slice kinds the Trace will hold (every
    kind asked for, as nsys has no CPU ops, say, so a whole read would hold none either, plus
    every kind those tables yield)."""

    groups: frozenset[str]
    kinds_read: tuple[str, ...]


def select_tables(kinds: Collection[Kind] | None) -> Selection | None:
    """The tables a partial read of ``kinds`` reads; None (read all) for None."""
    if kinds is None:
        return None
    wanted = {Kind(k) for k in kinds}
    groups = {g for g, yields in _TABLE_KINDS.items() if wanted & set(yields)}
    groups |= {_GROUP_NEEDS[g] for g in groups if g in _GROUP_NEEDS}
    held = {k.value for k in wanted} | {k.value for g in groups for k in _TABLE_KINDS[g]}
    return Selection(frozenset(groups), tuple(sorted(held)))


def _inflate_to(src: Path, dst: Path, limit: int) -> None:
    written = 0
    try:
        with gzip.open(src, "rb") as g, open(dst, "wb") as out:
            while chunk := g.read(_CHUNK):
                written += len(chunk)
                if written > limit:
                    raise TraceError(src, f"inflates to more than {limit} bytes; refusing "
                                     "(raise max_inflated_bytes if real)")
                out.write(chunk)
    except (OSError, EOFError, zlib.error) as e:
        raise TraceError(src, f"corrupt or truncated gzip data ({e})") from None


def _read_export(file: Path, shown: Path, progress: Progress | None, selection: Selection | None) -> Trace:
    try:
        with open_export(file, shown) as (conn, notes), _arrow_beside(file, notes) as arrow:
            try:
                return _build(Db(conn, problems=Counter(notes), arrow=arrow), shown, progress, selection)
            except sqlite3.OperationalError as e:
                if "decode" not in str(e):
                    raise
            # Strings come from the traced program (NVTX text, thread names) and need not be
            # UTF-8: the 2022.2 pipit export holds a thread name with a stray byte. Decoding every
            # string leniently costs a Python call per string, so only such files pay for it.
            conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
            return _build(Db(conn, problems=Counter(notes)), shown, progress, selection)
    except sqlite3.DatabaseError as e:
        raise TraceError(shown, f"unreadable SQLite export ({_one_line(str(e))})") from None
    except UnicodeDecodeError as e:
        # SQLite's own error message quotes the schema, which a corrupt file fills with any bytes;
        # Python's sqlite3 then fails to decode the message instead of raising it.
        raw = e.object if isinstance(e.object, bytes) else str(e).encode()
        detail = _one_line(raw.decode("utf-8", "backslashreplace"))
        raise TraceError(shown, f"unreadable SQLite export ({detail})") from None
    except (ColumnTypeError, pl.exceptions.PolarsError) as e:  # a column holding values of the wrong type
        detail = _one_line(str(e).split("\n\n")[0])
        raise TraceError(shown, f"unreadable SQLite export: a column holds values of the wrong type "
                         f"({detail})") from None


@contextmanager
def _arrow_beside(file: Path, notes: list[str]) -> Iterator[ArrowFetch | None]:
    """The optional Arrow fetch on the same file, when it was opened as it lies (``notes`` say
    when a private copy with its log was opened instead; the copy is not this file)."""
    arrow = None if notes else open_arrow(file)
    try:
        yield arrow
    finally:
        if arrow is not None:
            arrow.close()


def _one_line(text: str) -> str:
    return " ".join(text.split())[:200]


def _build(db: Db, shown: Path, progress: Progress | None, selection: Selection | None) -> Trace:
    export = meta.export_metadata(db)
    if not export and not any(t.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_")) for t in db.tables | db.views):
        raise TraceError(shown, "an SQLite database, but not an Nsight Systems export "
                         "(no META_DATA_EXPORT table and no CUDA or NVTX tables)")
    step = 0

    def tick() -> None:
        nonlocal step
        step += 1
        if progress is not None:
            progress(step, _STEPS)

    groups = None if selection is None else selection.groups
    db.max_dur_ns = plausible_duration_ns(meta.session_span(db))

    def wants(group: str) -> bool:
        return groups is None or group in groups

    strs = Strings(db, whole=groups is None)
    tick()
    parts: list[pl.DataFrame] = []
    attrs: dict[str, list[pl.DataFrame]] = {"kernel": [], "copy": [], "nvtx": []}
    nvtx_thread_names = pl.DataFrame(schema={"pid": pl.Int64(), "tid": pl.Int64(), "name": pl.String()})

    def offset() -> int:
        return sum(p.height for p in parts)

    # (Parts live only in ``parts`` and side frames only in ``attrs``, which _slices and _side
    # empty as they sort them: a frame also held here would be a second copy of its rows at the
    # peak.)
    parts.append(runtime_part(db, strs, 0) if wants("runtime") else empty_part())
    tick()
    if wants("kernel"):
        k, ka = kernels_part(db, strs, offset())
        parts.append(k)
        attrs["kernel"].append(ka)
        del k, ka
    tick()
    for group, reader in (("memcpy", memcpy_part), ("memset", memset_part)):
        if wants(group):
            p, pa = reader(db, offset())
            parts.append(p)
            attrs["copy"].append(pa)
            del p, pa
        tick()
    if wants("sync"):
        parts.append(sync_part(db, parts[0], offset()))
    tick()
    if wants("nvtx"):
        nv, nva, nvtx_thread_names = nvtx_part(db, strs, offset())
        parts.append(nv)
        attrs["nvtx"].append(nva)
        del nv, nva
    tick()
    if wants("osrt"):
        parts.append(osrt_part(db, strs, offset()))
    if wants("overhead"):
        parts.append(overhead_part(db, strs, offset()))
    tick()

    slices, id_of_key = _slices(parts, db)
    tick()
    kernel_attrs = _side(attrs["kernel"], id_of_key, KERNEL_ATTRS_SCHEMA)
    copy_attrs = _side(attrs["copy"], id_of_key, COPY_ATTRS_SCHEMA)
    nvtx_attrs = _side(attrs["nvtx"], id_of_key, NVTX_ATTRS_SCHEMA)
    pids = sorted(int(p) for p in slices.get_column(Col.PID).drop_nulls().unique().to_list())
    gpu = slices.select(Col.KIND, Col.PID, Col.DEVICE).filter(
        pl.col(Col.KIND).is_in([x.value for x in GPU_ACTIVITY_KINDS]))
    devices = meta.devices(db, gpu.select(Col.PID, Col.DEVICE).unique())
    threads = meta.threads(db, pids, nvtx_thread_names)
    tick()
    trace_meta = _meta(db, shown, export, slices, nvtx_attrs, selection)
    tick()
    return Trace(
        meta=trace_meta, slices=slices, kernel_attrs=kernel_attrs, copy_attrs=copy_attrs,
        op_attrs=pl.DataFrame(schema=OP_ATTRS_SCHEMA), memory=pl.DataFrame(schema=MEMORY_SCHEMA),
        flows=pl.DataFrame(schema=FLOWS_SCHEMA), threads=threads, devices=devices, nvtx_attrs=nvtx_attrs,
    )


def _slices(parts: list[pl.DataFrame], db: Db) -> tuple[pl.DataFrame, np.ndarray[Any, np.dtype[np.int64]]]:
    """One slices table of the repaired parts sorted by start (source order breaks ties),
    linked, ids = row numbers; and the id of each part key (-1 for keys of rows dropped), for
    the side tables.

    Takes the parts out of ``parts``: on a 600 MB export they are 600 MB, and each column is
    let go as soon as its sorted copy is made.
    """
    frame = repair_keys(pl.concat(parts), db)
    parts.clear()
    order = frame.select(pl.arg_sort_by(Col.TS, maintain_order=True)).to_series()
    keys = frame.get_column(KEY).gather(order).to_numpy()
    id_of_key = np.full(int(keys.max()) + 1 if keys.size else 0, -1, dtype=np.int64)
    id_of_key[keys] = np.arange(keys.size, dtype=np.int64)
    del keys
    columns = {c: frame.get_column(c) for c in _SORTED_COLUMNS}
    del frame
    sorted_columns = []
    for name in _SORTED_COLUMNS:
        sorted_columns.append(columns.pop(name).gather(order))
    slices = pl.DataFrame(sorted_columns).select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias(Col.ID),
        pl.col(Col.KIND).cast(KIND_DTYPE), pl.col(Col.NAME).cast(pl.Categorical),
        Col.TS, Col.DUR, Col.PID, Col.TID, Col.DEVICE, Col.STREAM, Col.CORRELATION,
        pl.lit(None, dtype=pl.Int64).alias(Col.EXTERNAL_ID),
        pl.lit(None, dtype=pl.Int32).alias(Col.DEPTH),
        pl.lit(None, dtype=pl.Int64).alias(Col.PARENT),
        pl.lit(None, dtype=pl.Int64).alias(Col.LAUNCH),
        pl.lit(None, dtype=pl.Int64).alias(Col.OP),
    )
    del sorted_columns
    # Correlation ids repeat across the processes of one capture: launches are found per process.
    return link_slices(slices, per_process=True).cast(dict(SLICES_SCHEMA)), id_of_key  # type: ignore[arg-type]


#: The part columns the slices table keeps, in its order.
_SORTED_COLUMNS: Final = (Col.KIND, Col.NAME, Col.TS, Col.DUR, Col.PID, Col.TID, Col.DEVICE, Col.STREAM,
                          Col.CORRELATION)


def _side(frames: list[pl.DataFrame], id_of_key: np.ndarray[Any, np.dtype[np.int64]],
          schema: pl.Schema) -> pl.DataFrame:
    """The side rows of the slices kept, by slice id.

    Takes the frames out of ``frames`` and puts the rows in id order a column at a time, each
    unsorted column let go once its sorted copy is made: the 4.8 M NVTX rows of a 600 MB export
    are 0.3 GB, which sorting the frame whole held twice.
    """
    kept = [f for f in frames if f.height]
    frames.clear()
    if not kept:
        return pl.DataFrame(schema=schema)
    side = pl.concat(kept)
    del kept
    keys = side.get_column(KEY).to_numpy()
    # Keys past the last one kept belong to dropped rows too.
    known = keys < id_of_key.size
    ids = np.where(known, id_of_key[np.where(known, keys, 0)] if id_of_key.size else -1, -1)
    del keys, known
    side = side.with_columns(pl.Series(Col.ID, ids, dtype=pl.Int64))
    if (ids < 0).any():  # (a filter copies every column, and rows are dropped only in odd files)
        side = side.filter(pl.col(Col.ID) >= 0)
    del ids
    side = side.select(pl.col(c) if c in side.columns else pl.lit(None).alias(c) for c in schema)
    order = side.select(pl.arg_sort_by(Col.ID, maintain_order=True)).to_series()
    columns = {c: side.get_column(c) for c in schema}
    del side
    return pl.DataFrame([columns.pop(c).gather(order).cast(schema[c]) for c in schema])


def _meta(db: Db, shown: Path, export: dict[str, str], slices: pl.DataFrame,
          nvtx_attrs: pl.DataFrame, selection: Selection | None) -> TraceMeta:
    first = slices.get_column(Col.TS).min() if slices.height else None
    last = (slices.get_column(Col.TS) + slices.get_column(Col.DUR)).max() if slices.height else None
    span, clock_note = meta.events_span(db, first, last)  # type: ignore[arg-type]
    # Reading the session's numbers can find problems too, so they come before the list.
    base_time_ns = meta.base_time_ns(db, export, None if span is None else span[0])
    settings = meta.capture_settings(db, export, span)
    warnings = [f"{count} x {problem}" if count > 1 else problem
                for problem, count in sorted(db.problems.items())]
    version = meta.schema_version(export)
    if version is not None and version > meta.NEWEST_SCHEMA_CHECKED:
        warnings.append(f"export schema {export.get('EXPORT_SCHEMA_VERSION')} is newer than the "
                        "newest this reader was checked against (3.25, nsys 2026.2)")
    if "DERIVED_WINDOW_NS" in export:
        warnings.append(f"a derived file: rows were cut to the window {export['DERIVED_WINDOW_NS']} ns "
                        f"of a longer capture ({export.get('DERIVED_FROM', 'source unknown')})")
    gpu = slices.select(Col.KIND, Col.LAUNCH).filter(pl.col(Col.KIND).is_in([k.value for k in GPU_ACTIVITY_KINDS]))
    unlinked = gpu.filter(pl.col(Col.LAUNCH).is_null()).height
    # Calls that were not read are not missing ones.
    if unlinked and (selection is None or "runtime" in selection.groups):
        warnings.append(f"{unlinked} of {gpu.height} GPU activities have no CUDA API call in the "
                        "file (launched before the capture or window began, or API tracing was off)")
    lost_domains = nvtx_attrs.filter(
        (pl.col(NCol.DOMAIN_ID).fill_null(0) != 0) & pl.col(NCol.DOMAIN).is_null()
    )
    if lost_domains.height:
        ids = sorted(set(lost_domains.get_column(NCol.DOMAIN_ID).to_list()))
        warnings.append(f"{lost_domains.height} NVTX events are in domains {ids} whose creation was not "
                        "captured: they are named without their domain")
    if not slices.height and selection is None:
        warnings.append("no CUDA, NVTX or OS runtime events in this export")
    warnings.extend(meta.diagnostics(db))
    if clock_note:
        warnings.append(clock_note)
    counts = slices.group_by(Col.KIND).len().sort(Col.KIND)
    return TraceMeta(
        path=str(shown),
        format="nsys",
        display_time_unit="ns",
        base_time_ns=base_time_ns,
        versions=meta.versions(db, export),
        capture=Capture(source="nsys export"),
        profiler_spans_ns=(span,) if span is not None else (),
        event_counts={str(k): int(v) for k, v in counts.iter_rows()},
        warnings=tuple(warnings),
        capture_settings=settings,
        kinds_read=None if selection is None else selection.kinds_read,
        skipped_tables=tuple(sorted(t for t in db.skipped if t.startswith(_EVENT_TABLE_PREFIXES))),
    )
