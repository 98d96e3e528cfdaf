"""The helper process that reads and diagnoses run B of a ``diff`` of two small traces, started
before the command's own imports.

A diff is two diagnoses, and a diagnosis of a small trace is mostly Python holding the GIL around
~1,000 short polars queries: on two threads the two took about three quarters of the time they
take in turn, and the whole command about 1.35 times a ``diagnose`` (BERT, 1 MB: 0.62 against
0.45 s). A second process has a core to itself: started first thing, it imports while the
command imports, then reads and diagnoses B while the command reads and diagnoses A
(``reports/diff_elsewhere`` says what it is given and what it answers).

Started only for ``diff`` on files that are small together (``input_size.small_inputs``, the
bound under which a command keeps polars to one thread): there each process keeps to one core,
the command to the CPU it runs on and the helper to the others (``command_process.keep_apart``).
A helper that the command does not take (the line was not what it seemed before parsing: a
usage error, ``--help``) is stopped when the command ends; one that fails costs only time, as
the command then does B itself. Standard library only, as ``read_helpers`` is.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from tracewhy.input_size import small_inputs
from tracewhy.read_helpers import ENV_IN_HELPER, end

if TYPE_CHECKING:
    import subprocess

#: The command the helper is started for.
COMMAND: Final = "diff"
#: What the helper runs; the command line's words after ``diff`` follow as its arguments, so
#: that it sets itself up as the command does (``command_process.settle``).
_SERVE: Final = "from tracewhy.diff_helper import serve; serve()"

#: The helper started early, with the command line it was started for.
_early: list[tuple[tuple[str, ...], subprocess.Popen[bytes]]] = []


def start_early(argv: Sequence[str], *, command_process: bool = False) -> None:
    """Start the helper when ``argv`` (a command line) is a ``diff`` whose files are small
    together. Only a guess made before the line is parsed: the command takes the helper
    (``take``) once it knows its files. Called again for the same line (the ``tracewhy`` script
    calls it before the command line's imports, ``console.console_main``, and ``main``
    after), the helper already started is kept; one left from an earlier command run in this
    process (the MCP server runs many) is stopped.

    ``command_process``: this process runs this one command (the ``tracewhy`` script). It then
    keeps to one CPU before the helper starts, and the helper to another
    (``command_process.keep_to_one_cpu``), so that the two never share one while a second is
    free."""
    if _early and _early[-1][0] == tuple(argv) and _early[-1][1].poll() is None:
        return
    stop()
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] != COMMAND or os.environ.get(ENV_IN_HELPER):
        return
    rest = list(argv[list(argv).index(COMMAND) + 1:])
    if not small_inputs(rest):
        return
    import subprocess  # (only for a diff: not part of every command's start)

    from tracewhy import command_process as process

    before = process.keep_to_one_cpu() if command_process else frozenset()
    with contextlib.suppress(OSError):  # cannot start processes here: the command does B itself
        _early.append((tuple(argv), subprocess.Popen(
            [sys.executable, "-c", _SERVE, *rest], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=dict(os.environ, **{ENV_IN_HELPER: "1"}),
        )))
        process.keep_apart(_early[-1][1].pid, before)


def take(paths: Sequence[str]) -> subprocess.Popen[bytes] | None:
    """The helper started early, now the command's, if it is running and ``paths`` (the files
    the command line turned out to name) are small together; else None (and any helper is
    stopped). Whoever takes it gives it its job and ends it (``read_helpers.end``)."""
    proc = _early.pop()[1] if _early else None
    if proc is not None and proc.poll() is None and small_inputs(paths):
        return proc
    if proc is not None:
        end(proc)
    return None


@atexit.register
def stop() -> None:
    """Stop a helper started early that no command took."""
    while _early:
        end(_early.pop()[1])


def serve() -> None:
    """The helper's life: set up as the command is, wait for its job on stdin, answer on
    stdout, and end without the interpreter's teardown. It does not import the command line
    (``tracewhy.cli``, 40-80 ms): the helper is ready that much sooner."""
    from tracewhy import command_process

    command_process.settle(COMMAND, sys.argv[1:], code_table=True)
    from tracewhy.reports.diff_elsewhere import answer  # (after settle: polars' pool is sized at its import)

    answer(sys.stdin.buffer, sys.stdout.buffer)
    command_process.end(0)
