"""Columns from decoded Kineto events: ids and times as int64 arrays, and the side tables
(kernels, copies' bytes, syncs, ops) built from the events' decoded args."""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import chain
from typing import Any, cast

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.model.schema import (
    COPY_ATTRS_SCHEMA,
    COPY_KINDS,
    KERNEL_ATTRS_SCHEMA,
    KIND_CODE,
    MEMORY_KINDS,
    OP_ATTRS_SCHEMA,
    SYNC_ATTRS_SCHEMA,
    Kind,
)
from tracewhy.readers.kineto.events import Event, GpuArgs, LinkArgs, OpArgs, SyncArgs, decode_args

#: An id no event has: "not known" while columns are built (null in the table).
NULL_ID = np.iinfo(np.int64).min
_I64_MIN, _I64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
_COPY_NAME = re.compile(r"Memcpy\s+(\w+)\s*(?:\((\w+)\s*->\s*(\w+)\))?")


def code_set(*kinds: Kind) -> npt.NDArray[np.bool_]:
    """Whether each kind code (a batch's kinds are a uint8 array of KIND_CODE) is one of ``kinds``:
    a table indexed by code."""
    table = np.zeros(256, dtype=np.bool_)
    table[[KIND_CODE[k.value] for k in kinds]] = True
    return table


def to_int(value: object) -> int:
    """pid/tid as int: Kineto writes strings for some ("25738", "stream 7", "Spans")."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        digits = value.rsplit(" ", 1)[-1]
        if digits.lstrip("-").isdigit() and fits_i64(number := int(digits)):
            return number
    return -1


def as_int(value: int | str | None) -> int | None:
    """An integer arg that some writers quote ("256", "0x0")."""
    if value is None or isinstance(value, int):
        return value
    try:
        number = int(value, 0)
    except ValueError:
        return None
    return number if fits_i64(number) else None


def fits_i64(number: float) -> bool:
    return _I64_MIN <= number <= _I64_MAX


def int_array(values: list[Any]) -> npt.NDArray[np.int64]:
    """pid, tid or ids as int64 (``to_int`` for the strings some are written as). ``np.fromiter``
    with a count converts a list as ``np.array`` does, value for value, in half the time."""
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except (TypeError, ValueError, OverflowError):
        return np.array([to_int(v) for v in values], dtype=np.int64)


def float_array(values: list[float]) -> npt.NDArray[np.float64]:
    """Times or durations (floats, as decoded) as a float64 array (``np.fromiter``: see ``int_array``)."""
    return np.fromiter(values, dtype=np.float64, count=len(values))


def us_to_ns(us: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Microseconds (float) to integer nanoseconds without the rounding of ``us * 1000``.

    Epoch-based microsecond values (~1.7e15) leave float64 no room for nanoseconds once
    multiplied; splitting off the integer part first keeps every digit the double holds.
    """
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


#: The side tables of a batch that has no rows for them.
EMPTY_KERNEL_ATTRS = pl.DataFrame(schema=KERNEL_ATTRS_SCHEMA)
EMPTY_COPY_ATTRS = pl.DataFrame(schema=COPY_ATTRS_SCHEMA)
EMPTY_OP_ATTRS = pl.DataFrame(schema=OP_ATTRS_SCHEMA)
EMPTY_SYNC_ATTRS = pl.DataFrame(schema=SYNC_ATTRS_SCHEMA)


def sync_attrs_table(evs: list[Event], syncs: npt.NDArray[np.intp]) -> pl.DataFrame:
    """Sync rows' wait targets (their args decoded again, with the keys only they carry: the
    other device rows are not slowed by them); -1 is none."""
    args = decode_args([evs[i].args for i in syncs.tolist()], SyncArgs, {})
    waits = [(i, a.wait_on_stream, a.wait_record_correlation) for i, a in zip(syncs.tolist(), args, strict=True)
             if a is not None and a.wait_on_stream is not None and a.wait_on_stream >= 0]
    if not waits:
        return EMPTY_SYNC_ATTRS
    return pl.DataFrame({
        "id": [i for i, _, _ in waits],
        "wait_stream": [w for _, w, _ in waits],
        "wait_record_correlation": [c if c is not None and c >= 0 else None for _, _, c in waits],
    }, schema=SYNC_ATTRS_SCHEMA)


def _triple(values: list[int] | str | None) -> tuple[int | None, int | None, int | None]:
    if isinstance(values, list) and len(values) == 3:
        return values[0], values[1], values[2]
    return None, None, None


def _xyz(values: list[list[int] | str | None]) -> tuple[npt.NDArray[np.int64] | list[int | None], ...]:
    """The x, y and z columns of grids or blocks, null where one is not three integers. When every
    one is (as CUDA writes them; the decoder checked that each item is an int64) numpy takes them
    all in one call; text (Triton writes it), a missing one or another length leaves each to
    ``_triple``."""
    if all(type(v) is list and len(v) == 3 for v in values):
        rows = cast(list[list[int]], values)
        table = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=3 * len(rows)).reshape(-1, 3)
        return table[:, 0], table[:, 1], table[:, 2]
    triples = [_triple(v) for v in values]
    return [t[0] for t in triples], [t[1] for t in triples], [t[2] for t in triples]


class Ids:
    """The correlation and external ids of a batch's slices, ``NULL_ID`` where not known."""

    def __init__(self, n: int) -> None:
        self.correlation = np.full(n, NULL_ID, dtype=np.int64)
        self.external = np.full(n, NULL_ID, dtype=np.int64)

    def fill(self, rows: npt.NDArray[np.intp], args: Sequence[LinkArgs | None]) -> None:
        # (Through np.fromiter: a list assigned to rows is converted as np.array does, slower.)
        self.correlation[rows] = int_array([NULL_ID if a is None or (c := a.correlation) is None else c for a in args])
        # "External id" since PyTorch 1.10, "external id" before.
        self.external[rows] = int_array([NULL_ID if a is None else x if (x := a.external_id) is not None else
                                         NULL_ID if (y := a.external_id_legacy) is None else y for a in args])


def with_args(rows: npt.NDArray[np.intp], codes: npt.NDArray[np.uint8], gpu: list[GpuArgs | None],
              kinds: tuple[int, ...]) -> list[tuple[int, int, GpuArgs]]:
    """(row, kind code, args) of the device activities at ``rows`` of these kinds that have args."""
    return [(i, c, a) for i, c, a in zip(rows.tolist(), codes[rows].tolist(), gpu, strict=True)
            if a is not None and c in kinds]


#: A transfer direction as MTIA's DMA requests write it: DEVICE_TO_HOST, HOST_TO_DEVICE...
_DIRECTION = re.compile(r"(HOST|DEVICE)_TO_(HOST|DEVICE)", re.IGNORECASE)
_SIDE_LETTER = {"host": "H", "device": "D"}


def device_event_kinds(rows: npt.NDArray[np.intp], codes: npt.NDArray[np.uint8],
                       gpu: list[GpuArgs | None]) -> dict[str, int]:
    """Re-kind the device "kernels" at ``rows`` whose args say they are not work: a transfer
    direction makes a copy (MTIA's ``dma_request``), an event sequence number a sync record
    (MTIA's ``event_record`` and ``event_wait``, whose duration is a stream waiting on another).
    MTIA writes all of them under one category, mtia_ccp_events, with its command processor's
    work; only the args tell them apart. ``codes`` is changed in place; returns how many rows
    went to each kind."""
    kernel = KIND_CODE[Kind.KERNEL.value]
    moved: dict[str, list[int]] = {Kind.MEMCPY.value: [], Kind.GPU_SYNC.value: []}
    for i, c, a in zip(rows.tolist(), codes[rows].tolist(), gpu, strict=True):
        if c == kernel and a is not None:
            if a.direction is not None:
                moved[Kind.MEMCPY.value].append(i)
            elif a.seq_num is not None:
                moved[Kind.GPU_SYNC.value].append(i)
    for kind, at in moved.items():
        codes[at] = KIND_CODE[kind]
    return {kind: len(at) for kind, at in moved.items()}


def _direction(text: str) -> tuple[str, str, str]:
    """(copy kind, source memory, destination memory) of a DMA direction; the host side's
    memory (pageable or pinned) is not written."""
    m = _DIRECTION.fullmatch(text.strip())
    if m is None:
        return "unknown", "unknown", "unknown"
    src, dst = m.group(1).lower(), m.group(2).lower()
    return (f"{_SIDE_LETTER[src]}to{_SIDE_LETTER[dst]}", "Device" if src == "device" else "unknown",
            "Device" if dst == "device" else "unknown")


def kernel_attrs_table(rows: npt.NDArray[np.intp], codes: npt.NDArray[np.uint8],
                       gpu: list[GpuArgs | None]) -> pl.DataFrame:
    kernel = KIND_CODE[Kind.KERNEL.value]
    pick = with_args(rows, codes, gpu, (kernel,))
    if not pick:
        return EMPTY_KERNEL_ATTRS
    a = [x for _, _, x in pick]
    grid_x, grid_y, grid_z = _xyz([x.grid for x in a])
    block_x, block_y, block_z = _xyz([x.block for x in a])
    return pl.DataFrame({
        "id": [i for i, _, _ in pick],
        "grid_x": grid_x, "grid_y": grid_y, "grid_z": grid_z,
        "block_x": block_x, "block_y": block_y, "block_z": block_z,
        "registers_per_thread": [x.registers for x in a],
        "shared_mem_bytes": [x.shared_memory for x in a],
        "blocks_per_sm": [x.blocks_per_sm for x in a],
        "warps_per_sm": [x.warps_per_sm for x in a],
        "est_occupancy_pct": [x.occupancy_pct for x in a],
    }, schema=KERNEL_ATTRS_SCHEMA)


def copy_attrs_table(rows: npt.NDArray[np.intp], codes: npt.NDArray[np.uint8], gpu: list[GpuArgs | None],
                     evs: list[Event], names: dict[str, tuple[str, str, str]]) -> pl.DataFrame:
    """The bytes of the copies and memsets at ``rows``, and each copy's kind and memories as its
    args' direction (a DMA request) or else its name says them (``names``: those already parsed,
    by name; new ones are added)."""
    memcpy, memset = KIND_CODE[Kind.MEMCPY.value], KIND_CODE[Kind.MEMSET.value]
    pick = with_args(rows, codes, gpu, (memcpy, memset))
    if not pick:
        return EMPTY_COPY_ATTRS
    parsed = [(None, None, None) if c != memcpy else _direction(a.direction) if a.direction is not None
              else _copy_kind(evs[i].name, names) for i, c, a in pick]
    return pl.DataFrame({
        "id": [i for i, _, _ in pick],
        "bytes": [as_int(a.bytes if a.bytes is not None else a.size) for _, _, a in pick],
        "copy_kind": [p[0] for p in parsed],
        "src_mem": [p[1] for p in parsed],
        "dst_mem": [p[2] for p in parsed],
    }, schema=COPY_ATTRS_SCHEMA)


def _copy_kind(name: str, names: dict[str, tuple[str, str, str]]) -> tuple[str, str, str]:
    parsed = names.get(name)
    if parsed is None:
        m = _COPY_NAME.match(name)
        parsed = ("unknown", "unknown", "unknown") if m is None else (
            _known(m.group(1), COPY_KINDS), _known(m.group(2), MEMORY_KINDS), _known(m.group(3), MEMORY_KINDS))
        names[name] = parsed
    return parsed


def _known(value: str | None, allowed: tuple[str, ...]) -> str:
    return value if value is not None and value in allowed else "unknown"


def op_attrs_table(rows: npt.NDArray[np.intp], ops: list[OpArgs | None]) -> pl.DataFrame:
    """The attributes of the ops and annotations at ``rows``: one row for each that carries one of
    input shapes, a sequence number, flops, a call stack or a collective name (the other columns
    come with one of them). Most ops carry none (only their ids): they are passed over before any
    column is built."""
    # An op has a row when its args give a value in one of the columns that make a row:
    # input_dims (any raw value: only an absent one is null), sequence_number, flops (one that
    # fits int64), call_stack or collective_name. (Tested inline: a call per op cost more than the test.)
    pick = [(i, x) for i, x in zip(rows.tolist(), ops, strict=True) if x is not None and (
        x.input_dims or x.sequence is not None or x.call_stack is not None or x.collective is not None
        or (x.flops is not None and fits_i64(x.flops)))]
    if not pick:
        return EMPTY_OP_ATTRS
    a = [x for _, x in pick]
    return pl.DataFrame({
        "id": [i for i, _ in pick],
        # Whitespace dropped from shapes so that "[[2, 3]]" and "[[2,3]]" group together.
        "input_dims": _texts([x.input_dims for x in a], squeeze=True),
        "input_types": _texts([x.input_types for x in a]),
        "concrete_inputs": _texts([x.concrete_inputs for x in a]),
        "sequence_number": [x.sequence for x in a],
        "fwd_thread_id": [x.fwd_tid for x in a],
        "flops": [int(x.flops) if x.flops is not None and fits_i64(x.flops) else None for x in a],
        "call_stack": [x.call_stack for x in a],
        "collective_name": [x.collective for x in a],
        "in_msg_nelems": [x.in_nelems for x in a],
        "out_msg_nelems": [x.out_nelems for x in a],
        "group_size": [x.group_size for x in a],
        "dtype": [x.dtype for x in a],
        "process_group": [x.pg_name for x in a],
    }, schema=OP_ATTRS_SCHEMA)


def _texts(raws: list[msgspec.Raw], *, squeeze: bool = False) -> list[str | None]:
    """Raw JSON values as text (None for an absent one), without spaces if ``squeeze``. JSON
    text has no NUL byte, so one joined decode, split at NULs, gives each."""
    joined = b"\x00".join(raws)
    if squeeze:
        joined = joined.translate(None, b" ")  # (a space byte is never part of a UTF-8 sequence)
    return [t or None for t in joined.decode("utf-8", "replace").split("\x00")]
