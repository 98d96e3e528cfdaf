"""Telling PyTorch's memory inputs by their first bytes, without importing their readers."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from tracewhy.readers.source import JSON_BLANK, content_head

PICKLE_PROTO: Final = b"\x80"


def is_snapshot(path: Path) -> bool:
    """Whether the file (plain or gzip) starts as a pickle of protocol 2 or later does
    (``_dump_snapshot`` writes protocol 4 or 5)."""
    head = content_head(path, 2)
    if head is None:
        return False
    return head[:1] == PICKLE_PROTO and len(head) == 2 and 2 <= head[1] <= 5


def is_memory_timeline(path: Path) -> bool:
    """Whether the file (plain or gzip) is JSON opening with two brackets, ``[[``: both layouts
    do, and no profiler trace does (an event array opens ``[{``)."""
    start = content_head(path, 4096)
    if start is None:
        return False
    stripped = start.lstrip(JSON_BLANK)
    return stripped[:1] == b"[" and stripped[1:].lstrip(JSON_BLANK)[:1] == b"["
