"""The Trace's tables and meta from the parts an Nsight Systems export's tables were read into:
one slices table sorted by start and linked, the side tables by slice id, and what the export
says about the capture (with the reader's warnings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import numpy as np
import polars as pl

from tracewhy.model.linking import link_slices
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, KIND_DTYPE, SLICES_SCHEMA, Col, Kind, NvtxCol
from tracewhy.model.trace import NSYS_FORMAT, Capture, TraceMeta
from tracewhy.readers.nsys import meta
from tracewhy.readers.nsys.db import Db
from tracewhy.readers.nsys.repair import repair_keys
from tracewhy.readers.nsys.selection import Selection
from tracewhy.readers.nsys.tables import KEY

#: Tables that hold events (the rest hold strings, enums and metadata): one skipped means the
#: Trace lacks events (``TraceMeta.missing_events``), which ``check`` fails as partial-trace.
_EVENT_TABLE_PREFIXES: Final = ("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS", "OSRT_API", "PROFILER_OVERHEAD")


def slices_table(parts: list[pl.DataFrame], db: Db) -> tuple[pl.DataFrame, np.ndarray[Any, np.dtype[np.int64]]]:
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


def side_table(frames: list[pl.DataFrame], id_of_key: np.ndarray[Any, np.dtype[np.int64]],
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


def trace_meta(db: Db, shown: Path, export: dict[str, str], slices: pl.DataFrame,
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
        (pl.col(NvtxCol.DOMAIN_ID).fill_null(0) != 0) & pl.col(NvtxCol.DOMAIN).is_null()
    )
    if lost_domains.height:
        ids = sorted(set(lost_domains.get_column(NvtxCol.DOMAIN_ID).to_list()))
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
        format=NSYS_FORMAT,
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
        dropped_events=_dropped_by_kind(db),
    )


#: The kind of slice each event table's rows become (runtime calls: runtime or driver; counted
#: as runtime).
_TABLE_KIND: Final = {
    "CUPTI_ACTIVITY_KIND_KERNEL": Kind.KERNEL, "CUPTI_ACTIVITY_KIND_MEMCPY": Kind.MEMCPY,
    "CUPTI_ACTIVITY_KIND_MEMSET": Kind.MEMSET, "CUPTI_ACTIVITY_KIND_RUNTIME": Kind.RUNTIME,
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": Kind.GPU_SYNC, "NVTX_EVENTS": Kind.ANNOTATION,
    "OSRT_API": Kind.OTHER, "PROFILER_OVERHEAD": Kind.OVERHEAD, "CUPTI_ACTIVITY_KIND_OVERHEAD": Kind.OVERHEAD,
}


def _dropped_by_kind(db: Db) -> dict[str, int]:
    out: dict[str, int] = {}
    for table, n in db.dropped.items():
        kind = _TABLE_KIND.get(table, Kind.OTHER).value
        out[kind] = out.get(kind, 0) + n
    return dict(sorted(out.items()))
