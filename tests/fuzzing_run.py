"""Run one fuzzed input through the reader and the commands, in this process, and classify it:
handled, warned (read, with a warning), refused (one-line error, exit 2/3) or internal (any other
exception, exit 70, a traceback or a many-line error). Shared by tests/test_fuzz.py and
scripts/fuzz.py, which runs it in worker processes with a timeout.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tracewhy.errors import TraceError, UsageError

#: Verdicts, best first; an input's verdict is the worst of its reads and commands.
VERDICTS = ("handled", "warned", "refused", "internal")

#: Commands for a Kineto or nsys input, each with how often the long run picks it.
TRACE_COMMANDS: tuple[tuple[tuple[str, ...], int], ...] = (
    (("info",), 4), (("kernels",), 4), (("diagnose",), 5), (("gaps",), 4), (("overlap",), 4),
    (("ops",), 2), (("ops", "--shapes"), 1), (("steps",), 2), (("nvtx",), 2), (("blocks",), 2),
    (("check", "--max-gpu-idle", "50%", "--max-step-p50", "1s", "--allow-unmeasured"), 2),
    (("roofline",), 1), (("export", "-o", "{out}.json.gz"), 1), (("report", "-o", "{out}.html"), 1),
    (("diff", "{original}", "{input}"), 1), (("check", "--baseline", "{original}", "--allow-unmeasured"), 1),
    (("ranks", "--workers", "1", "{input}"), 1),
    (("critical-path",), 2), (("compile",), 1), (("memory",), 1), (("lines",), 1),
    (("sql", "{input}", "SELECT count(*), sum(dur_ns) FROM kernels"), 1),
)
NCU_COMMANDS: tuple[tuple[tuple[str, ...], int], ...] = (
    (("roofline",), 4), (("roofline", "--launches"), 1), (("roofline", "--device", "H100 SXM"), 1),
)


@dataclass
class Outcome:
    """What one input did: its verdict, and for an internal error the command and what it said."""

    verdict: str = "handled"
    problems: list[str] = field(default_factory=list)
    stray_warnings: list[str] = field(default_factory=list)
    #: The seed's own reader warnings: an input that only repeats them is handled, not warned.
    known: frozenset[str] = frozenset()

    def is_new(self, warning: str) -> bool:
        return not any(warning.endswith(k) for k in self.known)

    def worsen(self, verdict: str, problem: str | None = None) -> None:
        if VERDICTS.index(verdict) > VERDICTS.index(self.verdict):
            self.verdict = verdict
        if problem is not None:
            self.problems.append(problem)


@contextlib.contextmanager
def _debug_env() -> Iterator[None]:
    """No parse cache; TRACEWHY_DEBUG so an internal error raises here with its traceback."""
    saved = {k: os.environ.get(k) for k in ("TRACEWHY_NO_CACHE", "TRACEWHY_DEBUG")}
    os.environ["TRACEWHY_NO_CACHE"] = "1"
    os.environ["TRACEWHY_DEBUG"] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _native_stderr() -> Iterator[list[str]]:
    """What native code (a C++ library's log) writes straight to file descriptor 2 meanwhile:
    the user sees it, though ``redirect_stderr`` does not."""
    written: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield written
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            written.append(sink.read().decode("utf-8", "replace"))


def _last_lines(text: str, n: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def run_cli(argv: Sequence[str], outcome: Outcome) -> int | None:
    """``tracewhy.cli.main(argv)`` in this process, its output swallowed; judged into ``outcome``."""
    from tracewhy.cli import main

    out, err = io.StringIO(), io.StringIO()
    label = "tracewhy " + " ".join(argv)
    with _debug_env(), warnings.catch_warnings(record=True) as caught, _native_stderr() as native, \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        warnings.simplefilter("always")
        try:
            code: int | None = main(list(argv))
        except BaseException as e:  # anything escaping main is the finding
            if isinstance(e, KeyboardInterrupt):
                raise
            outcome.worsen("internal", f"{label}\n{_last_lines(traceback.format_exc(), 40)}")
            return None
    outcome.stray_warnings.extend(f"{label}: {w.category.__name__}: {w.message}" for w in caught)
    stderr = err.getvalue()
    if native[0].strip():
        outcome.worsen("internal", f"{label}\nexit {code}; native code wrote to stderr:\n{_last_lines(native[0], 6)}")
    lines = stderr.strip().splitlines()
    if "Traceback" in stderr or code == 70 or "out of memory" in stderr:
        outcome.worsen("internal", f"{label}\nexit {code}\n{_last_lines(stderr)}")
    elif code in (2, 3):
        # One error line, last; warnings about the other input of diff may come before it.
        errors = [line for line in lines if line.startswith("tracewhy: error:")]
        if len(errors) != 1 or lines[-1] != errors[0] or not all(x.startswith("tracewhy: ") for x in lines):
            outcome.worsen("internal", f"{label}\nexit {code} with a {len(lines)}-line error:\n{_last_lines(stderr)}")
        else:
            outcome.worsen("refused")
    elif code in (0, 1):
        if any(outcome.is_new(line) for line in lines) or caught:
            outcome.worsen("warned")
    else:
        outcome.worsen("internal", f"{label}\nexit {code}\n{_last_lines(stderr)}")
    return code


def check_read(path: Path, fmt: str, outcome: Outcome, rng: random.Random | None = None) -> None:
    """Read the input with the library API; a result must pass its model check."""
    from tracewhy import load
    from tracewhy.model import Kind
    from tracewhy.readers import CacheOptions, read_trace
    from tracewhy.readers.ncu.reader import read_ncu

    with _debug_env(), warnings.catch_warnings(record=True) as caught, _native_stderr() as native:
        warnings.simplefilter("always")
        try:
            if fmt == "ncu":
                report = read_ncu(path)
                report.check()
                if any(outcome.is_new(w) for w in report.warnings):
                    outcome.worsen("warned")
            else:
                trace = load(path)
                trace.check()
                if any(outcome.is_new(w) for w in trace.meta.warnings) or trace.meta.truncation is not None:
                    outcome.worsen("warned")
                if fmt == "nsys" and rng is not None:  # a partial read, as the commands do
                    kinds = rng.sample(sorted(Kind, key=lambda k: k.value), rng.randint(1, 4))
                    read_trace(path, cache=CacheOptions(enabled=False), kinds=kinds).check()
        except (TraceError, UsageError):
            outcome.worsen("refused")
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            outcome.worsen("internal", f"read ({fmt})\n{_last_lines(traceback.format_exc(), 40)}")
    outcome.stray_warnings.extend(f"read: {w.category.__name__}: {w.message}" for w in caught)
    if native[0].strip():
        outcome.worsen("internal", f"read ({fmt}); native code wrote to stderr:\n{_last_lines(native[0], 6)}")


def pick_commands(fmt: str, rng: random.Random, count: int) -> list[tuple[str, ...]]:
    table = NCU_COMMANDS if fmt == "ncu" else TRACE_COMMANDS
    commands = [c for c, _ in table]
    weights = [w for _, w in table]
    chosen = []
    for command in rng.choices(commands, weights, k=count):
        if rng.random() < 0.3 and command[0] not in ("export", "report"):
            command = (*command, "--json")
        chosen.append(command)
    return chosen


def command_argv(command: Sequence[str], path: Path, original: Path, out_stem: Path) -> list[str]:
    """The argv of a command template: ``{input}``/``{original}``/``{out}`` filled in; the
    input is appended unless the template names it."""
    fill = {"input": str(path), "original": str(original), "out": str(out_stem)}
    argv = [part.format(**fill) for part in command]
    if "{input}" not in command:
        argv.insert(1, str(path))
    return argv


_SEED_WARNINGS: dict[tuple[Path, str], frozenset[str]] = {}


def seed_warnings(original: Path, fmt: str) -> frozenset[str]:
    """The warnings the unmutated input itself gets from its reader (none if it cannot be read:
    then the mutant's read will say why)."""
    from tracewhy import load
    from tracewhy.readers.ncu.reader import read_ncu

    key = (original, fmt)
    if key not in _SEED_WARNINGS:
        with _debug_env():
            try:
                found = read_ncu(original).warnings if fmt == "ncu" else load(original).meta.warnings
            except Exception:
                return frozenset()
        _SEED_WARNINGS[key] = frozenset(found)
    return _SEED_WARNINGS[key]


def run_input(path: Path, fmt: str, original: Path, commands: Sequence[Sequence[str]],
              rng: random.Random | None = None) -> Outcome:
    """The read check, then each command, on one input."""
    outcome = Outcome(known=seed_warnings(original, fmt))
    check_read(path, fmt, outcome, rng)
    for command in commands:
        run_cli(command_argv(command, path, original, path.with_name(path.name + ".out")), outcome)
    return outcome
