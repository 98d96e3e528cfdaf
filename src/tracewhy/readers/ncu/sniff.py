"""Telling Nsight Compute output by its first bytes, without importing its readers: a report's
magic, or a CSV export's table header wherever program output put it."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Final

#: The first bytes of an ``.ncu-rep`` report.
MAGIC: Final = b"NVR\x00"
#: How far into a CSV export the table header may start (program output comes first).
_SNIFF_BYTES: Final = 1 << 20
#: Identity columns of which one must sit beside "ID" for a line to be a table header.
_HEADER_MARKS: Final = frozenset({"kernel name", "process id"})


def is_header_line(line: str) -> bool:
    """Whether ``line`` is an ncu table header: an "ID" field (anywhere: column order is not
    fixed once a CSV has been through a spreadsheet) beside "Kernel Name" or "Process ID"."""
    s = line.strip().lstrip("\ufeff")
    if "ID" not in s or not ("Kernel Name" in s or "Process ID" in s):
        return False
    fields = {f.strip().lower() for f in next(csv.reader([s]), [])}
    return "id" in fields and bool(fields & _HEADER_MARKS)


def is_ncu(path: str | Path) -> bool:
    """Whether the file looks like Nsight Compute output (report magic, or a CSV "ID" header,
    wherever "ID" sits among the columns)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError:
        return False
    if head.startswith(MAGIC):
        return True
    text = head.decode("utf-8", "replace").lstrip("\ufeff")
    # A header line holds "Kernel Name" or "Process ID" (is_header_line): a text with neither
    # (any trace of another format) needs no look at its lines, 13 ms on a 1 MB Kineto trace.
    if "Kernel Name" not in text and "Process ID" not in text:
        return False
    return any(is_header_line(line) for line in text.splitlines())
