"""The one error hierarchy: every problem a user can cause is a TraceError naming the file."""

from __future__ import annotations

from pathlib import Path


class TraceError(Exception):
    """A problem with an input file, phrased for the person who gave it to us.

    Only ``tracewhy.cli.main`` prints these; it prints ``str(error)`` on one line.
    """

    def __init__(self, path: str | Path | None, problem: str) -> None:
        self.path = None if path is None else str(path)
        self.problem = " ".join(problem.split())  # always one line
        super().__init__(self.problem if self.path is None else f"{self.path}: {self.problem}")


def install_hint(extra: str) -> str:
    """How to add an optional extra, for an installed package and for a clone of the repository
    (where ``pip install 'tracewhy[ncu]'`` would fetch another copy from PyPI)."""
    return f"pip install 'tracewhy[{extra}]' (from a clone of the repository: pip install '.[{extra}]')"


class UsageError(Exception):
    """A command-line request that cannot be satisfied (bad option value, unknown step name)."""
