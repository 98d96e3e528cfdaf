"""What every subcommand shares: the Command interface, trace loading with progress, output."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Collection, Iterable
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console, RenderableType
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from tracewhy.model.schema import Kind
from tracewhy.model.trace import Trace
from tracewhy.readers import CacheOptions, read_trace
from tracewhy.readers.source import refuse_special
from tracewhy.renderers.jsonout import render_json
from tracewhy.units import printable


class Command:
    """A subcommand. The class docstring is its help text; ``name`` is what users type."""

    name: ClassVar[str]
    takes_trace: ClassVar[bool] = True

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


class _LazyProgress:
    """A progress bar on stderr that appears only once reading has taken more than a second."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.monotonic()
        self.progress: Progress | None = None
        self.task: TaskID | None = None

    def __call__(self, done: int, total: int) -> None:
        if self.progress is None:
            if time.monotonic() - self.started < 1.0 or done >= total:
                return
            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,} events"),
                TimeElapsedColumn(), console=Console(stderr=True), transient=True,
            )
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=total)
        assert self.task is not None
        self.progress.update(self.task, completed=done)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


#: The cache setting of the command being run (``--no-cache``), set by ``run_command``.
_CACHE: ContextVar[CacheOptions | None] = ContextVar("tracewhy_cache", default=None)


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


def run_command(args: argparse.Namespace) -> int:
    """Run the chosen subcommand with the common options in force."""
    # The inputs (a FIFO among them would block the first read), by the names commands give them.
    for name in ("trace", "a", "b", "report", "paths", "ncu", "baseline", "config"):
        value = getattr(args, name, None)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):
                refuse_special(Path(item))
    token = _CACHE.set(CacheOptions(enabled=not getattr(args, "no_cache", False)))
    collected = Warnings()
    warnings_token = _WARNINGS.set(collected)
    try:
        return int(args.command.run(args))
    finally:
        collected.flush()  # a command that wrote a file, or failed after reading, still says them
        _WARNINGS.reset(warnings_token)
        _CACHE.reset(token)


def load_trace(path: str, kinds: Collection[Kind] | None = None) -> Trace:
    """The trace, whole, or (``kinds``) with at least the slice kinds a command's analyses use."""
    bar = _LazyProgress(f"reading {path}")
    try:
        trace = read_trace(path, progress=bar if sys.stderr.isatty() else None, cache=_CACHE.get(), kinds=kinds)
    finally:
        bar.close()
    warn(path, trace.meta.warnings)
    return trace


def flush_warnings() -> None:
    """Print the warnings not yet printed (``emit`` does it before a table)."""
    collected = _WARNINGS.get()
    if collected is not None:
        collected.flush()


def warnings_so_far() -> list[str]:
    """The warnings of the command being run, as its ``--json`` payload carries them."""
    collected = _WARNINGS.get()
    return list(collected.lines) if collected is not None else []


def emit(args: argparse.Namespace, command: str, payload: dict[str, Any], table: RenderableType) -> None:
    """The command's output: the payload a renderer built, in the JSON envelope (``--json``),
    or the terminal table. Commands build no dicts of their own."""
    flush_warnings()  # before the table: a user reads the caveat first
    if getattr(args, "json", False):
        sys.stdout.write(render_json(command, payload, warnings_so_far()) + "\n")
    else:
        # Piped output has no terminal width; 160 columns keep long kernel names readable.
        console = Console(soft_wrap=False)
        if not console.is_terminal:
            console = Console(soft_wrap=False, width=160)
        console.print(table)
