"""Rows an export can hold but the model cannot: GPU rows whose process or device is NULL, host
rows on no thread, and rows lasting longer than the capture could.

``globalPid`` is nullable in every schema version, ``deviceId`` in hand-edited or derived files,
but every GPU activity needs a device, and launches are found within a process. A row gets the
key when the rest of the file says what it must be, and is dropped otherwise; both are counted
in the reader's problems so the user sees them.
"""

from __future__ import annotations

import polars as pl

from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Kind
from tracewhy.readers.nsys.db import Db
from tracewhy.readers.nsys.tables import KEY

_GPU = pl.col("kind").is_in([k.value for k in GPU_ACTIVITY_KINDS])


def repair_keys(frame: pl.DataFrame, db: Db) -> pl.DataFrame:
    """``frame`` (concatenated slice parts) with every GPU activity given a pid and a device,
    and every host row a thread, or dropped."""
    host = ~_GPU & (pl.col("kind") != Kind.GPU_SYNC.value)
    # Counted before anything is filtered: a filter of the concatenated parts copies them (0.5 GB
    # for a 600 MB export), and a sound export has nothing to repair.
    if frame.select((host & (pl.col("pid").is_null() | pl.col("tid").is_null())).any()).item():
        threadless = frame.filter(host & (pl.col("pid").is_null() | pl.col("tid").is_null()))
        # Host analyses work per thread (nesting, the launching thread); a row on no thread
        # cannot be placed. GPU rows name no thread, only a process.
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(threadless.group_by("kind").len().iter_rows()))
        db.problems[f"host rows without a globalTid skipped ({kinds})"] = 1
        frame = frame.filter(~(host & (pl.col("pid").is_null() | pl.col("tid").is_null())))
    if not frame.select((_GPU & (pl.col("pid").is_null() | pl.col("device").is_null())).any()).item():
        return frame
    return _fill_device(_fill_pid(frame, db), db)


def _fill_pid(frame: pl.DataFrame, db: Db) -> pl.DataFrame:
    missing = _GPU & pl.col("pid").is_null()
    count = frame.filter(missing).height
    if not count:
        return frame
    # The processes that ran GPU work, else (no GPU row names one) every process in the file.
    pids = frame.filter(_GPU).get_column("pid").drop_nulls().unique()
    if not pids.len():
        pids = frame.get_column("pid").drop_nulls().unique()
    if pids.len() == 1:
        pid = int(pids[0])
        db.problems[f"{count} GPU activities have no globalPid: attributed to pid {pid}, the only "
                    "process in the file that ran GPU work"] = 1
        return frame.with_columns(pl.when(missing).then(pl.lit(pid)).otherwise(pl.col("pid")).alias("pid"))
    # Correlation and stream ids repeat across processes, so nothing else names the process.
    db.problems[f"{count} GPU activities have no globalPid, and {pids.len()} processes could have "
                "run them: skipped"] = 1
    return frame.filter(~missing)


def _fill_device(frame: pl.DataFrame, db: Db) -> pl.DataFrame:
    missing = _GPU & pl.col("device").is_null()
    count = frame.filter(missing).height
    if not count:
        return frame
    known = frame.filter(_GPU & pl.col("device").is_not_null())
    # A stream belongs to one context and a context to one device; a process that used one
    # device used it for everything.
    guess: pl.Expr = pl.lit(None, dtype=frame.schema["device"])
    for keys in (["pid", "stream"], ["pid"]):
        unique = (
            known.group_by(keys).agg(pl.col("device").unique())
            .filter(pl.col("device").list.len() == 1)
            .select(*keys, pl.col("device").list.first().alias(f"_dev_{len(keys)}"))
        )
        frame = frame.join(unique, on=keys, how="left")
        guess = pl.coalesce(guess, pl.col(f"_dev_{len(keys)}"))
    frame = frame.with_columns(
        pl.when(missing).then(guess).otherwise(pl.col("device")).alias("device")
    ).drop("_dev_2", "_dev_1").sort(KEY)  # joins need not keep the order; the keys number it
    unknown = frame.filter(_GPU & pl.col("device").is_null()).height
    if count > unknown:
        db.problems[f"{count - unknown} GPU activities have no deviceId: placed on the device their "
                    "stream or process used"] = 1
    if unknown:
        db.problems[f"{unknown} GPU activities have no deviceId and nothing in the file tells "
                    "their device: skipped"] = 1
    return frame.filter(~(_GPU & pl.col("device").is_null()))


def plausible_duration_ns(session: tuple[int | None, int | None]) -> int:
    """The longest a recorded row can last: twice the session plus a minute (GPU work launched
    before the capture began, ranges opened before it), or a year when the file gives no session.
    ``nsys_tables`` drops longer rows (one kernel of 4e18 ns made the GPU 100% busy)."""
    start, stop = session
    if start is not None and stop is not None and stop > start:
        return min(2 * (stop - start) + 60 * 10**9, 2**63 - 1)
    return 365 * 86400 * 10**9
