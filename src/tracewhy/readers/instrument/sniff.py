"""Telling an instrument log (``tracewhy.instrument``'s JSON Lines) by its first line, or a
directory of rank logs, without importing the reader."""

from __future__ import annotations

from pathlib import Path
from typing import Final

#: A directory is read as every ``*.jsonl`` in it (rank logs), sorted by name.
LOG_SUFFIX: Final = ".jsonl"
_SNIFF_TYPES: Final = (b'"header"', b'"mark"', b'"block"')


def looks_like_instrument_log(path: Path) -> bool:
    """A ``.jsonl`` file or a directory holding some, or a file whose first line is a record."""
    if path.is_dir():
        return any(path.glob(f"*{LOG_SUFFIX}"))
    try:
        with open(path, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return False
    return first.lstrip().startswith(b"{") and b'"type"' in first and any(t in first for t in _SNIFF_TYPES)
