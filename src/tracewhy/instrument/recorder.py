"""Block timers and stage clocks that write tracewhy's instrument log (JSON Lines, one per rank).

Runs inside the user's job, so it never imports tracewhy's analysis stack and imports torch only
when the job already has it. Host times come from ``time.perf_counter_ns`` (one monotonic clock
per process: durations on it are exact; instants from two ranks are never compared). On CUDA a
block also records a pair of CUDA events on the current stream without synchronizing; their
elapsed time is resolved when the end event is known complete (``query()`` at a later block's
end) or at ``flush()``, so the overlap being measured is left alone. ``sync=True`` is
attribution mode: the block synchronizes at its end and every record says so.

The record format (``LOG_FORMAT``) is documented in docs/inputs/instrument-logs.md: a
``header`` line first, then ``mark`` and ``block`` lines. Records are kept in memory and written
at ``flush()`` (also at interpreter exit), so a block costs no I/O.
"""

from __future__ import annotations

import atexit
import functools
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec

from tracewhy.instrument import torch_hooks

#: Version of the record layout; fields are only ever added, never renamed.
LOG_FORMAT: Final = 1
#: ``<directory>/tracewhy-instrument.rank<R>.jsonl``.
LOG_NAME: Final = "tracewhy-instrument.rank{rank}.jsonl"
ENV_DIR: Final = "TRACEWHY_INSTRUMENT_DIR"
#: Records kept before the finished ones are written out (bounded memory in long jobs).
_FLUSH_EVERY: Final = 10_000

F = TypeVar("F", bound=Callable[..., Any])


#: One record as kept in memory until ``flush()``: a plain tuple (a dict per block cost 1 us).
#: ("block", step, name, start_ns, host_ns, depth, chunk, sync, events) or
#: ("mark", chunk, name, t_ns, events); ``events``: (start, end) CUDA events or None.
_Record = tuple[Any, ...]


class _TimedBlock:
    """The context manager behind ``Recorder.block`` (a class: ``@contextmanager``'s generator
    cost more than the rest of the block together)."""

    __slots__ = ("_chunk", "_depth", "_hooks", "_name", "_rec", "_start", "_step", "_sync")

    def __init__(self, rec: Recorder, name: str, step: int | None, chunk: int | None, sync: bool) -> None:
        self._rec, self._name, self._step, self._chunk, self._sync = rec, name, step, chunk, sync

    def __enter__(self) -> None:
        local = self._rec._local
        self._depth = getattr(local, "depth", 0)
        local.depth = self._depth + 1
        self._hooks = torch_hooks.enter(self._name, events=self._rec.cuda_events)
        self._start = time.perf_counter_ns()

    def __exit__(self, *exc: object) -> None:
        if self._sync:
            torch_hooks.synchronize()
        end = time.perf_counter_ns()
        events = torch_hooks.exit(self._hooks)
        rec = self._rec
        rec._local.depth = self._depth
        step = rec.step if self._step is None else self._step
        rec._add(("block", step, self._name, self._start, end - self._start, self._depth, self._chunk, self._sync,
                  events))


@dataclass
class Recorder:
    """One rank's log. Usually the process-wide one from ``configure()``/``recorder()``."""

    directory: Path
    rank: int
    world_size: int
    sync: bool = False
    cuda_events: bool = True
    step: int = 0
    _records: list[_Record] = field(default_factory=list)
    _local: threading.local = field(default_factory=threading.local)
    _header_written: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def path(self) -> Path:
        return self.directory / LOG_NAME.format(rank=self.rank)

    def header(self) -> dict[str, Any]:
        return {
            "type": "header", "format": LOG_FORMAT, "rank": self.rank, "world_size": self.world_size,
            "clock": "perf_counter_ns", "sync": self.sync, "cuda_events": self.cuda_events and torch_hooks.cuda_ready(),
            "device": torch_hooks.device_name(), "pid": os.getpid(), "host": platform.node(),
            "versions": {"python": platform.python_version(), **torch_hooks.versions()},
        }

    def next_step(self, step: int | None = None) -> int:
        """Start the next step (or ``step``); blocks opened afterwards carry it."""
        self.step = self.step + 1 if step is None else step
        return self.step

    def block(self, name: str, *, step: int | None = None, chunk: int | None = None,
              sync: bool | None = None) -> _TimedBlock:
        """Time ``name``: host ns always, GPU ns on CUDA (events, resolved later)."""
        return _TimedBlock(self, name, step, chunk, self.sync if sync is None else sync)

    def mark(self, name: str, *, chunk: int, cuda: bool = False) -> None:
        """A named instant of ``chunk`` on this rank's clock (and a CUDA event when ``cuda``)."""
        t = time.perf_counter_ns()
        self._add(("mark", chunk, name, t, torch_hooks.mark_event() if cuda else None))

    def _add(self, record: _Record) -> None:
        # Under the lock: ``flush`` swaps the list, and a record appended by another thread to
        # the list it just took would be lost (the lock costs ~0.1 us of a block's ~3.6 us).
        with self._lock:
            self._records.append(record)
            full = len(self._records) >= _FLUSH_EVERY
        if full:
            self.flush(wait=False)

    def _as_dict(self, r: _Record, gpu: int | None) -> dict[str, Any]:
        if r[0] == "mark":
            out = {"type": "mark", "rank": self.rank, "chunk": r[1], "name": r[2], "t_ns": r[3]}
            if r[4] is not None:
                out["gpu_t_ns"] = gpu
            return out
        _, step, name, start, host, depth, chunk, sync, _events = r
        out = {"type": "block", "rank": self.rank, "step": step, "name": name, "start_ns": start,
               "host_ns": host, "gpu_ns": gpu, "depth": depth}
        if chunk is not None:
            out["chunk"] = chunk
        if sync:
            out["sync"] = True
        return out

    def flush(self, wait: bool = True) -> Path:
        """Write every finished record; with ``wait``, first wait for the GPU work still timed
        (the only place the recorder blocks on the device, unless ``sync``)."""
        with self._lock:
            records, self._records = self._records, []
            ready: list[dict[str, Any]] = []
            for i, r in enumerate(records):
                events = r[-1]
                gpu = torch_hooks.resolve(events, wait=wait) if events is not None else None
                if events is not None and gpu is None:  # still running: keep it and what follows, in order
                    self._records[:0] = records[i:]
                    break
                ready.append(self._as_dict(r, gpu))
            if not ready and self._header_written:
                return self.path
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab" if self._header_written else "wb") as f:
                if not self._header_written:
                    f.write(msgspec.json.encode(self.header()) + b"\n")
                    self._header_written = True
                f.writelines(msgspec.json.encode(r) + b"\n" for r in ready)
        return self.path


_default: Recorder | None = None


def configure(directory: str | Path | None = None, *, rank: int | None = None, world_size: int | None = None,
              sync: bool = False, cuda_events: bool = True) -> Recorder:
    """Set up this process's log: ``directory`` (default ``$TRACEWHY_INSTRUMENT_DIR`` or the
    working directory), rank and world size (default ``torch.distributed``, else ``RANK`` /
    ``WORLD_SIZE``, else 0 and 1), ``sync=True`` for attribution mode."""
    global _default
    if _default is not None:
        _default.flush()
    where = Path(directory if directory is not None else os.environ.get(ENV_DIR, "."))
    r, w = torch_hooks.rank_and_world()
    _default = Recorder(directory=where, rank=r if rank is None else rank,
                        world_size=w if world_size is None else world_size, sync=sync, cuda_events=cuda_events)
    return _default


def recorder() -> Recorder:
    """The process-wide Recorder, configured with defaults on first use."""
    return _default if _default is not None else configure()


def flush() -> Path | None:
    """Write the process-wide log (waiting for GPU timings); its path, or None if never used."""
    return _default.flush() if _default is not None else None


def next_step(step: int | None = None) -> int:
    return recorder().next_step(step)


class block:
    """``with block("denoise"):`` or ``@block("denoise")``: an NVTX range and a
    ``record_function`` of the same name (when a profiler is running) around the code, timed on
    the host and, on CUDA, on the GPU without synchronizing. ``sync=True``: attribution mode."""

    def __init__(self, name: str, *, step: int | None = None, chunk: int | None = None,
                 sync: bool | None = None) -> None:
        self.name, self.step, self.chunk, self.sync = name, step, chunk, sync
        self._open: list[Any] = []  # a stack: the same block object may be entered again inside itself

    def __enter__(self) -> None:
        cm = recorder().block(self.name, step=self.step, chunk=self.chunk, sync=self.sync)
        cm.__enter__()
        self._open.append(cm)

    def __exit__(self, *exc: object) -> None:
        self._open.pop().__exit__(*exc)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with recorder().block(self.name, step=self.step, chunk=self.chunk, sync=self.sync):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class StageClock:
    """Named instants per chunk on this rank's own clock: ``clock.mark("tA0", chunk=k)``.

    Pipeline metrics (``tracewhy pipeline``) are durations between marks of one rank, so the
    ranks' clocks never need to agree."""

    def __init__(self, recorder_: Recorder | None = None, *, cuda: bool = False) -> None:
        self._recorder = recorder_
        self.cuda = cuda

    def mark(self, name: str, *, chunk: int, cuda: bool | None = None) -> None:
        (self._recorder or recorder()).mark(name, chunk=chunk, cuda=self.cuda if cuda is None else cuda)


def _at_exit() -> None:
    try:
        flush()
    except Exception as e:  # never turn the user's clean exit into a failure
        print(f"tracewhy.instrument: could not write the log: {e}", file=sys.stderr)


atexit.register(_at_exit)
