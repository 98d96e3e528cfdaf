"""What every subcommand shares: the Command interface, trace loading with progress, output."""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

from tracewhy.renderers import View
from tracewhy.renderers.jsonout import render_json
from tracewhy.units import fmt_bytes, names_whole, printable, whole_names

# rich, polars and the readers are imported where they are used: ``which`` reads no trace, and
# a ``--json`` run prints no table, so neither pays at start-up for what it does not use.
if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.progress import Progress, TaskID

    from tracewhy.model.schema import Kind
    from tracewhy.model.trace import Trace
    from tracewhy.reports.inputs import Loader


class Command:
    """A subcommand. The class docstring is its help text; ``name`` is what users type;
    ``json_payloads`` are the payload declarations (TypedDicts) its ``--json`` document is one
    of, from which its JSON Schema is generated (``tracewhy schema``)."""

    name: ClassVar[str]
    takes_trace: ClassVar[bool] = True
    #: Takes several traces (``TRACE...``: files, or directories of them) instead of one.
    takes_traces: ClassVar[bool] = False
    json_payloads: ClassVar[tuple[type, ...]] = ()
    #: Schemas of documents the command prints without the envelope (``schema COMMAND``).
    json_documents: ClassVar[tuple[dict[str, Any], ...]] = ()

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Add this command's own options."""

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError


def add_output_options(parser: argparse.ArgumentParser, top: int | None = 20) -> None:
    parser.add_argument("--json", action="store_true", help="print versioned JSON instead of tables")
    if top is not None:
        parser.add_argument("--top", type=positive_int, default=top, metavar="N",
                            help=f"rows to show in tables (default {top}); JSON has all rows")


#: The largest count an option takes: more rows, steps or workers than any trace holds, and
#: still a machine integer (``--top 99999999999999999999999`` overflowed polars' head()).
MAX_COUNT = 2**31 - 1


def positive_int(text: str) -> int:
    """A count option: a whole number ≥ 0, values beyond ``MAX_COUNT`` read as ``MAX_COUNT``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be ≥ 0, got {text!r}")
    return min(value, MAX_COUNT)


#: Reads of files at least this large show a progress bar (on a terminal, never with --json):
#: below it a read takes about a second, and a bar would only flicker.
PROGRESS_MIN_BYTES: Final = 100 * 10**6


class ReadProgress:
    """A progress bar on stderr for one read. Readers report ``(done, total)`` in their own units
    (bytes of pieces or decoded events for Kineto, stages for nsys), so the bar shows the share
    done, beside the file's size and what the reader is at."""

    def __init__(self, path: str, size: int, stage: str = "reading") -> None:
        self.label = f"{stage} {printable(Path(path).name)} ({fmt_bytes(size)})"
        self.progress: Progress | None = None
        self.task: TaskID | None = None

    def __call__(self, done: int, total: int) -> None:
        if self.progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                console=Console(stderr=True), transient=True,
            )
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=max(total, 1))
        assert self.task is not None
        self.progress.update(self.task, completed=done, total=max(total, 1),
                             description=self.label if done < total else f"{self.label}: building tables")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def progress_for(path: str) -> ReadProgress | None:
    """A bar for reading ``path`` when the command shows progress and the file is large."""
    if not _SHOW_PROGRESS.get():
        return None
    try:
        size = Path(path).stat().st_size
    except OSError:
        return None
    return ReadProgress(path, size) if size >= PROGRESS_MIN_BYTES else None


#: Whether the command being run shows progress: stderr is a terminal and the output is not JSON.
_SHOW_PROGRESS: ContextVar[bool] = ContextVar("tracewhy_show_progress", default=False)
#: The spinner that follows a read's bar while the command analyses (on a 5 GB trace, 37 s of
#: analyses came after the bar closed, with nothing on screen); stopped before any output.
_ANALYSING: ContextVar[Any] = ContextVar("tracewhy_analysing", default=None)


def _start_analysing(path: str) -> None:
    from rich.console import Console

    status = Console(stderr=True).status(f"analysing {printable(Path(path).name)}", spinner="dots")
    status.start()
    _ANALYSING.set(status)


def stop_analysing() -> None:
    """Stop the after-read spinner, if one runs (before anything is printed)."""
    status = _ANALYSING.get()
    if status is not None:
        status.stop()
        _ANALYSING.set(None)


def shows_progress() -> bool:
    """Whether the command being run may draw progress on stderr (``ranks`` draws its own)."""
    return _SHOW_PROGRESS.get()


#: Whether the command being run may use the parsed-trace cache (not ``--no-cache``), set by
#: ``run_command``; None outside a command (the readers' default then applies).
_CACHE: ContextVar[bool | None] = ContextVar("tracewhy_cache", default=None)


class Warnings:
    """What the readers skipped, reinterpreted or could not read, for one command run: each
    line once, printed on stderr (``tracewhy: warning: FILE: ...``) as soon as the command
    has output to show, and the same lines in every ``--json`` payload's ``warnings``."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.printed = 0

    def add(self, source: str, lines: Iterable[str]) -> None:
        for line in lines:
            text = f"{source}: {line}"
            if text not in self.lines:
                self.lines.append(text)

    def flush(self) -> None:
        for line in self.lines[self.printed:]:
            sys.stderr.write(f"tracewhy: warning: {printable(line)}\n")
        self.printed = len(self.lines)


_WARNINGS: ContextVar[Warnings | None] = ContextVar("tracewhy_warnings", default=None)


def warn(source: str | Path, lines: Iterable[str]) -> None:
    """Report reader warnings about ``source`` (a file) for the command being run."""
    collected = _WARNINGS.get()
    if collected is not None:
        collected.add(str(source), lines)


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Options every subcommand takes."""
    parser.add_argument("--no-cache", action="store_true",
                        help="read the trace afresh; do not use or write the parsed-trace cache")
    parser.add_argument("--wide", action="store_true",
                        help="print tables whole, however wide: every column and whole names (on a terminal, "
                             "tables otherwise fit its width; output that is not a terminal is always whole)")
    parser.add_argument("--color", choices=COLOR_CHOICES, default="auto",
                        help="colour the output: auto (on a terminal, unless NO_COLOR is set), always, never")


def run_command(args: argparse.Namespace, collected: Warnings | None = None) -> int:
    """Run the chosen subcommand with the common options in force; the reader warnings go to
    ``collected`` (a failed command's ``--json`` error document carries them)."""
    # The inputs (a FIFO among them would block the first read), by the names commands give them.
    inputs = [item for name in ("trace", "a", "b", "report", "paths", "ncu", "baseline", "config")
              for item in _as_list(getattr(args, name, None)) if isinstance(item, str)]
    if inputs:  # (the readers, and polars with them, only for a command that reads a file)
        from tracewhy.readers.source import refuse_special

        for item in inputs:
            refuse_special(Path(item))
    token = _CACHE.set(not getattr(args, "no_cache", False))
    collected = collected if collected is not None else Warnings()
    warnings_token = _WARNINGS.set(collected)
    progress_token = _SHOW_PROGRESS.set(sys.stderr.isatty() and not getattr(args, "json", False))
    try:
        with whole_names(getattr(args, "wide", False) or not stdout_is_terminal()):
            return int(args.command.run(args))
    finally:
        stop_analysing()
        collected.flush()  # a command that wrote a file, or failed after reading, still says them
        _SHOW_PROGRESS.reset(progress_token)
        _WARNINGS.reset(warnings_token)
        _CACHE.reset(token)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def load_trace(path: str, kinds: Collection[Kind] | None = None) -> Trace:
    """The trace, whole, or (``kinds``) with at least the slice kinds a command's analyses use
    (its warnings are the loader's to say: ``Loader.seen``)."""
    from tracewhy.readers import CacheOptions, read_trace

    enabled = _CACHE.get()
    bar = progress_for(path)
    try:
        trace = read_trace(path, progress=bar, cache=None if enabled is None else CacheOptions(enabled=enabled),
                           kinds=kinds)
    finally:
        if bar is not None:
            bar.close()
    if bar is not None:  # a large file (read, or served by the cache): the analyses may be long too
        _start_analysing(path)
    return trace


def loader() -> Loader:
    """How reports read for the command being run: ``load_trace`` (progress, the cache as the
    options say) and ``warn`` (each read's warnings, printed and carried in ``--json``)."""
    from tracewhy.reports.inputs import Loader

    return Loader(read=load_trace, warn=warn, cache=_CACHE.get())


def flush_warnings() -> None:
    """Print the warnings not yet printed (``emit`` does it before a table)."""
    stop_analysing()
    collected = _WARNINGS.get()
    if collected is not None:
        collected.flush()


def warnings_so_far() -> list[str]:
    """The warnings of the command being run, as its ``--json`` payload carries them."""
    collected = _WARNINGS.get()
    return list(collected.lines) if collected is not None else []


#: Where the ``--json`` documents of commands run in this context go: None, stdout; a list, kept
#: there (``json_documents_kept``: the MCP server runs commands in process and stdout is its protocol's).
_JSON_DOCUMENTS: ContextVar[list[str] | None] = ContextVar("tracewhy_json_documents", default=None)


@contextlib.contextmanager
def json_documents_kept() -> Iterator[list[str]]:
    """While it is open, the ``--json`` documents (an error's too) are added to the list it gives
    instead of being written on stdout."""
    documents: list[str] = []
    token = _JSON_DOCUMENTS.set(documents)
    try:
        yield documents
    finally:
        _JSON_DOCUMENTS.reset(token)


def write_json_document(text: str) -> None:
    """A ``--json`` document, on stdout or to the list ``json_documents_kept`` gave."""
    documents = _JSON_DOCUMENTS.get()
    if documents is not None:
        documents.append(text)
    else:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def emit(args: argparse.Namespace, command: str, payload: Mapping[str, Any], view: View) -> None:
    """The command's output: the payload a renderer built, in the JSON envelope (``--json``),
    or the terminal table ``view`` builds. Commands build no dicts of their own."""
    flush_warnings()  # before the table: a user reads the caveat first
    if getattr(args, "json", False):
        write_json_document(render_json(command, payload, warnings_so_far()))
    else:
        show(view, getattr(args, "color", "auto"))


def show(view: View, color: str = "auto") -> None:
    """Print a command's terminal view on stdout (the one place views are printed)."""
    print_tables(output_console(color), view())


#: ``--color``: auto follows the terminal and NO_COLOR (https://no-color.org); the others force.
COLOR_CHOICES: Final = ("auto", "always", "never")
#: Piped output has no terminal width: paragraphs wrap at this many columns (tables never cut).
PIPED_WIDTH: Final = 160


def stdout_is_terminal() -> bool:
    """Whether stdout is a terminal: tables then fit its width; otherwise they are printed whole."""
    return sys.stdout.isatty()


def output_console(color: str = "auto") -> Console:
    """The console for a command's tables on stdout. ``always`` colours even a pipe (``| less -R``)
    and wins over NO_COLOR, as an explicit flag should; ``never`` prints no escape codes at all."""
    from rich.console import Console

    if color == "always":
        console = Console(soft_wrap=False, force_terminal=True, no_color=False)
    elif color == "never":
        console = Console(soft_wrap=False, no_color=True, color_system=None)
    else:
        console = Console(soft_wrap=False)
    if not stdout_is_terminal():
        console.width = PIPED_WIDTH
    return console


def print_tables(console: Console, renderable: RenderableType) -> None:
    """Print ``renderable`` (groups of tables and paragraphs): paragraphs wrap at the console's
    width and tables fit it (``FitTable``); under ``whole_names`` (``--wide``, piped output) each
    table is as wide as its content needs. No line ends in spaces (rich pads cells, titles and
    indented paragraphs to their width): a pipe gets the text, not the padding."""
    with console.capture() as captured:
        _print_parts(console, renderable)
    console.file.write("".join(_without_trailing_space(line) for line in captured.get().splitlines(keepends=True)))
    console.file.flush()


#: An escape code that sets or closes a style (``ESC [ 0 m``), which may follow a line's last spaces.
_STYLE_CODE: Final = re.compile(r"\x1b\[[0-9;]*m")


def _without_trailing_space(line: str) -> str:
    """``line`` without the spaces at its end, keeping the style codes that close it and its
    newline. Scans back from the end once: a regex anchored at ``$`` is tried from every space
    of the line, which on a table row of many thousand cells took seconds."""
    newline = "\n" if line.endswith("\n") else ""
    body = line[:-1] if newline else line
    codes: list[str] = []
    while True:
        body = body.rstrip(" \t")
        start = body.rfind("\x1b[")
        if start < 0 or not body.endswith("m") or _STYLE_CODE.fullmatch(body, start) is None:
            break
        codes.append(body[start:])
        body = body[:start]
    return body + "".join(reversed(codes)) + newline


def _print_parts(console: Console, renderable: RenderableType) -> None:
    from rich.console import Group
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    from tracewhy.renderers.layout import FitTable
    from tracewhy.renderers.wrap import Paragraph

    if isinstance(renderable, Group):
        for part in renderable.renderables:
            _print_parts(console, part)
        return
    # Paragraphs wrap as table text does: never between a number and its unit.
    if isinstance(renderable, Text):
        renderable = Paragraph(renderable)
    elif isinstance(renderable, Padding) and isinstance(renderable.renderable, Text):
        renderable = Padding(Paragraph(renderable.renderable),
                             (renderable.top, renderable.right, renderable.bottom, renderable.left),
                             style=renderable.style, expand=renderable.expand)
    if isinstance(renderable, (Table, FitTable)) and names_whole():
        needed = console.measure(renderable, options=console.options.update_width(10**6)).maximum
        if needed > console.width:
            with _wider(console, needed):
                console.print(renderable)
            return
    console.print(renderable)


@contextlib.contextmanager
def _wider(console: Console, width: int) -> Iterator[None]:
    saved = console.width
    console.width = width
    try:
        yield
    finally:
        console.width = saved
