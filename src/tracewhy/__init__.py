"""tracewhy: says why a PyTorch job is slower than it should be, from the traces it left."""

from __future__ import annotations

from pathlib import Path

from tracewhy.model import Trace
from tracewhy.readers import read_trace

__version__ = "0.1.0"
__all__ = ["Trace", "__version__", "load"]


def load(path: str | Path) -> Trace:
    """Read a trace file (format chosen by content) into a Trace of polars DataFrames."""
    return read_trace(path)
