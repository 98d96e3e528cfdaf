"""CUDA caching-allocator snapshots (``torch.cuda.memory._dump_snapshot()`` pickles), read
without running anything the file names, into tables of segments, blocks and trace entries.

The layout is the one ``torch/cuda/memory.py`` documents for ``_snapshot()`` (torch 2.1-2.13):
``segments`` (each with its ``blocks``), ``device_traces`` (one list of TraceEntry per device,
recorded by ``_record_memory_history``) and ``allocator_settings``. Only builtin containers and
scalars are built: a pickle that names any module or class (the way a pickle runs code) is
refused before anything is called.

What it builds is bounded by the file's size before it is built: a pickle can reference one
object many times for two bytes each (memo references), so rows (segments, blocks, trace
entries, frames walked), the text copied into them and every integer (int64) are checked
against the file, and a file past them is refused with one line. Integers past int64 that could
share one hash are counted in the bytes before unpickling (colliding_ints.py).
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

import polars as pl

from tracewhy.errors import TraceError
from tracewhy.model.memory_snapshot import (
    BLOCKS_SCHEMA,
    EVENTS_SCHEMA,
    SEGMENTS_SCHEMA,
    EventCol,
    Frame,
    MemorySnapshot,
    SegCol,
    SnapshotBlockCol,
)
from tracewhy.readers.limits import fits_int64, object_budget
from tracewhy.readers.memory.colliding_ints import refuse_colliding_big_ints
from tracewhy.readers.source import is_gzip, os_error, read_bytes

#: The TraceEntry key each events column is read from (torch/cuda/memory.py ``TraceEntry``).
TRACE_KEYS: Final = {EventCol.ACTION: "action", EventCol.ADDR: "addr", EventCol.SIZE: "size",
                     EventCol.STREAM: "stream", EventCol.TIME_US: "time_us", EventCol.DEVICE_FREE: "device_free",
                     EventCol.STACK: "frames"}
#: Distinct stacks kept per lookup hint; beyond them a stack is interned by its content, as slow
#: as before but never quadratic in a file built to make every hint collide.
HINT_CANDIDATES: Final = 16
#: The fewest bytes a row (a segment, block, trace entry or frame of a stack walked) takes in a
#: snapshot torch writes: each is a dict of several fields, or a reference to a distinct frame
#: list, so no honest file holds more than one row per 8 bytes (torch's own are 40+ per entry).
#: A memo reference is 2 bytes: a file of them stands for millions of rows it does not hold.
MIN_BYTES_PER_ROW: Final = 8
#: Text copied into the tables (segment types, block states, actions, frame names): at most this
#: many times the file's size, plus a floor for small files. A string is stored once in the
#: pickle and may be referenced by every row; each row's copy is real memory in the tables.
TEXT_BYTES_PER_FILE_BYTE: Final = 16
TEXT_FLOOR_BYTES: Final = 16 << 20


class _Refused(pickle.UnpicklingError):
    """The pickle asks for something beyond plain data."""


class _DataOnly(pickle.Unpickler):
    """An unpickler that builds only what the pickle opcodes build by themselves (dict, list,
    tuple, str, bytes, int, float, bool, None): every global and persistent id is refused,
    so no callable can be reached and nothing is executed."""

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"it names {module}.{name}; only plain data is read from a snapshot")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("it refers to a persistent object; only plain data is read from a snapshot")


def load_plain_pickle(path: Path) -> Any:
    """The pickle's data, or a TraceError when it names any global, is cut off or is not a pickle."""
    return _load_sized(path)[0]


@contextmanager
def _cleanup_noise_quiet() -> Iterator[None]:
    """CPython's unpickler reads a counted bytearray (BYTEARRAY8) into a view of a new bytearray;
    when a forged length runs the process out of memory mid-read, the bytearray is freed with the
    view still exported and CPython prints "SystemError: deallocated bytearray object has
    exported buffers" (``PyErr_Print``, through ``sys.excepthook``; other teardown errors through
    ``sys.unraisablehook``) beside our one-line refusal (found by the fuzz). Such cleanup errors
    while a pickle is read or refused are not the user's news; any other error still prints."""
    previous_unraisable, previous_except = sys.unraisablehook, sys.excepthook

    def unraisable(u: Any) -> None:
        if not isinstance(u.exc_value, SystemError | BufferError):
            previous_unraisable(u)

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if not isinstance(value, SystemError | BufferError):
            previous_except(kind, value, tb)

    sys.unraisablehook, sys.excepthook = unraisable, excepthook
    try:
        yield
    finally:
        sys.unraisablehook, sys.excepthook = previous_unraisable, previous_except


def _load_sized(path: Path) -> tuple[Any, int]:
    """The pickle's data and the size of the pickle (inflated when gzip)."""
    with _cleanup_noise_quiet():
        return _load_sized_loud(path)


def _load_sized_loud(path: Path) -> tuple[Any, int]:
    try:
        with _pickle_stream(path) as (stream, size):
            refuse_colliding_big_ints(path, stream)
            with _gc_paused():
                return _DataOnly(stream).load(), size
    except _Refused as e:
        raise TraceError(path, f"refused as a memory snapshot: {e}") from None
    except OSError as e:
        raise os_error(path, e) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError, MemoryError,
            RecursionError, OverflowError) as e:
        raise TraceError(path, f"not a readable pickle ({type(e).__name__}: {e})") from None


@contextmanager
def _pickle_stream(path: Path) -> Iterator[tuple[IO[bytes], int]]:
    """The file itself when plain: the unpickler reads it frame by frame, so no copy of a
    100 MB file is held beside what it builds. Inflated bytes when gzip: ``read_bytes`` bounds
    what a small compressed file may inflate to."""
    if is_gzip(path):
        data = read_bytes(path)
        yield io.BytesIO(data), len(data)
        return
    with open(path, "rb") as f:
        yield f, os.fstat(f.fileno()).st_size


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Keep the cyclic collector off while a snapshot's millions of dicts and lists are built
    and walked: none of them is garbage yet, and each collection would traverse them all again
    (three times the load's own time on a 100 MB snapshot, bench/results_snapshot.md)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_memory_snapshot(path: str | Path) -> MemorySnapshot:
    """Read a snapshot pickle; a TraceError says why a file is not one."""
    p = Path(path)
    data, size = _load_sized(p)
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise TraceError(p, "not a CUDA memory snapshot: expected a dict with 'segments' "
                            "(torch.cuda.memory._snapshot())")
    traces = data.get("device_traces", [])
    if not isinstance(traces, list):
        raise TraceError(p, "memory snapshot 'device_traces' is not a list")
    budget = _Budget(p, object_budget(size, MIN_BYTES_PER_ROW), TEXT_FLOOR_BYTES + TEXT_BYTES_PER_FILE_BYTE * size)
    stacks = _Stacks(budget)
    try:
        with _gc_paused():
            segments, blocks = _segments(p, data["segments"], stacks, budget)
            events = _events(p, traces, stacks, budget)
    except RecursionError:  # frames that contain themselves: a pickle can build those
        raise TraceError(p, "memory snapshot frames nest too deeply to read") from None
    _sizes_a_device_holds(p, (segments, SegCol.TOTAL_SIZE), (segments, SegCol.ALLOCATED_SIZE),
                          (blocks, SnapshotBlockCol.SIZE), (blocks, SnapshotBlockCol.REQUESTED),
                          (events, EventCol.SIZE))
    settings = data.get("allocator_settings", {})
    plain = {str(k): v for k, v in settings.items() if isinstance(v, str | int | float | bool) or v is None} \
        if isinstance(settings, dict) else {}
    return MemorySnapshot(str(p), segments, blocks, events, tuple(stacks.items), plain)


@dataclass
class _Budget:
    """What a snapshot of this size may build: rows, and bytes of text copied into them. Rows
    are counted before they are built (the lengths of the lists that hold them), so a file of
    memo references is refused in the time it takes to sum a few lengths."""

    path: Path
    rows: int
    text: int
    rows_used: int = 0
    text_used: int = 0

    def take_rows(self, n: int) -> None:
        self.rows_used += n
        if self.rows_used > self.rows:
            raise TraceError(self.path, f"{self.rows_used} snapshot rows (segments, blocks, trace entries, frames) is "
                                        f"more than a file of this size can hold ({self.rows}): it repeats objects "
                                        "by reference; refusing")

    def take_text(self, n: int) -> None:
        self.text_used += n
        if self.text_used > self.text:
            raise TraceError(self.path, f"memory snapshot holds text past {self.text} bytes in its rows (one string "
                                        "referenced by many rows): refusing")

    def integers(self, what: str, values: list[Any]) -> None:
        """A TraceError when any of ``values`` (integers) is outside int64: no column holds it."""
        if values and not (fits_int64(min(values)) and fits_int64(max(values))):
            raise TraceError(self.path, f"memory snapshot {what} outside the 64-bit integers a table can hold")


class _Stacks:
    """Interns frame lists: the same stack allocates again and again.

    torch builds one dict per distinct frame and one list per captured traceback
    (``py_symbolize`` in torch/csrc/profiler/combined_traceback.cpp, torch 2.1-2.13), so two
    entries from one call site hold different lists of the same frame dicts. A list is first
    looked up by its length and the identity of three of its frames, then compared whole with
    ``==``, which passes over identical items at C speed: a million entries with 60-frame stacks
    cost one comparison each instead of one tuple of 60 frames each. The identities are those of
    objects in the loaded data, alive for as long as this interner is."""

    def __init__(self, budget: _Budget) -> None:
        self.budget = budget
        self.items: list[tuple[Frame, ...]] = []
        self.index: dict[tuple[Frame, ...], int] = {}
        self._by_hint: dict[tuple[int, ...], list[tuple[list[Any], int]]] = {}
        self._frames: dict[int, Frame] = {}

    def add(self, frames: object) -> int:
        if not isinstance(frames, list) or not frames:
            return -1
        n = len(frames)
        known = self._by_hint.setdefault((n, id(frames[n // 4]), id(frames[n // 2]), id(frames[-1 - n // 4])), [])
        for seen, found in known:
            if seen == frames:
                return found
        found = self._content_index(frames)
        if len(known) < HINT_CANDIDATES:
            known.append((frames, found))
        return found

    def _content_index(self, frames: list[Any]) -> int:
        self.budget.take_rows(len(frames))
        key = tuple(self._frame(f) for f in frames if isinstance(f, dict))
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = len(self.items)
            self.items.append(key)
        return found

    def _frame(self, f: dict[Any, Any]) -> Frame:
        frame = self._frames.get(id(f))
        if frame is None:
            filename, name = str(f.get("filename", "")), str(f.get("name", ""))
            self.budget.take_text(len(filename) + len(name))
            frame = self._frames[id(f)] = (filename, _int(f.get("line"), self.budget), name)
        return frame


#: No device holds a petabyte: a size past it is no allocation, and the replay's running totals
#: of such sizes would pass int64 (the fuzz's int64-max block size ended in an OverflowError).
MAX_SNAPSHOT_BYTES: Final = 2**50


def _sizes_a_device_holds(path: Path, *columns: tuple[pl.DataFrame, str]) -> None:
    """A TraceError naming the first size column holding a size past MAX_SNAPSHOT_BYTES."""
    for frame, col in columns:
        values = frame.get_column(col)
        # min and max, not abs(): abs of int64's minimum wraps to itself
        for v in (values.min(), values.max()) if frame.height else ():
            if isinstance(v, int) and abs(v) > MAX_SNAPSHOT_BYTES:
                raise TraceError(path, f"memory snapshot {col} of {v} bytes: no device holds that "
                                       f"(past ±{MAX_SNAPSHOT_BYTES >> 50} PiB)")


def _int(value: object, budget: _Budget) -> int:
    """``value`` when it is an integer an int64 column holds; 0 for anything else; a TraceError
    past int64 (not clamped: an address or size past it is no address or size)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not fits_int64(value):
            raise TraceError(budget.path, "memory snapshot integer outside the 64-bit integers a table can hold")
        return value
    return 0


def _segments(path: Path, raw: list[Any], stacks: _Stacks, budget: _Budget) -> tuple[pl.DataFrame, pl.DataFrame]:
    budget.take_rows(len(raw))
    budget.take_rows(sum(len(blocks) for seg in raw if isinstance(seg, dict)
                         and isinstance(blocks := seg.get("blocks"), list)))
    seg_rows: list[tuple[Any, ...]] = []
    block_rows: list[tuple[Any, ...]] = []
    for seg in raw:
        if not isinstance(seg, dict):
            raise TraceError(path, "memory snapshot segment is not a dict")
        device, address = _int(seg.get("device"), budget), _int(seg.get("address"), budget)
        segment_type = str(seg.get("segment_type", ""))
        budget.take_text(len(segment_type))
        seg_rows.append((device, address, _int(seg.get("total_size"), budget), _int(seg.get("allocated_size"), budget),
                         _int(seg.get("stream"), budget), segment_type, bool(seg.get("is_expandable"))))
        offset = address
        for b in seg.get("blocks", []) if isinstance(seg.get("blocks"), list) else []:
            if not isinstance(b, dict):
                continue
            size = _int(b.get("size"), budget)
            state = str(b.get("state", ""))
            budget.take_text(len(state))
            block_rows.append((device, address, _int(b.get("address", offset), budget), size,
                               _int(b.get("requested_size", size), budget), state, stacks.add(b.get("frames"))))
            # (an offset past int64 is a block address no column holds: refused with it)
            offset += size
    return (pl.DataFrame(seg_rows, schema=SEGMENTS_SCHEMA, orient="row"),
            pl.DataFrame(block_rows, schema=BLOCKS_SCHEMA, orient="row"))


def _events(path: Path, traces: list[Any], stacks: _Stacks, budget: _Budget) -> pl.DataFrame:
    """One column at a time: a long run records a million entries, and a comprehension per
    field, checked by type in one C-speed pass, is several times faster than a tuple per entry."""
    columns: dict[str, list[Any]] = {name: [] for name in EVENTS_SCHEMA}
    budget.take_rows(sum(len(trace) for trace in traces if isinstance(trace, list)))
    for device, trace in enumerate(traces):
        if not isinstance(trace, list):
            raise TraceError(path, f"memory snapshot trace of device {device} is not a list")
        seqs = [seq for seq, e in enumerate(trace) if isinstance(e, dict)]
        entries = trace if len(seqs) == len(trace) else [trace[seq] for seq in seqs]
        columns[EventCol.DEVICE] += [device] * len(entries)
        columns[EventCol.SEQ] += seqs
        actions = [e.get(TRACE_KEYS[EventCol.ACTION], "") for e in entries]
        actions = actions if set(map(type, actions)) <= {str} else list(map(str, actions))
        budget.take_text(sum(map(len, actions)))
        columns[EventCol.ACTION] += actions
        for name in (EventCol.ADDR, EventCol.SIZE, EventCol.STREAM):
            values = [e.get(TRACE_KEYS[name]) for e in entries]
            if not set(map(type, values)) <= {int}:
                values = [_int(v, budget) for v in values]
            budget.integers(TRACE_KEYS[name], values)
            columns[name] += values
        for name in (EventCol.TIME_US, EventCol.DEVICE_FREE):
            values = [e.get(TRACE_KEYS[name]) for e in entries]
            if not set(map(type, values)) <= {int, type(None)}:
                values = [v if isinstance(v, int) and not isinstance(v, bool) else None for v in values]
            budget.integers(TRACE_KEYS[name], [v for v in values if v is not None])
            columns[name] += values
        columns[EventCol.STACK] += [stacks.add(e.get(TRACE_KEYS[EventCol.STACK])) for e in entries]
    return pl.DataFrame(columns, schema=EVENTS_SCHEMA)
