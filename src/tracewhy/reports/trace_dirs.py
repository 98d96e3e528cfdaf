"""The traces several inputs stand for: a file for itself, a directory for the timeline traces
directly inside it, each told by its content through the registry (Kineto and Nsight Systems
alike), never by its name.

Not recursive: ``torch.profiler.tensorboard_trace_handler(dir)`` (and ``tracewhy.capture``)
writes every capture straight into ``dir``, one ``<worker>.<time>.pt.trace.json[.gz]`` per
process and cycle, so ``dir`` holds the captures; its subdirectories are other runs (a
TensorBoard log directory holds one per run), named in the message when ``dir`` holds no trace.
A file inside that is not a timeline trace is skipped with a warning that names it and says what
it is; hidden files (``.name``) are passed over, as ``ls`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Final

from tracewhy.errors import TraceError
from tracewhy.readers.registry import InputKind, detect, expected, of_kind, other_tool_hint
from tracewhy.readers.source import os_error, refuse_special, sniff_empty
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource

#: Subdirectories named in the message about a directory without traces (the rest are counted).
NAMED_SUBDIRECTORIES: Final = 3


@dataclass(frozen=True)
class TraceInput:
    """One trace to read: ``source`` as given (a Trace, or a file's path); ``listed``: found in
    a directory rather than named, so that a file that cannot be read as a trace is skipped with
    a warning instead of failing the command."""

    source: TraceSource
    listed: bool = False

    @property
    def path(self) -> str:
        return str(self.source) if isinstance(self.source, (str, PurePath)) else self.source.meta.path


@dataclass(frozen=True)
class SkippedFile:
    """A file of a directory that was not read as a trace, and why (one line)."""

    path: str
    why: str


def is_directory(source: TraceSource) -> bool:
    return isinstance(source, (str, PurePath)) and Path(source).is_dir()


def trace_inputs(sources: Sequence[TraceSource], loader: Loader = PLAIN) -> tuple[list[TraceInput], list[SkippedFile]]:
    """The traces ``sources`` stand for, in order (a directory's by name), and the files of
    directories that are not timeline traces, each said through ``loader.warn`` as it is found.
    A directory with no trace in it is a TraceError; a named file is taken as given (its reader
    says what is wrong with it)."""
    found: list[TraceInput] = []
    skipped: list[SkippedFile] = []
    for source in sources:
        if not is_directory(source):
            found.append(TraceInput(source))
            continue
        directory = Path(str(source))
        traces, passed = directory_traces(directory)
        for s in passed:
            loader.warn(s.path, [f"skipped: {s.why}"])
        skipped += passed
        if not traces:
            raise TraceError(directory, _no_traces(directory, passed))
        found += [TraceInput(str(t), listed=True) for t in traces]
    return found, skipped


def directory_traces(directory: Path) -> tuple[list[Path], list[SkippedFile]]:
    """The timeline traces directly in ``directory`` by name, and the other files with why each
    is skipped. One capture in two forms (an Nsight Systems report and its SQLite export beside
    it, ``run.nsys-rep`` and ``run.sqlite``) is read once, in the form its format lists first."""
    try:
        entries = sorted(p for p in directory.iterdir() if not p.name.startswith("."))
    except OSError as e:
        raise os_error(directory, e) from None
    traces: list[Path] = []
    skipped: list[SkippedFile] = []
    for path in entries:
        if path.is_dir():
            continue
        why = not_a_trace(path)
        if why is None:
            traces.append(path)
        else:
            skipped.append(SkippedFile(str(path), why))
    kept, twins = _one_form_per_capture(traces)
    return kept, sorted(skipped + twins, key=lambda s: s.path)


def not_a_trace(path: Path) -> str | None:
    """Why the file is not a timeline trace (what it is, where the registry can tell), or None
    when its content is one. The other kinds are asked first: a memory-timeline export is JSON
    too, which the Kineto sniff, made to let the JSON reader name a broken file's problem, takes."""
    try:
        refuse_special(path)
    except TraceError as e:
        return e.problem
    hint = other_tool_hint(path)
    if hint is not None:
        return hint
    if detect(path, (InputKind.TIMELINE,)) is not None:
        return None
    if sniff_empty(path):
        return "file is empty"
    return f"not a trace: expected {expected(InputKind.TIMELINE)}"


def _one_form_per_capture(traces: list[Path]) -> tuple[list[Path], list[SkippedFile]]:
    """The traces with one form of each capture kept: two files whose names differ only in the
    endings their format registers (``run.sqlite`` and ``run.nsys-rep``) are one capture."""
    kept: list[Path] = []
    twins: list[SkippedFile] = []
    first_of: dict[tuple[str, str], Path] = {}
    for path in sorted(traces, key=lambda p: (_form(p)[1], p.name)):
        key = _form(path)[0]
        if key is not None and key in first_of:
            twins.append(SkippedFile(str(path), f"the same capture as {first_of[key].name}, already read"))
            continue
        if key is not None:
            first_of[key] = path
        kept.append(path)
    return sorted(kept), twins


def _form(path: Path) -> tuple[tuple[str, str] | None, int]:
    """The capture a file is a form of (its format, its name without the longest ending the
    format registers) and the rank of that ending among the timeline formats' endings; (None,
    past the last) for a name with none of them."""
    endings = [(fmt.name, s) for fmt in of_kind(InputKind.TIMELINE) for s in fmt.suffixes]
    matching = [(len(s), i, name, s) for i, (name, s) in enumerate(endings) if path.name.endswith(s)]
    if not matching:
        return None, len(endings)
    _, rank, name, ending = max(matching)
    return (name, path.name[:-len(ending)]), rank


def _no_traces(directory: Path, skipped: list[SkippedFile]) -> str:
    """The one line for a directory without a trace: what it holds instead, and its
    subdirectories that hold traces (a TensorBoard log directory keeps one per run)."""
    message = "no timeline traces in this directory"
    if skipped:
        message += f" ({len(skipped)} other file{'s' if len(skipped) > 1 else ''}, skipped)"
    try:
        with_traces = sorted(d.name for d in directory.iterdir() if d.is_dir() and not d.name.startswith(".")
                             and any(f.is_file() and not_a_trace(f) is None for f in d.iterdir()))
    except OSError:
        with_traces = []
    if with_traces:
        named = ", ".join(f"{n}/" for n in with_traces[:NAMED_SUBDIRECTORIES])
        more = f" and {len(with_traces) - NAMED_SUBDIRECTORIES} more" if len(with_traces) > NAMED_SUBDIRECTORIES else ""
        message += f"; its subdirectories {named}{more} hold some: give them (e.g. {directory}/*/)"
    return message
