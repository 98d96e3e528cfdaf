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
from pathlib import Path

import polars as pl

from tracewhy.errors import TraceError
from tracewhy.model.schema import (
    COPY_ATTRS_SCHEMA,
    FLOWS_SCHEMA,
    GPU_ACTIVITY_KINDS,
    KERNEL_ATTRS_SCHEMA,
    MEMORY_SCHEMA,
    NVTX_ATTRS_SCHEMA,
    OP_ATTRS_SCHEMA,
    Col,
    Kind,
)
from tracewhy.model.trace import Trace
from tracewhy.readers.nsys import meta
from tracewhy.readers.nsys.arrow import ArrowFetch, open_arrow
from tracewhy.readers.nsys.assemble import side_table, slices_table, trace_meta
from tracewhy.readers.nsys.db import ColumnTypeError, Db, Strings
from tracewhy.readers.nsys.export import export_report
from tracewhy.readers.nsys.nvtx_tables import nvtx_part
from tracewhy.readers.nsys.open_export import open_export
from tracewhy.readers.nsys.repair import plausible_duration_ns
from tracewhy.readers.nsys.selection import Selection, select_tables
from tracewhy.readers.nsys.sniff import sniff_nsys
from tracewhy.readers.nsys.tables import (
    empty_part,
    kernels_part,
    memcpy_part,
    memset_part,
    osrt_part,
    overhead_part,
    runtime_part,
    sync_part,
)
from tracewhy.readers.source import DEFAULT_MAX_INFLATED_BYTES

Progress = Callable[[int, int], None]

_CHUNK = 16 * 1024 * 1024
_STEPS = 10


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

    slices, id_of_key = slices_table(parts, db)
    tick()
    kernel_attrs = side_table(attrs["kernel"], id_of_key, KERNEL_ATTRS_SCHEMA)
    copy_attrs = side_table(attrs["copy"], id_of_key, COPY_ATTRS_SCHEMA)
    nvtx_attrs = side_table(attrs["nvtx"], id_of_key, NVTX_ATTRS_SCHEMA)
    pids = sorted(int(p) for p in slices.get_column(Col.PID).drop_nulls().unique().to_list())
    gpu = slices.select(Col.KIND, Col.PID, Col.DEVICE).filter(
        pl.col(Col.KIND).is_in([x.value for x in GPU_ACTIVITY_KINDS]))
    devices = meta.devices(db, gpu.select(Col.PID, Col.DEVICE).unique())
    threads = meta.threads(db, pids, nvtx_thread_names)
    tick()
    about = trace_meta(db, shown, export, slices, nvtx_attrs, selection)
    tick()
    return Trace(
        meta=about, slices=slices, kernel_attrs=kernel_attrs, copy_attrs=copy_attrs,
        op_attrs=pl.DataFrame(schema=OP_ATTRS_SCHEMA), memory=pl.DataFrame(schema=MEMORY_SCHEMA),
        flows=pl.DataFrame(schema=FLOWS_SCHEMA), threads=threads, devices=devices, nvtx_attrs=nvtx_attrs,
    )
