"""Nsight Systems export tables, one query per table, turned into frames in model terms.

Every query probes its table and columns first: exports create a table only when it has rows
(``--lazy=true``, the default since 2021) and minor schema versions add, rename or retype
columns (``shared/traces/nsys/NSYS_NOTES.md`` §1.5). Enum values are our own constants, so a
file without ``ENUM_*`` tables (nsys <= 2022.x) reads the same as a newer one.

Each ``*_part`` function (NVTX's is in ``nvtx_tables``) returns a slices part (columns of
``PART_SCHEMA``) and, where the table has attributes, a side frame keyed by the part's ``_key``
column.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Final

import polars as pl

from tracewhy.model.schema import KIND_DTYPE, CopyAttrCol, Kind, LaunchAttrCol
from tracewhy.readers.nsys.db import PID_SQL, TID_SQL, Db, Strings

UINT32_NONE: Final = 0xFFFFFFFF  # CUPTI writes (uint32)-1 for "no stream" / "no event"

KEY: Final = "_key"
PART_SCHEMA: Final = pl.Schema(
    {
        KEY: pl.Int64(),
        "kind": KIND_DTYPE,
        # Categorical from the start: concatenating and sorting millions of names (templated
        # kernel names run to hundreds of bytes) copies codes, not strings.
        "name": pl.Categorical(),
        "ts_ns": pl.Int64(),
        "dur_ns": pl.Int64(),
        "pid": pl.Int64(),
        "tid": pl.Int64(),
        "device": pl.Int32(),
        "stream": pl.Int64(),
        "correlation": pl.Int64(),
    }
)

# ENUM_CUDA_MEMCPY_OPER. Unified-memory copies (11-13) keep their direction; their Managed
# source or destination shows in the memory kinds.
COPY_KIND: Final = {
    0: "unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
    8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD",
}
# ENUM_CUDA_MEM_KIND. Static device/managed memory (__device__/__managed__ variables) is
# device/managed memory for every question we ask.
MEMORY_KIND: Final = {
    0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device", 6: "Managed",
    7: "unknown",
}
# ENUM_CUPTI_SYNC_TYPE, named as Kineto names its cuda_sync events.
SYNC_TYPE: Final = {0: "Unknown Sync", 1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync",
                    4: "Context Sync"}
# nsys 2025.1 and 2026.1 exports record cudaStreamSynchronize with syncType 2 (stream wait
# event); the API that made the record is the better witness, so it names the sync when known.
SYNC_BY_API: Final = {
    "cudaStreamSynchronize": "Stream Sync", "cudaEventSynchronize": "Event Sync",
    "cudaEventQuery": "Event Sync", "cudaDeviceSynchronize": "Context Sync",
    "cudaCtxSynchronize": "Context Sync", "cudaStreamWaitEvent": "Stream Wait Event",
    "cuStreamSynchronize": "Stream Sync", "cuEventSynchronize": "Event Sync",
    "cuCtxSynchronize": "Context Sync", "cuStreamWaitEvent": "Stream Wait Event",
}
# ENUM_NSYS_EVENT_CLASS values of CUPTI_ACTIVITY_KIND_RUNTIME rows.
EVENT_CLASS_DRIVER: Final = 1
EVENT_CLASS_BACKTRACE: Final = 67  # --cudabacktrace duplicate of a class 0/1 row (nsys 2022.2)
# CUDA API names carry the CUDA version that introduced them ("cudaLaunchKernel_v7000",
# "cudaLaunchKernelExC_v11060"). Four or more digits: "_v2" is part of real names such as
# cuGetProcAddress_v2 and cudaGetDeviceProperties_v2 (whose record is "..._v2_v12000").
_API_VERSION = re.compile(r"_v\d{4,}$")


def api_name(raw: str) -> str:
    """A CUDA API name without the version suffix nsys records."""
    return _API_VERSION.sub("", raw)


def named(frame: pl.DataFrame, ids: str, strs: Strings, out: str, *, categorical: bool = False) -> pl.DataFrame:
    """Add the text of the StringIds id column ``ids`` as column ``out`` (null where missing);
    ``categorical``: as codes, for a million rows naming a few long strings (kernel names)."""
    texts = strs.of(frame.get_column(ids))
    if categorical:
        texts = texts.with_columns(pl.col("value").cast(pl.Categorical))
    return _with_text(frame, ids, texts, out)


def _with_text(frame: pl.DataFrame, ids: str, texts: pl.DataFrame, out: str) -> pl.DataFrame:
    """Look the id column ``ids`` up in ``texts`` (id, value; ids unique) as column ``out``.

    A lookup adds one column; a join copied every column of the frame (4.8 M NVTX rows).
    """
    value = texts.get_column("value")
    return frame.with_columns(
        pl.col(ids).replace_strict(texts.get_column("id"), value, default=None, return_dtype=value.dtype).alias(out)
    )


def _fallback_name(frame: pl.DataFrame, db: Db, table: str, what: str, ids: tuple[str, ...],
                   placeholder: str) -> pl.DataFrame:
    """Name the rows ``_named`` left nameless ``placeholder``, counting them as a problem.

    The name ids are NOT NULL in every schema; a file that still lacks names (a NULL id, or an
    id StringIds does not hold: a windowed or hand-edited export) must say so, or every such
    row silently becomes one placeholder.
    """
    nameless = frame.filter(pl.col("name").is_null())
    if nameless.height:
        dangling = nameless.filter(pl.any_horizontal(pl.col(c).is_not_null() for c in ids)).height
        reason = ("their StringIds entries are missing" if dangling == nameless.height
                  else "NULL name ids" if not dangling else "NULL name ids or missing StringIds entries")
        db.problems[f"{table}: {nameless.height} {what} have no name ({reason}): shown as {placeholder}"] = 1
    return frame.with_columns(pl.col("name").fill_null(placeholder))


def require(db: Db, table: str, *columns: str) -> bool:
    """True when the table has rows to read; a table missing a needed column is a problem."""
    if not db.rows_or_empty(table):
        return False
    missing = [c for c in columns if c not in db.columns(table)]
    if missing:
        db.problems[f"{table} lacks {', '.join(missing)}: table skipped"] += 1
        db.skipped.add(table)
        return False
    return True


def with_duration(frame: pl.DataFrame, table: str, db: Db) -> pl.DataFrame:
    """ts/dur from start/end; drop rows without start, and rows lasting longer than
    ``db.max_dur_ns``; zero-length rows without end."""
    no_start = frame.get_column("start").null_count()
    if no_start:
        db.problems[f"{table}: {no_start} rows without start skipped"] = 1
        db.dropped[table] += no_start
        frame = frame.filter(pl.col("start").is_not_null())
    bad = frame.filter(pl.col("end").is_null() | (pl.col("end") < pl.col("start"))).height
    if bad:
        db.problems[f"{table}: {bad} rows end before they start (or never); taken as 0 ns"] = 1
    span = pl.col("end") - pl.col("start")
    # end - start wraps around on corrupt timestamps (int64); such a row lasts too long anyway.
    wrapped = (pl.col("end") >= pl.col("start")) & (span < 0)
    frame = frame.with_columns(
        pl.col("start").alias("ts_ns"),
        pl.when(wrapped).then(pl.lit(2**63 - 1)).otherwise(span.fill_null(0).clip(lower_bound=0)).alias("dur_ns"),
    )
    if db.max_dur_ns is not None:
        # One corrupt end (a kernel of 4e18 ns) would otherwise make the GPU 100% busy for
        # 127 years in every utilization figure.
        too_long = frame.filter(pl.col("dur_ns") > db.max_dur_ns).get_column("dur_ns")
        if too_long.len():
            db.problems[f"{table}: {too_long.len()} rows last longer than the capture could "
                        f"(up to {too_long.max() / 1e9:.3g} s, limit {db.max_dur_ns / 1e9:.3g} s): "  # type: ignore[operator]
                        "skipped as corrupt"] = 1
            db.dropped[table] += too_long.len()
            frame = frame.filter(pl.col("dur_ns") <= db.max_dur_ns)
    return frame


def as_part(frame: pl.DataFrame, kind: str | pl.Expr, offset: int) -> pl.DataFrame:
    """Select the part columns, numbering rows from ``offset``."""
    kind_expr = pl.lit(kind) if isinstance(kind, str) else kind
    cols: list[pl.Expr] = [
        (pl.int_range(pl.len(), dtype=pl.Int64) + offset).alias(KEY),
        kind_expr.alias("kind"),
    ]
    for name in list(PART_SCHEMA)[2:]:
        cols.append(pl.col(name) if name in frame.columns else pl.lit(None).alias(name))
    return frame.select(cols).cast(dict(PART_SCHEMA))  # type: ignore[arg-type]


_GPU_COLS = """start, "end", {pid} AS pid, deviceId AS device, streamId AS stream,
    correlationId AS correlation"""
_GPU_SCHEMA: Final = {"start": pl.Int64(), "end": pl.Int64(), "pid": pl.Int64(), "device": pl.Int32(),
                      "stream": pl.Int64(), "correlation": pl.Int64()}
_GPU_REQUIRED = ("start", "end", "globalPid", "deviceId", "streamId", "correlationId")


def kernels_part(db: Db, strs: Strings, offset: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    t = "CUPTI_ACTIVITY_KIND_KERNEL"
    if not require(db, t, *_GPU_REQUIRED):
        return empty_part(), pl.DataFrame()
    c = partial(db.col, t)
    shared = f"coalesce({c('staticSharedMemory')}, 0) + coalesce({c('dynamicSharedMemory')}, 0)"
    if "staticSharedMemory" not in db.columns(t) and "dynamicSharedMemory" not in db.columns(t):
        shared = "NULL"
    cols = f"""{_GPU_COLS.format(pid=PID_SQL.format(c="globalPid"))},
        {c('demangledName')} AS demangled, {c('shortName')} AS short,
        {c('gridX')}, {c('gridY')}, {c('gridZ')}, {c('blockX')}, {c('blockY')}, {c('blockZ')},
        {c('registersPerThread')}, {shared}"""
    schema = {**_GPU_SCHEMA, "demangled": pl.Int64(), "short": pl.Int64(),
              LaunchAttrCol.GRID_X: pl.Int64(), LaunchAttrCol.GRID_Y: pl.Int64(), LaunchAttrCol.GRID_Z: pl.Int64(),
              LaunchAttrCol.BLOCK_X: pl.Int64(), LaunchAttrCol.BLOCK_Y: pl.Int64(), LaunchAttrCol.BLOCK_Z: pl.Int64(),
              LaunchAttrCol.REGISTERS: pl.Int64(), LaunchAttrCol.SHARED_MEM: pl.Int64()}
    k = with_duration(db.frame(t, cols, schema), t, db)
    # nsys reports name kernels by their demangled name unless asked for the short one.
    k = named(named(k, "demangled", strs, "_demangled", categorical=True), "short", strs, "_short",
               categorical=True)
    k = k.with_columns(pl.coalesce("_demangled", "_short").alias("name"), _none_if_uint32_max("stream"))
    k = _fallback_name(k, db, t, "kernels", ("demangled", "short"), "<unnamed kernel>")
    part = as_part(k, Kind.KERNEL.value, offset)
    attrs = k.select(
        part.get_column(KEY), LaunchAttrCol.GRID_X, LaunchAttrCol.GRID_Y, LaunchAttrCol.GRID_Z, LaunchAttrCol.BLOCK_X,
        LaunchAttrCol.BLOCK_Y,
        LaunchAttrCol.BLOCK_Z, LaunchAttrCol.REGISTERS, LaunchAttrCol.SHARED_MEM,
    )
    return part, attrs


def memcpy_part(db: Db, offset: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    t = "CUPTI_ACTIVITY_KIND_MEMCPY"
    if not require(db, t, *_GPU_REQUIRED, "bytes", "copyKind"):
        return empty_part(), pl.DataFrame()
    cols = f"""{_GPU_COLS.format(pid=PID_SQL.format(c="globalPid"))}, bytes, copyKind,
        {db.col(t, 'srcKind')}, {db.col(t, 'dstKind')}"""
    schema = {**_GPU_SCHEMA, "bytes": pl.Int64(), "copyKind": pl.Int64(), "srcKind": pl.Int64(),
              "dstKind": pl.Int64()}
    m = with_duration(db.frame(t, cols, schema), t, db).with_columns(
        _label("copyKind", COPY_KIND).alias(CopyAttrCol.COPY_KIND),
        _label("srcKind", MEMORY_KIND).alias(CopyAttrCol.SRC_MEM),
        _label("dstKind", MEMORY_KIND).alias(CopyAttrCol.DST_MEM),
        _none_if_uint32_max("stream"),
    )
    # The names Kineto gives the same records, so both formats group alike.
    m = m.with_columns(
        pl.format("Memcpy {} ({} -> {})", CopyAttrCol.COPY_KIND, CopyAttrCol.SRC_MEM, CopyAttrCol.DST_MEM).alias("name")
    )
    part = as_part(m, Kind.MEMCPY.value, offset)
    attrs = m.select(part.get_column(KEY), pl.col("bytes").alias(CopyAttrCol.BYTES), CopyAttrCol.COPY_KIND,
                     CopyAttrCol.SRC_MEM, CopyAttrCol.DST_MEM)
    return part, attrs


def memset_part(db: Db, offset: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    t = "CUPTI_ACTIVITY_KIND_MEMSET"
    if not require(db, t, *_GPU_REQUIRED):
        return empty_part(), pl.DataFrame()
    cols = f"""{_GPU_COLS.format(pid=PID_SQL.format(c="globalPid"))}, {db.col(t, 'bytes')},
        {db.col(t, 'memKind')}"""
    schema = {**_GPU_SCHEMA, "bytes": pl.Int64(), "memKind": pl.Int64()}
    m = with_duration(db.frame(t, cols, schema), t, db).with_columns(
        _label("memKind", MEMORY_KIND).alias(CopyAttrCol.DST_MEM), _none_if_uint32_max("stream")
    )
    m = m.with_columns(pl.format("Memset ({})", CopyAttrCol.DST_MEM).alias("name"))
    part = as_part(m, Kind.MEMSET.value, offset)
    # A memset has no direction; the memory it writes is recorded as the destination.
    attrs = m.select(part.get_column(KEY), pl.col("bytes").alias(CopyAttrCol.BYTES),
                     pl.lit(None, dtype=pl.String).alias(CopyAttrCol.COPY_KIND),
                     pl.lit(None, dtype=pl.String).alias(CopyAttrCol.SRC_MEM), CopyAttrCol.DST_MEM)
    return part, attrs


def runtime_part(db: Db, strs: Strings, offset: int) -> pl.DataFrame:
    """CUDA runtime and driver API calls, without --cudabacktrace duplicates."""
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not require(db, t, "start", "end", "globalTid", "correlationId", "nameId"):
        return empty_part()
    cols = f"""start, "end", {PID_SQL.format(c="globalTid")} AS pid,
        {TID_SQL.format(c="globalTid")} AS tid, correlationId AS correlation,
        {db.col(t, 'eventClass', '0')} AS eventClass, nameId"""
    schema = {"start": pl.Int64(), "end": pl.Int64(), "pid": pl.Int64(), "tid": pl.Int64(),
              "correlation": pl.Int64(), "eventClass": pl.Int64(), "nameId": pl.Int64()}
    r = with_duration(db.frame(t, cols, schema), t, db)
    # nsys 2022.2 with --cudabacktrace records every call twice: the call (class 0/1, versioned
    # name) and its backtrace (class 67, same correlation id, a little wider). Keep the call.
    backtrace = pl.col("eventClass") == EVENT_CLASS_BACKTRACE
    if r.select(backtrace.any()).item():  # (a scan, not a join, in files without them)
        calls = r.filter(~backtrace).select("pid", "correlation").unique()
        if r.filter(backtrace).join(calls, on=["pid", "correlation"], how="semi").height:
            r = r.filter(~backtrace).vstack(
                r.filter(backtrace).join(calls, on=["pid", "correlation"], how="anti")
            )
    used = r.get_column("nameId").unique()
    names = strs.of(used).filter(pl.col("id").is_in(used.implode()))
    names = names.with_columns(pl.col("value").map_elements(api_name, return_dtype=pl.String))
    r = _fallback_name(_with_text(r, "nameId", names, "name"), db, t, "calls", ("nameId",), "<unnamed API>")
    driver = (pl.col("eventClass") == EVENT_CLASS_DRIVER) | (
        pl.col("name").str.starts_with("cu") & ~pl.col("name").str.starts_with("cuda")
    )
    kind = pl.when(driver).then(pl.lit(Kind.DRIVER.value)).otherwise(pl.lit(Kind.RUNTIME.value))
    return as_part(r, kind, offset)


def sync_part(db: Db, runtime: pl.DataFrame, offset: int) -> pl.DataFrame:
    """GPU-side records of synchronization calls, named by the call that made them."""
    t = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if not require(db, t, *_GPU_REQUIRED):
        return empty_part()
    cols = f"""{_GPU_COLS.format(pid=PID_SQL.format(c="globalPid"))},
        {db.col(t, 'syncType')} AS syncType"""
    s = with_duration(db.frame(t, cols, {**_GPU_SCHEMA, "syncType": pl.Int64()}), t, db)
    # Only the calls that made these records (the runtime table holds millions of calls).
    keys = ["pid", "correlation"]
    api = (
        runtime.select(*keys, pl.col("name").alias("_api"))
        .join(s.select(keys).unique(), on=keys, how="semi", maintain_order="left")
        .unique(subset=keys, keep="first")
    )
    s = s.join(api, on=["pid", "correlation"], how="left").with_columns(
        pl.coalesce(
            pl.col("_api").cast(pl.String).replace_strict(SYNC_BY_API, default=None, return_dtype=pl.String),
            _label("syncType", SYNC_TYPE, "Unknown Sync"),
        ).alias("name"),
        _none_if_uint32_max("stream"),
    )
    return as_part(s, Kind.GPU_SYNC.value, offset)


def osrt_part(db: Db, strs: Strings, offset: int) -> pl.DataFrame:
    """OS runtime calls (``--trace=osrt``): what a thread was blocked in or busy with."""
    t = "OSRT_API"
    if not require(db, t, "start", "end", "globalTid", "nameId"):
        return empty_part()
    cols = f"""start, "end", {PID_SQL.format(c="globalTid")} AS pid,
        {TID_SQL.format(c="globalTid")} AS tid, nameId"""
    schema = {"start": pl.Int64(), "end": pl.Int64(), "pid": pl.Int64(), "tid": pl.Int64(),
              "nameId": pl.Int64()}
    o = named(with_duration(db.frame(t, cols, schema), t, db), "nameId", strs, "name")
    o = _fallback_name(o, db, t, "calls", ("nameId",), "<unnamed OS call>")
    return as_part(o, Kind.OTHER.value, offset)


def overhead_part(db: Db, strs: Strings, offset: int) -> pl.DataFrame:
    """The profiler's own overhead: PROFILER_OVERHEAD and (2026+) CUPTI_ACTIVITY_KIND_OVERHEAD."""
    frames = []
    for t in ("PROFILER_OVERHEAD", "CUPTI_ACTIVITY_KIND_OVERHEAD"):
        if not require(db, t, "start", "end", "globalTid", "nameId"):
            continue
        cols = f"""start, "end", {PID_SQL.format(c="globalTid")} AS pid,
            {TID_SQL.format(c="globalTid")} AS tid, nameId"""
        schema = {"start": pl.Int64(), "end": pl.Int64(), "pid": pl.Int64(), "tid": pl.Int64(),
                  "nameId": pl.Int64()}
        o = named(with_duration(db.frame(t, cols, schema), t, db), "nameId", strs, "name")
        frames.append(_fallback_name(o, db, t, "records", ("nameId",), "<profiler overhead>"))
    if not frames:
        return empty_part()
    o = pl.concat(frames)
    return as_part(o, Kind.OVERHEAD.value, offset)


def int_max(column: pl.Series) -> int:
    """The largest value of an integer column, 0 when it has none."""
    top = column.max()
    return int(top) if isinstance(top, int) else 0


def empty_part() -> pl.DataFrame:
    return pl.DataFrame(schema=PART_SCHEMA)


def _label(column: str, labels: dict[int, str], default: str = "unknown") -> pl.Expr:
    return pl.col(column).replace_strict(labels, default=default, return_dtype=pl.String)


def _none_if_uint32_max(column: str) -> pl.Expr:
    return pl.when(pl.col(column) == UINT32_NONE).then(None).otherwise(pl.col(column)).alias(column)
