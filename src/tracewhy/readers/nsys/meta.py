"""What an Nsight Systems export says besides its events: versions, capture settings, the
session's clock, GPUs, and process and thread names."""

from __future__ import annotations

from functools import partial
from typing import Any, Final

import polars as pl

from tracewhy.model.schema import DEVICES_SCHEMA, THREADS_SCHEMA, DeviceCol, ThreadCol
from tracewhy.readers.nsys.db import PID_SQL, TID_SQL, Db, as_int

#: The newest export schema this reader was checked against (nsys 2026.2).
NEWEST_SCHEMA_CHECKED: Final = (3, 25)
#: Capture settings that are never copied into the model: the job's whole environment (it
#: holds tokens and passwords as often as not).
_SECRET_MARKERS: Final = ("ENVIRONMENT", "DeviceEnvironment")


def key_values(db: Db, table: str) -> list[tuple[str, str]]:
    if not db.has(table, "name", "value"):
        return []
    rows = db.conn.execute(f'SELECT name, value FROM "{table}"').fetchall()
    return [(str(k), "" if v is None else str(v)) for k, v in rows]


def export_metadata(db: Db) -> dict[str, str]:
    # nsys <= 2022.x names the table EXPORT_META_DATA; later versions META_DATA_EXPORT.
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        values = key_values(db, table)
        if values:
            return dict(values)
    return {}


def schema_version(export: dict[str, str]) -> tuple[int, int] | None:
    parts = export.get("EXPORT_SCHEMA_VERSION", "").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def capture_settings(db: Db, export: dict[str, str], span: tuple[int, int] | None) -> dict[str, str]:
    """META_DATA_CAPTURE without the environment, plus the session span on the events' clock
    and any windowing."""
    settings: dict[str, str] = {}
    for key, value in key_values(db, "META_DATA_CAPTURE"):
        if any(marker in key for marker in _SECRET_MARKERS):
            continue
        # Repeated keys (CAPTURE_EVENT_TYPE: NvtxEvents, Cuda, ...) are lists.
        settings[key] = f"{settings[key]},{value}" if key in settings else value
    for key in ("EXPORT_PARAM_TIME_NORMALIZE", "EXPORT_PARAM_TIME_SHIFT", "DERIVED_FROM",
                "DERIVED_WINDOW_NS", "DERIVED_BY"):
        if key in export:
            settings[key] = export[key]
    if span is not None:
        settings["SESSION_START_NS"] = str(span[0])
        settings["SESSION_STOP_NS"] = str(span[1])
    utc = session_utc(db)
    if utc is not None:
        settings["SESSION_START_UTC_EPOCH_NS"] = str(utc[0])
        settings["SESSION_START_UTC"] = utc[1]
    return dict(sorted(settings.items()))


def session_span(db: Db) -> tuple[int | None, int | None]:
    """ANALYSIS_DETAILS start and stop on the trace's clock (what the timestamps are on)."""
    if not db.has("ANALYSIS_DETAILS", "startTime", "stopTime"):
        return None, None
    row = db.conn.execute("SELECT startTime, stopTime FROM ANALYSIS_DETAILS LIMIT 1").fetchone()
    if row is None:
        return None, None
    start, stop = _number(db, "ANALYSIS_DETAILS.startTime", row[0]), _number(db, "ANALYSIS_DETAILS.stopTime", row[1])
    return (None, None) if start is None else (start, stop)


def session_utc(db: Db) -> tuple[int, str] | None:
    if not db.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
        return None
    cols = db.columns("TARGET_INFO_SESSION_START_TIME")
    utc_time = '"utcTime"' if "utcTime" in cols else "''"
    row = db.conn.execute(
        f"SELECT utcEpochNs, {utc_time} FROM TARGET_INFO_SESSION_START_TIME LIMIT 1"
    ).fetchone()
    if row is None:
        return None
    epoch = _number(db, "TARGET_INFO_SESSION_START_TIME.utcEpochNs", row[0])
    return None if epoch is None else (epoch, str(row[1] or ""))


def _number(db: Db, where: str, value: Any) -> int | None:
    """``as_int`` of a metadata cell; a cell holding something else is a reader problem."""
    number = as_int(value)
    if number is None and value is not None:
        db.problems[f"{where} is not an integer ({_shown(value)}): taken as unknown"] = 1
    return number


def _shown(value: Any) -> str:
    return repr(value if not isinstance(value, str) else " ".join(value.split()))[:40]


def events_span(db: Db, first_ts: int | None, last_end: int | None) -> tuple[tuple[int, int] | None, str | None]:
    """The session (ANALYSIS_DETAILS start, stop) on the clock the events use, and a note
    when that clock is not the one ANALYSIS_DETAILS uses.

    Exports up to 2025.x and 2026.2 write ANALYSIS_DETAILS on the events' clock (events may
    begin a little before its start). The 2026.1 export in shared/traces writes it on the raw
    monotonic clock (5.15e14 ns) while its events count from the session's start (~1e9 ns):
    when the events lie wholly outside the session, they are taken to count from its start.
    """
    start, stop = session_span(db)
    if start is None or stop is None:
        return None, None
    if first_ts is None or last_end is None or (last_end >= start and first_ts <= stop):
        return (start, stop), None
    note = (f"ANALYSIS_DETAILS gives the session on another clock ({start} ns) than the events "
            f"(which begin at {first_ts} ns); the events are taken to count from the session start")
    return (0, stop - start), note


def base_time_ns(db: Db, export: dict[str, str], session_start: int | None) -> int | None:
    """UTC epoch ns of timestamp 0, so that wall time = base + ts (Kineto's meaning).

    ``session_start`` is the session's start on the events' clock (see ``events_span``).
    """
    if export.get("EXPORT_PARAM_TIME_NORMALIZE", "false").lower() == "true":
        return 0  # --ts-normalize=true: timestamps are already UTC epoch ns
    start = session_start
    utc = session_utc(db)
    if start is None or utc is None:
        return None
    shift = _number(db, "EXPORT_PARAM_TIME_SHIFT", export.get("EXPORT_PARAM_TIME_SHIFT") or "0")
    # An unreadable shift leaves the epoch unknown: a guess would misplace every wall time.
    return None if shift is None else as_int(utc[0] - start - shift)


def versions(db: Db, export: dict[str, str]) -> dict[str, str]:
    out = {}
    if "EXPORT_PRODUCT_VERSION" in export:
        out["nsys"] = export["EXPORT_PRODUCT_VERSION"]
    if "EXPORT_SCHEMA_VERSION" in export:
        out["nsys_export_schema"] = export["EXPORT_SCHEMA_VERSION"]
    env = dict(key_values(db, "TARGET_INFO_SYSTEM_ENV"))
    for key, name in (("CudaDriverVersion", "cuda_driver_version"), ("NvDriverVersion", "nvidia_driver")):
        if env.get(key):
            out[name] = env[key]
    return out


def diagnostics(db: Db) -> list[str]:
    """Capture errors nsys itself recorded (severity Error); warnings are mostly noise."""
    if not db.has("DIAGNOSTIC_EVENT", "severity", "text"):
        return []
    rows = db.conn.execute(
        "SELECT DISTINCT text FROM DIAGNOSTIC_EVENT WHERE severity = 3 AND text IS NOT NULL LIMIT 5"
    ).fetchall()
    return [f"nsys recorded a capture error: {' '.join(str(r[0]).split())[:200]}" for r in rows]


def devices(db: Db, used: pl.DataFrame) -> pl.DataFrame:
    """One row per CUDA device: TARGET_INFO_GPU when captured, else the ids the activity uses.

    ``used`` has the distinct (pid, device) pairs of GPU activity. Device ids in activity
    tables are CUDA ordinals; TARGET_INFO_CUDA_DEVICE (nsys >= 2025.1) maps them to GPUs per
    process, TARGET_INFO_GPU.cuDevice is the ordinal otherwise.
    """
    ids = sorted({int(d) for d in used.get_column("device").drop_nulls().to_list()})
    gpus: dict[int, dict[str, Any]] = {}
    t = "TARGET_INFO_GPU"
    if db.has(t, "id", "name"):
        c = partial(db.col, t)
        rows = db.conn.execute(
            f"""SELECT id, {c('cuDevice')}, name, {c('totalMemory')}, {c('computeMajor')},
            {c('computeMinor')}, {c('smCount')}, {c('maxWarpsPerSm')} * {c('threadsPerWarp')},
            {c('maxRegistersPerSm')}, {c('maxShmemPerSm')} FROM {t}"""
        ).fetchall()
        no_id = 0
        for r in rows:
            gpu_id = as_int(r[0])
            if gpu_id is None:
                no_id += 1
                continue
            numbers = [as_int(v) for v in r[3:]]
            cu_device = as_int(r[1])
            gpus[gpu_id] = {
                DeviceCol.DEVICE: gpu_id if cu_device is None else cu_device,
                DeviceCol.NAME: None if r[2] is None else str(r[2]),
                DeviceCol.TOTAL_MEM: numbers[0], DeviceCol.CC_MAJOR: numbers[1], DeviceCol.CC_MINOR: numbers[2],
                DeviceCol.NUM_SMS: numbers[3], DeviceCol.MAX_THREADS_PER_SM: numbers[4],
                DeviceCol.REGS_PER_SM: numbers[5], DeviceCol.SHARED_MEM_PER_SM: numbers[6],
            }
        if no_id:
            db.problems[f"{t}: {no_id} GPUs without an id; their properties are unknown"] = 1
    if db.has("TARGET_INFO_CUDA_DEVICE", "gpuId", "cudaId"):
        pairs = db.conn.execute("SELECT DISTINCT gpuId, cudaId FROM TARGET_INFO_CUDA_DEVICE").fetchall()
        known = [(as_int(gpu), as_int(cuda)) for gpu, cuda in pairs]
        by_ordinal = {cuda: gpus[gpu] for gpu, cuda in known if gpu in gpus and cuda is not None}
    else:
        by_ordinal = {int(g[DeviceCol.DEVICE]): g for g in gpus.values()}
    rows_out = []
    for ordinal in sorted(set(ids) | {d for d in by_ordinal if -(2**31) <= d < 2**31}):
        info = by_ordinal.get(ordinal, {})
        rows_out.append({col: info.get(col) for col in DEVICES_SCHEMA} | {DeviceCol.DEVICE: ordinal})
    if not rows_out:
        return pl.DataFrame(schema=DEVICES_SCHEMA)
    # Properties too large for their column (a corrupt cell) become unknown, not an error.
    wide = {col: pl.Int64() if dtype.is_integer() else dtype for col, dtype in DEVICES_SCHEMA.items()}
    return pl.DataFrame(rows_out, schema=wide).cast(dict(DEVICES_SCHEMA), strict=False)  # type: ignore[arg-type]


def threads(db: Db, pids: list[int], nvtx_names: pl.DataFrame) -> pl.DataFrame:
    """Process and thread names of the processes that have events (PROCESSES lists them all)."""
    frames = []
    if db.has("PROCESSES", "pid", "name") and pids:
        # Names only: a process whose pid is not an integer (a corrupt cell) keeps its events.
        odd = db.scalar("SELECT count(*) FROM PROCESSES WHERE typeof(pid) != 'integer'")
        if odd:
            db.problems[f"PROCESSES: {odd} processes with a pid that is not an integer: names not read"] = 1
        procs = db.frame("PROCESSES", "pid, name", {ThreadCol.PID: pl.Int64(), ThreadCol.NAME: pl.String()},
                         "typeof(pid) = 'integer'")
        frames.append(
            procs.filter(pl.col(ThreadCol.PID).is_in(pids)).select(
                ThreadCol.PID, pl.lit(None, dtype=pl.Int64).alias(ThreadCol.TID), ThreadCol.NAME
            )
        )
    if db.has("ThreadNames", "nameId", "globalTid") and pids:
        name = "(SELECT value FROM StringIds WHERE id = nameId)" if db.has("StringIds", "id", "value") else "NULL"
        names = db.frame(
            "ThreadNames", f"""{PID_SQL.format(c="globalTid")}, {TID_SQL.format(c="globalTid")}, {name}""",
            {ThreadCol.PID: pl.Int64(), ThreadCol.TID: pl.Int64(), ThreadCol.NAME: pl.String()},
        )
        frames.append(names.filter(pl.col(ThreadCol.PID).is_in(pids) & pl.col(ThreadCol.NAME).is_not_null()))
    if nvtx_names.height:
        # nvtxNameOsThread names only threads the OS did not name for nsys.
        known = pl.concat(frames).select(ThreadCol.PID, ThreadCol.TID) if frames else None
        extra = nvtx_names.select(ThreadCol.PID, ThreadCol.TID, ThreadCol.NAME)
        if known is not None:
            extra = extra.join(known.drop_nulls(), on=[ThreadCol.PID, ThreadCol.TID], how="anti")
        frames.append(extra)
    if not frames:
        return pl.DataFrame(schema=THREADS_SCHEMA)
    return (
        pl.concat(frames).cast(dict(THREADS_SCHEMA))  # type: ignore[arg-type]
        .unique(subset=[ThreadCol.PID, ThreadCol.TID], keep="first", maintain_order=True)
        .sort([ThreadCol.PID, ThreadCol.TID], nulls_last=False)
    )
