"""Telling Nsight Systems input by its first bytes (and, for a report, its name), without
importing the reader: an SQLite export, plain or gzipped, a raw capture stream or a report."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Final

from tracewhy.readers.source import GZIP_MAGIC

#: The first bytes of every SQLite database.
SQLITE_MAGIC: Final = b"SQLite format 3\x00"
#: The first bytes of a raw capture stream, which only NVIDIA's QdstrmImporter converts.
QDSTRM_MAGIC: Final = b"U3w[END]NVIDIA Nsight Systems Stream"
#: The report container has no documented magic; its suffix is the only sign we can trust.
REPORT_SUFFIXES: Final = (".nsys-rep", ".qdrep")


def sniff_nsys(path: Path) -> str | None:
    """'sqlite', 'sqlite.gz', 'qdstrm' or 'report' for Nsight Systems input, else None."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head.startswith(GZIP_MAGIC):
                f.seek(0)
                with gzip.open(f, "rb") as g:
                    inner = g.read(len(SQLITE_MAGIC))
                return "sqlite.gz" if inner == SQLITE_MAGIC else None
    except (OSError, EOFError, zlib.error):
        return None
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    if head.startswith(QDSTRM_MAGIC):
        return "qdstrm"
    if path.name.endswith(REPORT_SUFFIXES) and head[:1] not in (b"{", b"["):
        return "report"
    return None


def is_nsys(path: Path) -> bool:
    """Whether the file is Nsight Systems input of any kind ``sniff_nsys`` tells."""
    return sniff_nsys(path) is not None
