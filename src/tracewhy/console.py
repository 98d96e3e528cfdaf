"""The ``tracewhy`` script (and ``python -m tracewhy``): the helper of a small diff started
first (``diff_helper``), before the command line's own imports (40-80 ms), so that it is ready
when the command is; then the command (``cli.console_main``, which also asks for the helper and
keeps the one started here)."""

from __future__ import annotations

import sys

from tracewhy import diff_helper


def console_main() -> None:
    """Start a small diff's helper, then run the command line."""
    diff_helper.start_early(sys.argv[1:], command_process=True)
    from tracewhy.cli import console_main as command_line

    command_line()
