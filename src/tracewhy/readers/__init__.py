"""One folder per input format, registered once (``registry``), and ``read_trace``, which reads
any timeline trace with the reader its content calls for.

The format readers are imported on first use: a trace served from the cache needs none of
them, and their imports are a good part of a cached run's time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

from tracewhy.errors import TraceError
from tracewhy.model.cache import CacheOptions, cached_read
from tracewhy.model.schema import Kind
from tracewhy.model.trace import Trace
from tracewhy.readers.registry import InputKind, detect, expected, has_companions, other_tool_hint
from tracewhy.readers.source import refuse_special, sniff_empty

Progress = Callable[[int, int], None]

__all__ = ["CacheOptions", "Progress", "read_trace"]


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
    the whole Trace. The Trace returned has passed ``Trace.check()`` (``cached_read`` checks what
    the reader returns, and every hit whose entry its own store did not seal).
    """
    refuse_special(Path(path))
    if has_companions(Path(path)):
        cache = CacheOptions(enabled=False)
    try:
        return cached_read(Path(path), lambda p: _read_uncached(p, progress, kinds), cache)
    except TraceError as e:
        hint = other_tool_hint(Path(path))
        if hint is None:
            raise
        raise TraceError(path, hint) from e


def _read_uncached(path: Path, progress: Progress | None, kinds: Collection[Kind] | None) -> Trace:
    fmt = detect(path, (InputKind.TIMELINE,))
    if fmt is not None:
        trace: Trace = fmt.reader()(path, progress=progress, kinds=kinds)
        return trace
    if sniff_empty(path):
        raise TraceError(path, "file is empty")
    raise TraceError(path, f"not a recognized trace: expected {expected(InputKind.TIMELINE)}")
