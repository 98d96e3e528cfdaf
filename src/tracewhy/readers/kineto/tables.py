"""The batches' columns joined into the Trace's tables: slices sorted by start, with ids that
follow time and their links made, and the side tables re-keyed from batch rows to those ids."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.model.linking import NEST_APART_ROWS, Nesting, link_slices, nest_rows
from tracewhy.model.schema import (
    COPY_ATTRS_SCHEMA,
    FLOWS_SCHEMA,
    HOST_KINDS,
    KERNEL_ATTRS_SCHEMA,
    KIND_CODE,
    KIND_DTYPE,
    MEMORY_SCHEMA,
    OP_ATTRS_SCHEMA,
    SLICES_SCHEMA,
    SYNC_ATTRS_SCHEMA,
    THREADS_SCHEMA,
    Col,
    Kind,
)
from tracewhy.readers.kineto.columns import EMPTY_SYNC_ATTRS, NULL_ID, code_set

#: A batch's kinds are a uint8 array of their codes (KIND_CODE): gathered from this, they are kinds.
_KIND_SERIES = pl.Series(tuple(KIND_CODE), dtype=KIND_DTYPE)
_EMPTY_FRAME = pl.DataFrame()
#: Whether each kind code is one of the host kinds the nesting takes.
_HOST_CODES = code_set(*HOST_KINDS)
#: The side tables, by their name in the Trace (and in a Batch).
_SIDE_SCHEMAS = (("kernel_attrs", KERNEL_ATTRS_SCHEMA), ("copy_attrs", COPY_ATTRS_SCHEMA),
                 ("sync_attrs", SYNC_ATTRS_SCHEMA), ("op_attrs", OP_ATTRS_SCHEMA))


@dataclass
class Batch:
    """One batch of slices in columns, with side tables keyed by batch-local row."""

    frame: pl.DataFrame
    kernel_attrs: pl.DataFrame
    copy_attrs: pl.DataFrame
    op_attrs: pl.DataFrame
    sync_attrs: pl.DataFrame = field(default_factory=lambda: EMPTY_SYNC_ATTRS)


def join_batches(batches: list[Batch], meanwhile: Callable[[pl.DataFrame, dict[str, pl.DataFrame]], None] | None = None
                 ) -> tuple[pl.DataFrame, dict[str, pl.DataFrame]]:
    """The slices table and the side tables (by their name in the Trace) of ``batches``, which
    are in file order; the list is emptied, so that the batches' columns go once joined.
    ``meanwhile``: ``link_slices``' (with the side tables), for work on the table whose launches
    are linked while the nesting is made.

    The slices are put in time order and linked (``link_slices``). From ``NEST_APART_ROWS`` host
    slices on, their nesting, which needs only their threads and times, starts as soon as the
    order is known, on a second thread, while this one puts the whole table in order, joins the
    side tables and finds the launches: numpy and polars work that lets the GIL go, on the
    reader's serial tail, where the second core has nothing else to do (271 MB trace, 505 k host
    slices: the tail, the metadata made ``meanwhile`` included, takes 0.20 s instead of 0.30)."""
    if not batches:
        empty = pl.DataFrame(schema=SLICES_SCHEMA)
        none = {name: pl.DataFrame(schema=schema) for name, schema in _SIDE_SCHEMAS}
        if meanwhile is not None:
            meanwhile(empty, none)
        return empty, none
    offsets = np.cumsum([0] + [b.frame.height for b in batches])
    # One copy of the columns at a time: the batches' frames are joined without copying
    # (chunked), the sort makes the one contiguous copy, and the batches let theirs go.
    frame = pl.concat([b.frame for b in batches], rechunk=False)
    for b in batches:
        b.frame = _EMPTY_FRAME
    # Sort by start time (file order breaks ties) so that ids follow time.
    ts = frame.get_column(Col.TS).to_numpy()
    order = np.argsort(ts, kind="stable")
    codes = frame.get_column(Col.KIND).to_numpy()[order]
    host_idx = np.flatnonzero(_HOST_CODES[codes])
    with contextlib.ExitStack() as stack:
        nesting: Future[Nesting] | None = None
        if host_idx.size >= NEST_APART_ROWS:
            # (The nesting's columns are copied out of the batches' chunks first, so that those go
            # once the table is in order.)
            columns = [frame.get_column(Col.PID).to_numpy(), frame.get_column(Col.TID).to_numpy(), ts,
                       frame.get_column(Col.DUR).to_numpy()]
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracewhy-nest"))
            nesting = pool.submit(_nest_in_order, columns, order[host_idx], host_idx,
                                  codes[host_idx] == KIND_CODE[Kind.CPU_OP.value], frame.height)
            del columns
        del ts, codes
        frame = _in_order(frame, order)  # (the batches' chunks go here)
        ordered = _as_slices(frame)
        del frame
        remap = _remap(order)
        del order
        side = {name: _side_table([getattr(b, name) for b in batches], offsets, remap, schema)
                for name, schema in _SIDE_SCHEMAS}
        batches.clear()
        slices = link_slices(ordered, nesting=None if nesting is None else nesting.result,
                             meanwhile=None if meanwhile is None else lambda launched: meanwhile(launched, side))
    return slices, side


Events = tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]


def join_events(memory: list[pl.DataFrame], flows: list[pl.DataFrame], thread_rows: list[tuple[int, int | None, str]],
                apart: contextlib.ExitStack | None = None) -> Future[Events]:
    """The batches' memory events, flows and thread names, each joined in time order: at once,
    or with ``apart``, on a second thread whose pool closes with that stack."""
    def join() -> Events:
        return (pl.concat(memory).sort("ts_ns", maintain_order=True) if memory else pl.DataFrame(schema=MEMORY_SCHEMA),
                pl.concat(flows).sort("ts_ns", maintain_order=True) if flows else pl.DataFrame(schema=FLOWS_SCHEMA),
                pl.DataFrame(thread_rows, schema=THREADS_SCHEMA, orient="row").unique(maintain_order=True))

    if apart is not None:
        return apart.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracewhy-join")).submit(join)
    done: Future[Events] = Future()
    done.set_result(join())
    return done


def _remap(order: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
    """Each row's place once the rows are in ``order``."""
    remap = np.empty(order.size, dtype=np.int64)
    remap[order] = np.arange(order.size)
    return remap


def _nest_in_order(columns: list[npt.NDArray[np.int64]], rows: npt.NDArray[np.intp], host_idx: npt.NDArray[np.intp],
                   is_op: npt.NDArray[np.bool_], n: int) -> Nesting:
    """``nest_rows`` of a table of ``n`` rows whose host rows, at ``host_idx``, are the ``rows`` of
    ``columns`` (pid, tid, ts and dur of the joined batches, without nulls: the builder writes
    every one). The list is emptied as the rows are taken."""
    taken = [np.take(values, rows) for values in columns]
    columns.clear()
    return nest_rows(n, host_idx, taken, is_op)


def _as_slices(frame: pl.DataFrame) -> pl.DataFrame:
    """The joined batches, in time order, with ids, kinds and nulls as the Trace holds them (the
    links still to be made)."""
    return frame.with_columns(
        pl.Series(Col.ID, np.arange(frame.height, dtype=np.int64)),
        _KIND_SERIES.gather(frame.get_column(Col.KIND)).alias(Col.KIND),
        *(pl.when(pl.col(c) != NULL_ID).then(pl.col(c)).alias(c)
          for c in (Col.STREAM, Col.CORRELATION, Col.EXTERNAL_ID)),
        pl.when(pl.col(Col.DEVICE) != NULL_ID).then(pl.col(Col.DEVICE)).cast(pl.Int32).alias(Col.DEVICE),
        pl.lit(None, dtype=pl.Int32).alias(Col.DEPTH),
        pl.lit(None, dtype=pl.Int64).alias(Col.PARENT),
        pl.lit(None, dtype=pl.Int64).alias(Col.LAUNCH),
        pl.lit(None, dtype=pl.Int64).alias(Col.OP),
    ).select(list(SLICES_SCHEMA))


def _in_order(frame: pl.DataFrame, order: npt.NDArray[np.intp]) -> pl.DataFrame:
    """The rows of ``frame`` at ``order``. Integer columns without nulls (all but the names, while
    batches are joined) are taken by numpy from their chunks joined: polars gathers across the
    batches' chunks in about four times as long (9 columns of 617k rows: 8 ms against 30 ms)."""
    rows = pl.Series(order)
    return pl.DataFrame([
        pl.Series(column.name, np.take(column.to_numpy(), order))
        if column.dtype.is_integer() and not column.has_nulls() else column.gather(rows)
        for column in frame.iter_columns()])


def _side_table(parts: list[pl.DataFrame], offsets: npt.NDArray[np.int64], remap: npt.NDArray[np.int64],
                schema: pl.Schema) -> pl.DataFrame:
    """Concatenate per-batch side tables, turning batch-local rows into final slice ids."""
    shifted = [p.with_columns(pl.col(Col.ID) + int(offsets[k])) for k, p in enumerate(parts) if p.height]
    if not shifted:
        return pl.DataFrame(schema=schema)
    table = pl.concat(shifted)
    ids = remap[table.get_column(Col.ID).to_numpy()]
    return table.with_columns(pl.Series(Col.ID, ids, dtype=pl.Int64)).sort(Col.ID)
