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

from tracewhy import __version__
from tracewhy.cli.base import add_common_options, run_command
from tracewhy.cli.commands import COMMAND_MODULES, load_command
from tracewhy.errors import TraceError, UsageError
from tracewhy.units import printable

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_BAD_INPUT = 3
EXIT_INTERNAL = 70


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given argv naming a command, only that command's module is imported."""
    parser = argparse.ArgumentParser(
        prog="tracewhy",
        description="Says why a PyTorch job is slower than it should be, from its profiler traces.",
    )
    parser.add_argument("--version", action="version", version=f"tracewhy {__version__}")
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)
    chosen = next((a for a in (argv or ()) if not a.startswith("-")), None)
    names = [chosen] if chosen in COMMAND_MODULES else list(COMMAND_MODULES)
    for cls in (load_command(n) for n in names):
        doc = inspect.getdoc(cls) or ""
        p = sub.add_parser(cls.name, help=doc.splitlines()[0] if doc else None, description=doc)
        command = cls()
        if cls.takes_trace:
            p.add_argument("trace", metavar="TRACE", help="trace file: PyTorch profiler .json/.json.gz or an "
                                                          "nsys SQLite export (.sqlite[.gz], .nsys-rep)")
        command.configure(p)
        add_common_options(p)
        p.set_defaults(command=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has already printed usage or help
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        with _signals_raise():
            return run_command(args)
    except Stopped as e:  # the context managers on the way out removed our temporary files
        print(f"tracewhy: stopped by {signal.Signals(e.signum).name}", file=sys.stderr)
        return 128 + e.signum
    except TraceError as e:  # (printable: a file name may hold an escape sequence)
        print(f"tracewhy: error: {printable(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except UsageError as e:
        print(f"tracewhy: error: {printable(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except MemoryError:
        print("tracewhy: error: out of memory while reading the trace", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:
        if os.environ.get("TRACEWHY_DEBUG"):
            traceback.print_exc()
            return EXIT_INTERNAL  # still a bug: scripts must not read it as a failed check
        msg = " ".join(str(e).split())[:300]
        print(f"tracewhy: internal error: {type(e).__name__}: {msg} "
              "(a bug; TRACEWHY_DEBUG=1 shows the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


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
    sys.exit(main())
