"""The program of the helper process that reads and diagnoses a small diff's run B
(``tracewhy.diff_helper`` starts it, ``reports/diff_elsewhere`` says what it answers)."""

from __future__ import annotations

import sys

from tracewhy.cli import as_command, end_command
from tracewhy.diff_helper import COMMAND


def serve() -> None:
    """Set up as the command is (its words after ``diff`` are this process's arguments), wait for
    the job on stdin, answer on stdout, and end without the interpreter's teardown."""
    as_command([COMMAND, *sys.argv[1:]])
    from tracewhy.reports.diff_elsewhere import answer  # (after as_command: polars' pool is sized at its import)

    answer(sys.stdin.buffer, sys.stdout.buffer)
    end_command(0)
