"""The NVTX_EVENTS table of an Nsight Systems export as annotation slices: ranges and marks with
their domains and styles (``nvtx_attrs``), and the thread names NVTX recorded."""

from __future__ import annotations

from functools import partial
from typing import Final

import polars as pl

from tracewhy.model.linking import within
from tracewhy.model.schema import NVTX_ATTRS_SCHEMA, Kind, NvtxCol
from tracewhy.readers.nsys.db import PID_SQL, TID_SQL, Db, Strings
from tracewhy.readers.nsys.tables import KEY, as_part, empty_part, int_max, named, require, with_duration

# ENUM_NSYS_EVENT_TYPE values of NVTX_EVENTS rows.
NVTX_MARK: Final = 34
NVTX_THREAD_NAME: Final = 39
NVTX_DOMAIN_CREATE: Final = 75
NVTX_RANGE_STYLE: Final = {59: "PushPop", 60: "StartEnd", 70: "PushPop", 71: "StartEnd"}


def nvtx_part(db: Db, strs: Strings, offset: int) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """NVTX ranges and marks as annotations, their attributes, and NVTX thread names."""
    t = "NVTX_EVENTS"
    no_threads = pl.DataFrame(schema={"pid": pl.Int64(), "tid": pl.Int64(), "name": pl.String()})
    if not require(db, t, "start", "eventType", "globalTid"):
        return empty_part(), pl.DataFrame(), no_threads
    c = partial(db.col, t)
    types = ", ".join(str(v) for v in (NVTX_MARK, NVTX_THREAD_NAME, NVTX_DOMAIN_CREATE, *NVTX_RANGE_STYLE))
    cols = f"""rowid, start, {c('end')}, eventType, {PID_SQL.format(c="globalTid")},
        {TID_SQL.format(c="globalTid")}, {TID_SQL.format(c=c('endGlobalTid'))},
        {c('domainId')}, {c('category')}, {c('text')}, {c('textId')}"""
    schema = {"rowid": pl.Int64(), "start": pl.Int64(), "end": pl.Int64(), "eventType": pl.Int64(),
              "pid": pl.Int64(), "tid": pl.Int64(), NvtxCol.END_TID: pl.Int64(),
              NvtxCol.DOMAIN_ID: pl.Int64(), NvtxCol.CATEGORY: pl.Int64(), "text": pl.String(),
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
        .unique(subset=["pid", NvtxCol.DOMAIN_ID], keep="first")
        .select("pid", NvtxCol.DOMAIN_ID, pl.col("_text").alias(NvtxCol.DOMAIN))
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
        last = max(int_max(e.get_column("start")), int_max(e.get_column("end")))
    else:
        last = db.scalar(f"SELECT max(coalesce(max({ints.format('start')}), 0), "
                         f"coalesce(max({ints.format(c('end'))}), 0)) FROM {t}")
    style = pl.col("eventType").replace_strict(
        {**NVTX_RANGE_STYLE, NVTX_MARK: "Mark"}, default=None, return_dtype=NVTX_ATTRS_SCHEMA[NvtxCol.STYLE]
    )
    ev = e.with_columns(style.alias(NvtxCol.STYLE)).drop("eventType")
    del e
    if ev.get_column(NvtxCol.STYLE).null_count():
        ev = ev.filter(pl.col(NvtxCol.STYLE).is_not_null())
    ev = ev.with_columns(_domain_names(ev, domains))
    open_ranges = ev.filter(pl.col("end").is_null() & (pl.col(NvtxCol.STYLE) != "Mark")).height
    if open_ranges:
        db.problems[f"{open_ranges} NVTX ranges never ended; they run to the last NVTX timestamp"] += 1
    ev = ev.with_columns(
        pl.when(pl.col(NvtxCol.STYLE) == "Mark").then(pl.col("start"))
        .otherwise(pl.col("end").fill_null(int(last or 0))).alias("end"),
        pl.when(pl.col(NvtxCol.DOMAIN).is_not_null())
        .then(pl.format("{}:{}", NvtxCol.DOMAIN, pl.col("_text").fill_null("")))
        .otherwise(pl.col("_text").fill_null("<unnamed NVTX range>")).alias("name"),
    )
    ev = with_duration(ev, t, db)
    part = as_part(ev, Kind.ANNOTATION.value, offset)
    attrs = ev.select(part.get_column(KEY), pl.col("rowid").alias(NvtxCol.RANGE_ID), NvtxCol.STYLE,
                      NvtxCol.DOMAIN_ID, NvtxCol.DOMAIN, NvtxCol.CATEGORY, NvtxCol.END_TID)
    return part, attrs, thread_names


def _domain_names(ev: pl.DataFrame, domains: pl.DataFrame) -> pl.Series:
    """Each event's domain name (null: none, or the default domain), looked up by its process
    and domain id in ``domains`` (pid, domain_id, domain; the pair unique).

    Where the pair packs into one integer (a pid is 24 bits, ``PID_SQL``; domain ids are small
    counters) it is one lookup per event: a join on the two columns took 1.1 s of a 4.8 M-range
    table's read, the lookup under 0.1 s. Any other ids are joined."""
    keys = ["pid", NvtxCol.DOMAIN_ID]
    if all(within(frame.get_column(name), limit) for frame in (ev, domains)
           for name, limit in (("pid", _PID_LIMIT), (NvtxCol.DOMAIN_ID, _DOMAIN_ID_LIMIT))):
        packed = pl.col("pid") * _DOMAIN_ID_LIMIT + pl.col(NvtxCol.DOMAIN_ID)
        known = domains.select(packed).to_series()
        return ev.select(packed.replace_strict(known, domains.get_column(NvtxCol.DOMAIN), default=None,
                                               return_dtype=pl.String()).alias(NvtxCol.DOMAIN)).to_series()
    return ev.select(keys).join(domains, on=keys, how="left", maintain_order="left").get_column(NvtxCol.DOMAIN)


_PID_LIMIT: Final = 1 << 24
_DOMAIN_ID_LIMIT: Final = 1 << 38


#: Rowids of NVTX_EVENTS fetched at once (``nvtx_part``): a million rows are about 0.1 GB of
#: columns while fetched, against 0.9 GB for the 4.8 M rows of a 600 MB export fetched whole.
NVTX_CHUNK_ROWIDS: Final = 1_000_000


def _nvtx_texts(events: pl.DataFrame, strs: Strings) -> tuple[pl.DataFrame, int]:
    """NVTX rows with their text in ``_text`` instead of the inline ``text`` and the registered
    ``textId``; and how many name a registered string StringIds lacks."""
    # A string registered with nvtxDomainRegisterString is in textId, else the text is inline.
    e = named(events, "textId", strs, "_registered")
    del events
    lost = e.select((pl.col("textId").is_not_null() & pl.col("_registered").is_null()).sum()).item()
    e = e.with_columns(pl.coalesce("_registered", "text").alias("_text")).drop("_registered", "text", "textId")
    return e, int(lost)
