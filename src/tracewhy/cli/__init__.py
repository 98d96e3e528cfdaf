"""The ``tracewhy`` command: parses arguments, runs one subcommand, turns errors into exit codes.

Exit codes: 0 success; 1 a ``check`` threshold was violated; 2 bad usage; 3 bad input file;
70 an internal error (a bug: set TRACEWHY_DEBUG=1 to see the traceback; the code stays 70);
128 + N when stopped by signal N (SIGTERM, SIGHUP), after removing its temporary files.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Final, NoReturn

from tracewhy import __version__, diff_helper
from tracewhy.cli.base import Warnings, add_common_options, run_command, write_json_document
from tracewhy.cli.commands import ALL_MODULES, load_command
from tracewhy.command_process import end, settle
from tracewhy.errors import TraceError, UsageError
from tracewhy.read_helpers import start_early
from tracewhy.units import printable

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_BAD_INPUT = 3
EXIT_INTERNAL = 70


#: What ``tracewhy`` alone prints: the questions it answers and the command for each.
TOUR: Final = """\
tracewhy says why a PyTorch job is slower than it should be, from its profiler traces.

  Where does the time go?          tracewhy diagnose TRACE    (then steps, ops, kernels, blocks)
  Where is the GPU idle, and why?  tracewhy gaps TRACE
  Is the overlap real?             tracewhy overlap TRACE     (stages: tracewhy pipeline LOG)
  Why is this kernel slow?         tracewhy roofline REPORT.ncu-rep
  What changed between A and B?    tracewhy diff A B

  Everything on one page:          tracewhy report TRACE -o report.html
  Not sure where to start:         tracewhy which SYMPTOM

TRACE: a torch.profiler trace (.json, .json.gz) or an Nsight Systems export (.sqlite, .nsys-rep).
All commands: tracewhy --help; one command: tracewhy COMMAND --help.
"""


#: The message of the usage error argparse is about to exit with (for ``--json``'s error document).
_USAGE_ERROR: ContextVar[str | None] = ContextVar("tracewhy_usage_error", default=None)


class _Parser(argparse.ArgumentParser):
    """The top-level parser, which knows its subcommands' parsers: an option a subcommand does
    not have is reported with that subcommand's usage, not the top level's."""

    commands: dict[str, argparse.ArgumentParser]

    def error(self, message: str) -> NoReturn:
        _USAGE_ERROR.set(message)
        super().error(message)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given argv naming a command, only that command's module is imported."""
    parser = _Parser(
        prog="tracewhy",
        description="Says why a PyTorch job is slower than it should be, from its profiler traces.",
    )
    parser.commands = {}
    parser.add_argument("--version", action="version", version=f"tracewhy {__version__}")
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)
    chosen = next((a for a in (argv or ()) if not a.startswith("-")), None)
    names = [chosen] if chosen in ALL_MODULES else list(ALL_MODULES)
    for cls in (load_command(n) for n in names):
        doc = inspect.getdoc(cls) or ""
        p = sub.add_parser(cls.name, help=doc.splitlines()[0] if doc else None, description=doc)
        command = cls()
        if cls.takes_traces:
            p.add_argument("trace", nargs="+", metavar="TRACE",
                           help="trace files (PyTorch profiler .json/.json.gz, nsys SQLite exports .sqlite[.gz], "
                                ".nsys-rep) or directories of them; several are read as the ranks of one job "
                                "when their distributedInfo says so, else one after another")
        elif cls.takes_trace:
            p.add_argument("trace", metavar="TRACE", help="trace file: PyTorch profiler .json/.json.gz or an "
                                                          "nsys SQLite export (.sqlite[.gz], .nsys-rep)")
        command.configure(p)
        add_common_options(p)
        p.set_defaults(command=command)
        parser.commands[cls.name] = p
    return parser


def _command_word(argv: Sequence[str]) -> str | None:
    """The subcommand the user typed: the first word that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    import difflib  # (only for a misspelt command or option)

    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?"


def _unknown_command(parser: argparse.ArgumentParser, word: str) -> tuple[int, str]:
    """Usage, and the commands spelt closest; a file given without a command gets the one to run.
    Returns the exit code and the message."""
    parser.print_usage(sys.stderr)
    hint = (f"; to diagnose it: tracewhy diagnose {printable(word)}" if os.path.exists(word)
            else _did_you_mean(word, list(ALL_MODULES)))
    message = f"unknown command {printable(word)!r}{hint} (tracewhy --help lists them)"
    print(f"tracewhy: error: {message}", file=sys.stderr)
    return EXIT_USAGE, message


def _json_wanted(argv: Sequence[str]) -> bool:
    """Whether ``--json`` is among tracewhy's own arguments (not among a profiled job's, after ``--``)."""
    own = argv[:list(argv).index("--")] if "--" in argv else argv
    return "--json" in own


def _json_error(command: str | None, message: str, code: int, warnings: Warnings | None = None) -> int:
    """With ``--json``, stdout still gets one document: the envelope with ``error``. The one
    line on stderr has been printed already; the exit code is unchanged."""
    if command is None:  # (no command named: no document of any command's to print)
        return code
    from tracewhy.renderers.jsonout import render_error_json

    with contextlib.suppress(BrokenPipeError, ValueError):  # (stdout closed: nothing more can be said)
        write_json_document(render_error_json(command, message, code, warnings.lines if warnings else []))
    return code


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """The arguments; an unknown option is reported by its subcommand's parser (its usage, and
    the options it has that are spelt closest)."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub = getattr(parser, "commands", {}).get(getattr(args, "command_name", None), parser)
        known = [s for action in sub._actions for s in action.option_strings]
        hints = "".join(_did_you_mean(e.split("=", 1)[0], known) for e in extras if e.startswith("-"))
        sub.error(f"unrecognized arguments: {' '.join(extras)}{hints}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        sys.stdout.write(TOUR)
        return EXIT_OK
    # Before the imports below (0.3 s): a large trace's decoding helper, or the helper that
    # diagnoses a small diff's run B, imports meanwhile.
    start_early(argv)
    diff_helper.start_early(argv)
    parser = build_parser(argv)
    word = _command_word(argv)
    as_json = _json_wanted(argv)
    if word is not None and word not in ALL_MODULES and not {"-h", "--help", "--version"} & set(argv):
        code, message = _unknown_command(parser, word)
        return _json_error(word, message, code) if as_json else code
    token = _USAGE_ERROR.set(None)
    try:
        args = _parse(parser, argv)
    except SystemExit as e:  # argparse has already printed usage or help
        code = e.code if isinstance(e.code, int) else EXIT_USAGE
        usage = _USAGE_ERROR.get()
        return _json_error(word, usage, code) if as_json and usage is not None else code
    finally:
        _USAGE_ERROR.reset(token)
    command = args.command.name
    as_json = bool(getattr(args, "json", False)) or as_json
    collected = Warnings()
    try:
        with _signals_raise():
            return run_command(args, collected)
    except Stopped as e:  # the context managers on the way out removed our temporary files
        print(f"tracewhy: stopped by {signal.Signals(e.signum).name}", file=sys.stderr)
        return 128 + e.signum
    except TraceError as e:  # (printable: a file name may hold an escape sequence)
        return _failed(command, as_json, f"error: {printable(str(e))}", EXIT_BAD_INPUT, collected)
    except UsageError as e:
        return _failed(command, as_json, f"error: {printable(str(e))}", EXIT_USAGE, collected)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except MemoryError:
        return _failed(command, as_json, "error: out of memory while reading the trace", EXIT_BAD_INPUT, collected)
    except Exception as e:
        if _interrupted(e):
            return 130
        if os.environ.get("TRACEWHY_DEBUG"):
            traceback.print_exc()
            return EXIT_INTERNAL  # still a bug: scripts must not read it as a failed check
        msg = " ".join(str(e).split())[:300]
        return _failed(command, as_json, f"internal error: {type(e).__name__}: {msg} "
                       "(a bug; TRACEWHY_DEBUG=1 shows the traceback)", EXIT_INTERNAL, collected)


def _interrupted(e: BaseException) -> bool:
    """Whether ``e`` stands for Ctrl-C: an extension that saw the interrupt arrive during its call
    and raised something else from it. numba's compiled loops (``model/compiled.py``) do: a loop that
    returns an array while the KeyboardInterrupt is pending raises SystemError ("returned a result
    with an exception set") from it, which read as an internal error (exit 70)."""
    seen: set[int] = set()
    at: BaseException | None = e
    while at is not None and id(at) not in seen:
        if isinstance(at, KeyboardInterrupt):
            return True
        seen.add(id(at))
        at = at.__cause__ or at.__context__
    return False


def _failed(command: str, as_json: bool, line: str, code: int, warnings: Warnings) -> int:
    """The one line on stderr (``tracewhy: error: ...``) and, with ``--json``, the error document."""
    print(f"tracewhy: {line}", file=sys.stderr)
    if not as_json:
        return code
    return _json_error(command, line.removeprefix("error: "), code, warnings)


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived (a job scheduler, ``timeout``): raised where the program is,
    so that every ``finally`` and context manager on the way out runs and removes what was
    made (the inflated nsys copy, the parallel reader's scratch in /dev/shm, its helpers)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


#: The signals that end tracewhy the orderly way; SIGINT already raises KeyboardInterrupt.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """While a command runs, the stop signals raise ``Stopped``; the old handlers come back after.
    Only the main thread may set handlers (tests call ``main`` from others too)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def console_main() -> None:
    """The ``tracewhy`` command: ``main`` in a process set up and ended as ``as_command`` and
    ``end_command`` say."""
    as_command(sys.argv[1:])
    end_command(main())


def as_command(argv: Sequence[str] = ()) -> None:
    """Settings of a process that runs one command (``argv``): ``command_process.settle``, with
    the table of compiled dataclass methods of the command named (none for an unknown word)."""
    word = _command_word(argv)
    rest = argv[list(argv).index(word) + 1:] if word is not None else ()
    settle(word, rest, code_table=word in ALL_MODULES)


def end_command(code: int) -> NoReturn:
    """End a process that ran one command (``command_process.end``)."""
    end(code)
