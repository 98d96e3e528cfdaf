"""One reader per input format, and ``read_trace`` which picks one by the file's content.

The format readers are imported on first use: a trace served from the cache needs none of
them, and their imports are a good part of a cached run's time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracewhy.errors import TraceError
from tracewhy.model.cache import CacheOptions, cached_read
from tracewhy.model.trace import Trace
from tracewhy.readers.source import sniff, sniff_empty

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


def read_trace(path: str | Path, *, progress: Progress | None = None, cache: CacheOptions | None = None) -> Trace:
    """Read any supported trace, choosing the reader by content, never by file name.

    The parsed Trace is cached (``tracewhy.model.cache``); ``CacheOptions(enabled=False)`` reads afresh.
    """
    return cached_read(Path(path), lambda p: _read_uncached(p, progress), cache)


def _read_uncached(path: Path, progress: Progress | None) -> Trace:
    from tracewhy.readers.kineto import read_kineto
    from tracewhy.readers.nsys import read_nsys, sniff_nsys

    fmt = sniff(path)
    if fmt == "kineto":
        return read_kineto(path, progress=progress)
    if fmt == "sqlite" or (fmt == "unknown" and sniff_nsys(path) is not None):
        return read_nsys(path, progress=progress)
    if sniff_empty(path):
        raise TraceError(path, "file is empty")
    raise TraceError(
        path,
        "not a recognized trace: expected PyTorch profiler JSON (.json or .json.gz) "
        "or an Nsight Systems SQLite export",
    )
