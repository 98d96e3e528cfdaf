"""tracewhy: says why a PyTorch job is slower than it should be, from the traces it left.

``tracewhy.load(path)`` reads a trace; every command is a function of the same name
(``tracewhy.diagnose(trace)``, ``steps``, ``gaps``, ``kernels``, ..., ``critical_path`` for
``critical-path``) returning the command's result; ``slices`` and ``to_pandas`` hand tables out
(``tracewhy.api``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracewhy.api import (
        Diagnosis,
        account,
        blocks,
        check,
        compile,
        critical_path,
        diagnose,
        diff,
        export,
        gaps,
        info,
        kernels,
        lines,
        memory,
        nsys_stats,
        nvtx,
        ops,
        overlap,
        pipeline,
        ranks,
        report,
        roofline,
        schema,
        slices,
        sql,
        steps,
        to_pandas,
        which,
    )
    from tracewhy.model import Trace

from tracewhy._version import __version__

#: ``Trace``, ``load`` and the version are here; the rest is ``tracewhy.api``, imported on first
#: use: the CLI imports this package for ``__version__``, and importing every analysis up front
#: would double a cached command's time.
__all__ = [
    "Diagnosis", "Trace", "__version__", "account", "blocks", "check", "compile", "critical_path", "diagnose",
    "diff", "export", "gaps", "info", "kernels", "lines", "load", "memory", "nsys_stats", "nvtx", "ops", "overlap",
    "pipeline", "ranks", "report", "roofline", "schema", "slices", "sql", "steps", "to_pandas", "which",
]


def load(path: str | Path) -> Trace:
    """Read a trace file (format chosen by content) into a Trace of polars DataFrames."""
    from tracewhy.readers import read_trace

    return read_trace(path)


def __getattr__(name: str) -> Any:
    # Nothing heavy is imported with the package: ``tracewhy.instrument`` and ``tracewhy.capture``
    # run inside the user's job, where importing polars and the readers would cost ~0.5 s.
    if name == "Trace":
        return importlib.import_module("tracewhy.model").Trace
    if name in __all__:  # (only names not found above reach here)
        return getattr(importlib.import_module("tracewhy.api"), name)
    raise AttributeError(f"module 'tracewhy' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
