"""The subcommands, in the order ``tracewhy --help`` lists them.

Each lives in its own module holding one ``Command`` subclass. Modules are imported only when
their command runs (or for ``--help``): a cached trace reads in well under a second, and
importing every command's analyses would cost as much again.
"""

from __future__ import annotations

import importlib

from tracewhy.cli.base import Command

COMMAND_MODULES: dict[str, str] = {
    name: f"tracewhy.cli.commands.{name}"
    for name in ("diagnose", "account", "gaps", "info", "ops", "lines", "kernels", "nvtx", "steps", "overlap", "blocks",
                 "ranks", "roofline", "memory", "pipeline", "compile", "diff", "check", "sql", "export", "report",
                 "which", "capture", "schema")
}
COMMAND_MODULES["critical-path"] = "tracewhy.cli.commands.critical_path"  # a hyphen cannot name a module
#: Commands that serve the others rather than compute (no report, no ``--json`` document of their
#: own): ``mcp``, the Model Context Protocol server. Listed after the commands.
SERVER_MODULES: dict[str, str] = {"mcp": "tracewhy.cli.commands.mcp"}
ALL_MODULES: dict[str, str] = {**COMMAND_MODULES, **SERVER_MODULES}


def load_command(name: str) -> type[Command]:
    """The Command subclass of a subcommand name."""
    module = importlib.import_module(ALL_MODULES[name])
    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, Command) and value is not Command \
                and getattr(value, "name", None) == name:
            return value
    raise LookupError(f"{ALL_MODULES[name]} defines no Command named {name!r}")
