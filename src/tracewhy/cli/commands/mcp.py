from __future__ import annotations

import argparse

from tracewhy.cli.base import Command
from tracewhy.errors import UsageError, install_hint


class McpCommand(Command):
    """Serve tracewhy's commands to an agent: a Model Context Protocol server on stdin/stdout.

    Its tools are diagnose, steps, kernels, gaps, overlap, critical_path, compile, memory, lines,
    diff and sql, each returning the command's --json document; its resources are the finding-code
    reference and "How tracewhy decides". A client starts it as: command "tracewhy", args ["mcp"].
    Needs the mcp extra.
    """

    name = "mcp"
    takes_trace = False

    def configure(self, parser: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace) -> int:
        try:
            import mcp.server  # noqa: F401 (only to say what is missing before serving)
        except ImportError:
            raise UsageError(f"tracewhy mcp needs the mcp package: {install_hint('mcp')}") from None
        from tracewhy.cli.mcp_server import serve_stdio

        serve_stdio(no_cache=args.no_cache)  # (the commands it runs read afresh too)
        return 0
