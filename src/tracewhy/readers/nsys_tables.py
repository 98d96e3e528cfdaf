"""Nsight Systems export tables, one query per table, turned into frames in model terms.

Every query probes its table and columns first: exports create a table only when it has rows
(``--lazy=true``, the default since 2021) and minor schema versions add, rename or retype
columns (``shared/traces/nsys/NSYS_NOTES.md`` §1.5). Enum values are our own constants, so a
file without ``ENUM_*`` tables (nsys <= 2022.x) reads the same as a newer one.

Each ``*_part`` function returns a slices part (columns of ``PART_SCHEMA``) and, where the
table has attributes, a side frame keyed by the part's ``_key`` column.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Final

import polars as pl

from tracewhy.model.schema import KIND_DTYPE, NVTX_ATTRS_SCHEMA, CCol, KCol, Kind, NCol
from tracewhy.readers.nsys_db import PID_SQL, TID_SQL, Db, Strings

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
# ENUM_NSYS_EVENT_TYPE values of NVTX_EVENTS rows.
NVTX_MARK: Final = 34
NVTX_THREAD_NAME: Final = 39
NVTX_DOMAIN_CREATE: Final = 75
NVTX_RANGE_STYLE: Final = {59: "PushPop", 60: "StartEnd", 70: "PushPop", 71: "StartEnd"}

# CUDA API names carry the CUDA version that introduced them ("cudaLaunchKernel_v7000",
# "cudaLaunchKernelExC_v11060"). Four or more digits: "_v2" is part of real names such as
# cuGetProcAddress_v2 and cudaGetDeviceProperties_v2 (whose record is "..._v2_v12000").
_API_VERSION = re.compile(r"_v\d{4,}$")


def api_name(raw: str) -> str:
    """A CUDA API name without the version suffix nsys records."""
    return _API_VERSION.sub("", raw)


def _named(frame: pl.DataFrame, ids: str, strs: Strings, out: str, *, categorical: bool = False) -> pl.DataFrame:
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


def _require(db: Db, table: str, *columns: str) -> bool:
    """True when the table has rows to read; a table missing a needed column is a problem."""
    if not db.rows_or_empty(table):
        return False
    missing = [c for c in columns if c not in db.columns(table)]
    if missing:
        db.problems[f"{table} lacks {', '.join(missing)}: table skipped"] += 1
        db.skipped.add(table)
        return False
    return True


def _duration(frame: pl.DataFrame, table: str, db: Db) -> pl.DataFrame:
    """ts/dur from start/end; drop rows without start, and rows lasting longer than
    ``db.max_dur_ns``; zero-length rows without end."""
    no_start = frame.get_column("start").null_count()
    if no_start:
        db.problems[f"{table}: {no_start} rows without start skipped"] = 1
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
            frame = frame.filter(pl.col("dur_ns") <= db.max_dur_ns)
    return frame


def _part(frame: pl.DataFrame, kind: str | pl.Expr, offset: int) -> pl.DataFrame:
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
    if not _require(db, t, *_GPU_REQUIRED):
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
              KCol.GRID_X: pl.Int64(), KCol.GRID_Y: pl.Int64(), KCol.GRID_Z: pl.Int64(),
              KCol.BLOCK_X: pl.Int64(), KCol.BLOCK_Y: pl.Int64(), KCol.BLOCK_Z: pl.Int64(),
              KCol.REGISTERS: pl.Int64(), KCol.SHARED_MEM: pl.Int64()}
    k = _duration(db.frame(t, cols, schema), t, db)
    # nsys reports name kernels by their demangled name unless asked for the short one.
    k = _named(_named(k, "demangled", strs, "_demangled", categorical=True), "short", strs, "_short",
               categorical=True)
    k = k.with_columns(pl.coalesce("_demangled", "_short").alias("name"), _none_if_uint32_max("stream"))
    k = _fallback_name(k, db, t, "kernels", ("demangled", "short"), "<unnamed kernel>")
    part = _part(k, Kind.KERNEL.value, offset)
    attrs = k.select(
        part.get_column(KEY), KCol.GRID_X, KCol.GRID_Y, KCol.GRID_Z, KCol.BLOCK_X, KCol.BLOCK_Y,
        KCol.BLOCK_Z, KCol.REGISTERS, KCol.SHARED_MEM,
    )
    return part, attrs


def memcpy_part(db: Db, offset: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    t = "CUPTI_ACTIVITY_KIND_MEMCPY"
    if not _require(db, t, *_GPU_REQUIRED, "bytes", "copyKind"):
        return empty_part(), pl.DataFrame()
    cols = f"""{_GPU_COLS.format(pid=PID_SQL.format(c="globalPid"))}, bytes, copyKind,
        {db.col(t, 'srcKind')}, {db.col(t, 'dstKind')}"""
    schema = {**_GPU_SCHEMA, "bytes": pl.Int64(), "copyKind": pl.Int64(), "srcKind": pl.Int64(),
              "dstKind": pl.Int64()}
    m = _duration(db.frame(t, cols, schema), t, db).with_columns(
        _label("copyKind", COPY_KIND).alias(CCol.COPY_KIND),
        _label("srcKind", MEMORY_KIND).alias(CCol.SRC_MEM),
        _label("dstKind", MEMORY_KIND).alias(CCol.DST_MEM),
        _none_if_uint32_max("stream"),
    )
    # The names Kineto gives the same records, so both formats group alike.
    m = m.with_columns(
        pl.format("Memcpy {} ({} -> {})", CCol.COPY_KIND, CCol.SRC_MEM, CCol.DST_MEM).alias("name")
    )
    part = _part(m, Kind.MEMCPY.value, offset)
    attrs = m.select(part.get_column(KEY), pl.col("bytes").alias(CCol.BYTES), CCol.COPY_KIND,
                     CCol.SRC_MEM, CCol.DST_MEM)
    return part, attrs


def memset_part(db: Db, offset: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    t = "CUPTI_ACTIVITY_KIND_MEMSET"
    if not _require(db, t, *_GPU_REQUIRED):
        return empty_part(), pl.DataFrame()
    cols = f"""{_GPU_COLS.format(pid=PID_SQL.format(c="globalPid"))}, {db.col(t, 'bytes')},
        {db.col(t, 'memKind')}"""
    schema = {**_GPU_SCHEMA, "bytes": pl.Int64(), "memKind": pl.Int64()}
    m = _duration(db.frame(t, cols, schema), t, db).with_columns(
        _label("memKind", MEMORY_KIND).alias(CCol.DST_MEM), _none_if_uint32_max("stream")
    )
    m = m.with_columns(pl.format("Memset ({})", CCol.DST_MEM).alias("name"))
    part = _part(m, Kind.MEMSET.value, offset)
    # A memset has no direction; the memory it writes is recorded as the destination.
    attrs = m.select(part.get_column(KEY), pl.col("bytes").alias(CCol.BYTES),
                     pl.lit(None, dtype=pl.String).alias(CCol.COPY_KIND),
                     pl.lit(None, dtype=pl.String).alias(CCol.SRC_MEM), CCol.DST_MEM)
    return part, attrs


def runtime_part(db: Db, strs: Strings, offset: int) -> pl.DataFrame:
    """CUDA runtime and driver API calls, without --cudabacktrace duplicates."""
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not _require(db, t, "start", "end", "globalTid", "correlationId", "nameId"):
        return empty_part()
    cols = f"""start, "end", {PID_SQL.format(c="globalTid")} AS pid,
        {TID_SQL.format(c="globalTid")} AS tid, correlationId AS correlation,
        {db.col(t, 'eventClass', '0')} AS eventClass, nameId"""
    schema = {"start": pl.Int64(), "end": pl.Int64(), "pid": pl.Int64(), "tid": pl.Int64(),
              "correlation": pl.Int64(), "eventClass": pl.Int64(), "nameId": pl.Int64()}
    r = _duration(db.frame(t, cols, schema), t, db)
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
    return _part(r, kind, offset)


def sync_part(db: Db, runtime: pl.DataFrame, offset: int) -> pl.DataFrame:
    """GPU-side records of synchronization calls, named by the call that made them."""
    t = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if not _require(db, t, *_GPU_REQUIRED):
        return empty_part()
    cols = f"""{_GPU_COLS.format(pid=PID_SQL.format(c="globalPid"))},
        {db.col(t, 'syncType')} AS syncType"""
    s = _duration(db.frame(t, cols, {**_GPU_SCHEMA, "syncType": pl.Int64()}), t, db)
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
    return _part(s, Kind.GPU_SYNC.value, offset)


def nvtx_part(db: Db, strs: Strings, offset: int) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """NVTX ranges and marks as annotations, their attributes, and NVTX thread names."""
    t = "NVTX_EVENTS"
    no_threads = pl.DataFrame(schema={"pid": pl.Int64(), "tid": pl.Int64(), "name": pl.String()})
    if not _require(db, t, "start", "eventType", "globalTid"):
        return empty_part(), pl.DataFrame(), no_threads
    c = partial(db.col, t)
    types = ", ".join(str(v) for v in (NVTX_MARK, NVTX_THREAD_NAME, NVTX_DOMAIN_CREATE, *NVTX_RANGE_STYLE))
    cols = f"""rowid, start, {c('end')}, eventType, {PID_SQL.format(c="globalTid")},
        {TID_SQL.format(c="globalTid")}, {TID_SQL.format(c=c('endGlobalTid'))},
        {c('domainId')}, {c('category')}, {c('text')}, {c('textId')}"""
    schema = {"rowid": pl.Int64(), "start": pl.Int64(), "end": pl.Int64(), "eventType": pl.Int64(),
              "pid": pl.Int64(), "tid": pl.Int64(), NCol.END_TID: pl.Int64(),
              NCol.DOMAIN_ID: pl.Int64(), NCol.CATEGORY: pl.Int64(), "text": pl.String(),
              "textId": pl.Int64()}
    # (Frames of this table are millions of rows: it is fetched and its text resolved a rowid
    # range at a time, so only one range's fetched columns and text lookups exist at once, and
    # columns no longer needed are let go at once.)
    chunks = []
    lost = 0
    ranges: list[tuple[int, int] | None] = [*db.rowid_ranges(t, NVTX_CHUNK_ROWIDS)] or [None]
    for rowids in ranges:
        chunk, chunk_lost = _nvtx_texts(db.frame(t, cols, schema, f"eventType IN ({types})", rowids), strs)
        chunks.append(chunk)
        lost += chunk_lost
    e = pl.concat(chunks) if len(chunks) > 1 else chunks[0]
    del chunks
    # A range without text is an NVTX call without a message; one naming a string the file does
    # not hold has lost its name.
    if lost:
        db.problems[f"{t}: {lost} events name registered strings missing from StringIds: "
                    "shown by their domain or as <unnamed NVTX range>"] = 1
    # Domain ids are per process; the name is the text of its creation record (eventType 75).
    domains = (
        e.filter(pl.col("eventType") == NVTX_DOMAIN_CREATE)
        .sort("start")
        .unique(subset=["pid", NCol.DOMAIN_ID], keep="first")
        .select("pid", NCol.DOMAIN_ID, pl.col("_text").alias(NCol.DOMAIN))
    )
    thread_names = e.filter(
        (pl.col("eventType") == NVTX_THREAD_NAME) & pl.col("_text").is_not_null()
    ).select("pid", "tid", pl.col("_text").alias("name"))
    # A range still open when the capture stopped runs to the last NVTX timestamp (nsys's own
    # rule in nvtx_sum); a mark is an instant.
    # Integers only: SQLite ranks text above every number, so one text cell would be the max.
    ints = "CASE WHEN typeof({0}) = 'integer' THEN {0} END"
    if db.scalar(f"SELECT count(*) FROM {t}") == e.height:
        # Every row was fetched (as integers, or the fetch failed): no second pass over the table.
        last = max(_int_max(e.get_column("start")), _int_max(e.get_column("end")))
    else:
        last = db.scalar(f"SELECT max(coalesce(max({ints.format('start')}), 0), "
                         f"coalesce(max({ints.format(c('end'))}), 0)) FROM {t}")
    style = pl.col("eventType").replace_strict(
        {**NVTX_RANGE_STYLE, NVTX_MARK: "Mark"}, default=None, return_dtype=NVTX_ATTRS_SCHEMA[NCol.STYLE]
    )
    ev = e.with_columns(style.alias(NCol.STYLE)).drop("eventType")
    del e
    if ev.get_column(NCol.STYLE).null_count():
        ev = ev.filter(pl.col(NCol.STYLE).is_not_null())
    keys = ["pid", NCol.DOMAIN_ID]
    ev = ev.with_columns(
        ev.select(keys).join(domains, on=keys, how="left", maintain_order="left").get_column(NCol.DOMAIN)
    )
    open_ranges = ev.filter(pl.col("end").is_null() & (pl.col(NCol.STYLE) != "Mark")).height
    if open_ranges:
        db.problems[f"{open_ranges} NVTX ranges never ended; they run to the last NVTX timestamp"] += 1
    ev = ev.with_columns(
        pl.when(pl.col(NCol.STYLE) == "Mark").then(pl.col("start"))
        .otherwise(pl.col("end").fill_null(int(last or 0))).alias("end"),
        pl.when(pl.col(NCol.DOMAIN).is_not_null())
        .then(pl.format("{}:{}", NCol.DOMAIN, pl.col("_text").fill_null("")))
        .otherwise(pl.col("_text").fill_null("<unnamed NVTX range>")).alias("name"),
    )
    ev = _duration(ev, t, db)
    part = _part(ev, Kind.ANNOTATION.value, offset)
    attrs = ev.select(part.get_column(KEY), pl.col("rowid").alias(NCol.RANGE_ID), NCol.STYLE,
                      NCol.DOMAIN_ID, NCol.DOMAIN, NCol.CATEGORY, NCol.END_TID)
    return part, attrs, thread_names


#: Rowids of NVTX_EVENTS fetched at once (``nvtx_part``): a million rows are about 0.1 GB of
#: columns while fetched, against 0.9 GB for the 4.8 M rows of a 600 MB export fetched whole.
NVTX_CHUNK_ROWIDS: Final = 1_000_000


def _nvtx_texts(events: pl.DataFrame, strs: Strings) -> tuple[pl.DataFrame, int]:
    """NVTX rows with their text in ``_text`` instead of the inline ``text`` and the registered
    ``textId``; and how many name a registered string StringIds lacks."""
    # A string registered with nvtxDomainRegisterString is in textId, else the text is inline.
    e = _named(events, "textId", strs, "_registered")
    del events
    lost = e.select((pl.col("textId").is_not_null() & pl.col("_registered").is_null()).sum()).item()
    e = e.with_columns(pl.coalesce("_registered", "text").alias("_text")).drop("_registered", "text", "textId")
    return e, int(lost)


def osrt_part(db: Db, strs: Strings, offset: int) -> pl.DataFrame:
    """OS runtime calls (``--trace=osrt``): what a thread was blocked in or busy with."""
    t = "OSRT_API"
    if not _require(db, t, "start", "end", "globalTid", "nameId"):
        return empty_part()
    cols = f"""start, "end", {PID_SQL.format(c="globalTid")} AS pid,
        {TID_SQL.format(c="globalTid")} AS tid, nameId"""
    schema = {"start": pl.Int64(), "end": pl.Int64(), "pid": pl.Int64(), "tid": pl.Int64(),
              "nameId": pl.Int64()}
    o = _named(_duration(db.frame(t, cols, schema), t, db), "nameId", strs, "name")
    o = _fallback_name(o, db, t, "calls", ("nameId",), "<unnamed OS call>")
    return _part(o, Kind.OTHER.value, offset)


def overhead_part(db: Db, strs: Strings, offset: int) -> pl.DataFrame:
    """The profiler's own overhead: PROFILER_OVERHEAD and (2026+) CUPTI_ACTIVITY_KIND_OVERHEAD."""
    frames = []
    for t in ("PROFILER_OVERHEAD", "CUPTI_ACTIVITY_KIND_OVERHEAD"):
        if not _require(db, t, "start", "end", "globalTid", "nameId"):
            continue
        cols = f"""start, "end", {PID_SQL.format(c="globalTid")} AS pid,
            {TID_SQL.format(c="globalTid")} AS tid, nameId"""
        schema = {"start": pl.Int64(), "end": pl.Int64(), "pid": pl.Int64(), "tid": pl.Int64(),
                  "nameId": pl.Int64()}
        o = _named(_duration(db.frame(t, cols, schema), t, db), "nameId", strs, "name")
        frames.append(_fallback_name(o, db, t, "records", ("nameId",), "<profiler overhead>"))
    if not frames:
        return empty_part()
    o = pl.concat(frames)
    return _part(o, Kind.OVERHEAD.value, offset)


def _int_max(column: pl.Series) -> int:
    """The largest value of an integer column, 0 when it has none."""
    top = column.max()
    return int(top) if isinstance(top, int) else 0


def empty_part() -> pl.DataFrame:
    return pl.DataFrame(schema=PART_SCHEMA)


def _label(column: str, labels: dict[int, str], default: str = "unknown") -> pl.Expr:
    return pl.col(column).replace_strict(labels, default=default, return_dtype=pl.String)


def _none_if_uint32_max(column: str) -> pl.Expr:
    return pl.when(pl.col(column) == UINT32_NONE).then(None).otherwise(pl.col(column)).alias(column)
