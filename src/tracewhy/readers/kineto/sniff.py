"""Telling a PyTorch profiler (Kineto) trace by its first bytes, without importing the reader:
JSON that opens an object or an array, past white space and a UTF-8 BOM, plain or gzip."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import BinaryIO

from tracewhy.readers.source import GZIP_MAGIC, JSON_BLANK, SNIFF_BLANK_MAX, os_error


def is_kineto(path: Path) -> bool:
    """Whether the file's content opens JSON. A gzip stream that cannot be inflated and a file
    of white space alone count as Kineto too: the JSON reader then names their problem. A file
    that cannot be opened is a TraceError saying why."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if not head.startswith(GZIP_MAGIC):
                return _opens_json(head, f)
    except OSError as e:
        raise os_error(path, e) from None
    try:
        with gzip.open(path, "rb") as g:
            return _opens_json(g.read(64), g)
    except (OSError, EOFError, zlib.error):
        return True  # let the JSON reader produce the precise error


def _opens_json(head: bytes, f: BinaryIO | gzip.GzipFile) -> bool:
    """Whether the first byte past white space and a UTF-8 BOM opens JSON. White space of any
    length may come first: it is read past, a block at a time."""
    seen = len(head)
    stripped = head.lstrip(JSON_BLANK)
    while not stripped:
        if seen > SNIFF_BLANK_MAX:
            return True
        block = f.read(1 << 16)
        if not block:
            return True  # white space only: the JSON reader says the file is empty
        seen += len(block)
        stripped = block.lstrip(JSON_BLANK)
    return stripped[:1] in (b"{", b"[")
