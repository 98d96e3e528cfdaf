"""``read_ncu``: any Nsight Compute input (``.ncu-rep`` or a CSV export), chosen by content."""

from __future__ import annotations

from pathlib import Path

from tracewhy.errors import TraceError
from tracewhy.model.ncu import NcuReport
from tracewhy.readers.ncu_csv import is_header_line, read_ncu_csv
from tracewhy.readers.ncu_rep import MAGIC, read_ncu_rep
from tracewhy.readers.source import refuse_special

__all__ = ["is_ncu", "read_ncu", "read_ncu_csv", "read_ncu_rep"]

#: How far into a CSV export the table header may start (program output comes first).
_SNIFF_BYTES = 1 << 20


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


def read_ncu(path: str | Path) -> NcuReport:
    """Read an ``.ncu-rep`` report or an ncu CSV export (details or raw page)."""
    path = Path(path)
    refuse_special(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a directory, expected an Nsight Compute report or CSV") from None
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    if head == MAGIC or path.suffix == ".ncu-rep":
        return read_ncu_rep(path)
    return read_ncu_csv(path)
