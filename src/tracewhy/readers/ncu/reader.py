"""``read_ncu``: any Nsight Compute input (``.ncu-rep`` or a CSV export), chosen by content."""

from __future__ import annotations

from pathlib import Path

from tracewhy.errors import TraceError
from tracewhy.model.ncu import NcuReport
from tracewhy.readers.ncu.csv_export import read_ncu_csv
from tracewhy.readers.ncu.rep import read_ncu_rep
from tracewhy.readers.ncu.sniff import MAGIC
from tracewhy.readers.source import refuse_special


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
