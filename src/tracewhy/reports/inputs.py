"""How a report reads the inputs it is given: a timeline trace through the loader its caller
chooses, and where the readers' warnings go.

The Python API reads plainly (``PLAIN``) and drops the warnings (a Trace keeps its own in
``meta.warnings``); the CLI passes a loader that draws progress, honours ``--no-cache`` and prints
the warnings as soon as they are known (``cli.base.loader``), so that a command that fails after
a read still says them. A report given a Trace already read uses it as it is.

A report that needs two traces at once (``diff``, ``check --baseline``) reads them with
``Loader.traces``: small files at once (``reports/at_once.py``; an nsys export's read is mostly
SQLite and polars, which let the GIL go: the 2.3 MB export and its copy took 0.13 s together
against 0.16 s one after the other), and what each read tells (``Loader.seen``: its warnings) is
said in the order the traces were given, as if they had been read in turn.
"""

from __future__ import annotations

import functools
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


def _said(warn: Callable[[str | Path, Iterable[str]], None]) -> Callable[[str, Trace], None]:
    """What a read tells by default: its warnings, through ``warn``."""
    return lambda path, trace: warn(path, trace.meta.warnings)


@dataclass(frozen=True)
class Loader:
    """``read``: a trace file into a Trace (with at least the slice kinds given, when given);
    ``warn``: what a reader skipped or reinterpreted in a file (``source``), one line each;
    ``seen``: told each file read and its Trace, in the order the files were given (default:
    the Trace's warnings to ``warn``); ``cache``: whether ``read`` uses the parse cache (None:
    the readers' default), for a read made in another process on its behalf (``diff``'s helper)."""

    read: Callable[[str, Collection[Kind] | None], Trace] = _read
    warn: Callable[[str | Path, Iterable[str]], None] = _drop
    seen: Callable[[str, Trace], None] | None = None
    cache: bool | None = None

    def trace(self, source: TraceSource, kinds: Collection[Kind] | None = None) -> Trace:
        """``source`` itself when it is a Trace, else the file read."""
        return self.traces([source], kinds)[0]

    def traces(self, sources: Sequence[TraceSource], kinds: Collection[Kind] | None = None) -> list[Trace]:
        """Each of ``sources`` as ``trace`` gives it, in order; files read at once when there are
        several and they are small together (``input_size.small_inputs``). A failed read raises
        once the reads before it have been told to ``seen``, as when they are read in turn."""
        from tracewhy.input_size import small_inputs
        from tracewhy.reports import at_once

        paths = [str(s) for s in sources if isinstance(s, (str, PurePath))]
        pieces = [functools.partial(_read_or_error, self.read, str(s), kinds) if isinstance(s, (str, PurePath))
                  else functools.partial(_given, s) for s in sources]
        results = at_once.run(pieces, together=len(paths) > 1 and small_inputs(paths), name="tracewhy-read")
        seen = self.seen or _said(self.warn)
        out: list[Trace] = []
        for source, result in zip(sources, results, strict=True):
            if isinstance(result, Exception):
                raise result
            if isinstance(source, (str, PurePath)):
                seen(str(source), result)
            out.append(result)
        return out


def _given(trace: Trace) -> Trace:
    return trace


def _read_or_error(read: Callable[[str, Collection[Kind] | None], Trace], path: str,
                   kinds: Collection[Kind] | None) -> Trace | Exception:
    """The file read, or what its read raised (raised by ``Loader.traces`` in the files' order)."""
    try:
        return read(path, kinds)
    except Exception as e:
        return e


#: Reads with the readers' defaults and keeps no warnings apart (the Python API).
PLAIN: Final = Loader()


def is_several(sources: Sequence[TraceSource]) -> bool:
    """Whether ``sources`` stand for more than one trace file as given: several, or a directory
    (``reports/several.py`` reads those; one file is read as it always was)."""
    return len(sources) != 1 or (isinstance(sources[0], (str, PurePath)) and Path(sources[0]).is_dir())
