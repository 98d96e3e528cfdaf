"""One reader per input format, and ``read_trace`` which picks one by the file's content.

The format readers are imported on first use: a trace served from the cache needs none of
them, and their imports are a good part of a cached run's time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from tracewhy.errors import TraceError
from tracewhy.model.cache import CacheOptions, cached_read
from tracewhy.model.schema import Kind
from tracewhy.model.trace import Trace
from tracewhy.readers.source import refuse_special, sniff, sniff_empty

Progress = Callable[[int, int], None]

__all__ = ["CacheOptions", "Progress", "read_kineto", "read_nsys", "read_trace"]


def __getattr__(name: str) -> Any:
    if name == "read_kineto":
        from tracewhy.readers.kineto import read_kineto

        return read_kineto
    if name == "read_nsys":
        from tracewhy.readers.nsys import read_nsys

        return read_nsys
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def read_trace(
    path: str | Path,
    *,
    progress: Progress | None = None,
    cache: CacheOptions | None = None,
    kinds: Collection[Kind] | None = None,
) -> Trace:
    """Read any supported trace, choosing the reader by content, never by file name.

    The parsed Trace is cached (``tracewhy.model.cache``); ``CacheOptions(enabled=False)`` reads afresh.
    ``kinds``: the slice kinds the caller needs. Formats stored in tables (nsys) then read only
    those tables and return a partial Trace (``Trace.is_partial``), which is never cached; a
    cached whole Trace, or a format that must be parsed whole anyway (Kineto), answers with
    the whole Trace. The Trace returned has passed ``Trace.check()``.
    """
    refuse_special(Path(path))
    try:
        return cached_read(Path(path), lambda p: _checked(_read_uncached(p, progress, kinds)), cache)
    except TraceError as e:
        hint = other_tool_hint(Path(path))
        if hint is None:
            raise
        raise TraceError(path, hint) from e


def other_tool_hint(path: Path) -> str | None:
    """What a file that is not a trace is, and the command that reads it: an Nsight Compute
    report given to a trace command, a memory-timeline export or snapshot, an instrument log.
    Run only after a read failed, so a trace pays nothing for it."""
    from tracewhy.readers.instrument_log import looks_like_instrument_log
    from tracewhy.readers.memory_snapshot import is_snapshot
    from tracewhy.readers.memory_timeline import is_memory_timeline
    from tracewhy.readers.ncu import is_ncu

    if not path.is_file():
        return None
    if is_ncu(path):
        return ("an Nsight Compute report (kernel metrics), not a timeline trace: "
                f"run tracewhy roofline {path}")
    if is_memory_timeline(path):
        return f"a memory-timeline export, not a profiler trace: run tracewhy memory {path}"
    if is_snapshot(path):
        return f"a CUDA memory snapshot (pickle), not a profiler trace: run tracewhy memory {path}"
    if looks_like_instrument_log(path):
        return ("a tracewhy.instrument log (header/mark/block records), not a profiler trace: "
                f"run tracewhy pipeline {path} or tracewhy blocks {path}")
    return None


def _checked(trace: Trace) -> Trace:
    """Every Trace a reader returns keeps the model's invariants, or ``ModelError`` (a bug in
    the reader, never the file's fault) says which broke; the cache checks its hits the same way."""
    trace.check()
    return trace


def _read_uncached(path: Path, progress: Progress | None, kinds: Collection[Kind] | None) -> Trace:
    # Only the reader in use is imported: the Kineto reader's imports cost ~50 ms.
    fmt = sniff(path)
    if fmt == "kineto":
        from tracewhy.readers.kineto import read_kineto

        return read_kineto(path, progress=progress)
    from tracewhy.readers.nsys import read_nsys, sniff_nsys

    if fmt == "sqlite" or (fmt == "unknown" and sniff_nsys(path) is not None):
        return read_nsys(path, progress=progress, kinds=kinds)
    if sniff_empty(path):
        raise TraceError(path, "file is empty")
    raise TraceError(
        path,
        "not a recognized trace: expected PyTorch profiler JSON (.json or .json.gz) "
        "or an Nsight Systems SQLite export",
    )
