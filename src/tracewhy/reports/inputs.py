"""How a report reads the inputs it is given: a timeline trace through the loader its caller
chooses, and where the readers' warnings go.

The Python API reads plainly (``PLAIN``) and drops the warnings (a Trace keeps its own in
``meta.warnings``); the CLI passes a loader that draws progress, honours ``--no-cache`` and prints
the warnings as soon as they are known (``cli.base.loader``), so that a command that fails after
a read still says them. A report given a Trace already read uses it as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Final, Union

if TYPE_CHECKING:
    from tracewhy.model.schema import Kind
    from tracewhy.model.trace import Trace

#: A Trace already read, or the path of a trace file to read.
TraceSource = Union["Trace", str, Path]


def _read(path: str, kinds: Collection[Kind] | None = None) -> Trace:
    from tracewhy.readers import read_trace  # (a report given a Trace reads nothing)

    return read_trace(path, kinds=kinds)


def _drop(source: str | Path, lines: Iterable[str]) -> None:
    """Warnings nobody prints: the API's callers find them on what was read."""


@dataclass(frozen=True)
class Loader:
    """``read``: a trace file into a Trace (with at least the slice kinds given, when given);
    ``warn``: what a reader skipped or reinterpreted in a file (``source``), one line each."""

    read: Callable[[str, Collection[Kind] | None], Trace] = _read
    warn: Callable[[str | Path, Iterable[str]], None] = _drop

    def trace(self, source: TraceSource, kinds: Collection[Kind] | None = None) -> Trace:
        """``source`` itself when it is a Trace, else the file read."""
        if isinstance(source, (str, PurePath)):
            return self.read(str(source), kinds)
        return source


#: Reads with the readers' defaults and keeps no warnings apart (the Python API).
PLAIN: Final = Loader()


def is_several(sources: Sequence[TraceSource]) -> bool:
    """Whether ``sources`` stand for more than one trace file as given: several, or a directory
    (``reports/several.py`` reads those; one file is read as it always was)."""
    return len(sources) != 1 or (isinstance(sources[0], (str, PurePath)) and Path(sources[0]).is_dir())
