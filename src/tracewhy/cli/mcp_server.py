"""``tracewhy mcp``: tracewhy's commands as the tools of a Model Context Protocol server, for agents.

A tool is a command run in process as ``tracewhy COMMAND ... --json`` runs it: its input schema is
made from the command's own arguments (the trace paths and the options that change what is
computed, not how it is shown), its output schema is the command's shipped JSON Schema, and its
result is the command's ``--json`` document (structured content) with a short text summary. A
failed command is a tool error carrying the command's one-line message. The resources are the
finding-code reference and "How tracewhy decides", shipped in the package (``agent_docs/``).
Nothing is written on stdout but the protocol: documents are kept (``json_documents_kept``), and
the SDK's stdio transport sends anything else on fd 1 to stderr.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

from tracewhy import __version__
from tracewhy.cli.base import json_documents_kept, positive_int
from tracewhy.reports.schema import shipped_text

if TYPE_CHECKING:
    import mcp_types
    from mcp.server import Server, ServerRequestContext

#: The commands served as tools, by tool name (a hyphen in a command is "_" in its tool's name).
#: Adding a command is adding its name here.
TOOL_COMMANDS: Final = ("diagnose", "account", "steps", "kernels", "gaps", "overlap", "critical-path", "compile",
                        "memory", "lines", "diff", "sql")

#: Options that change how a command's output is shown or where it goes, not what it computes:
#: not tool arguments (``--json`` is always given; the document holds every row).
SHOWN_ONLY: Final = frozenset({"help", "json", "top", "no_cache", "wide", "color", "csv", "output", "flame",
                               "speedscope", "weight", "launches"})

#: The pages served as resources: URI, file in ``agent_docs/``, title, what it says.
RESOURCES: Final = (
    ("tracewhy://docs/finding-codes", "finding-codes.md", "Finding codes",
     "Every finding code tracewhy can report: its severity, what it means and what it rests on."),
    ("tracewhy://docs/decisions", "decisions.md", "How tracewhy decides",
     "How tracewhy decides: steps and warm-up, gaps and their classes, severities, the step account."),
)
DOCS_PACKAGE: Final = "agent_docs"


@dataclass(frozen=True)
class ToolArgument:
    """One argument of a tool: the command's positional or option it becomes."""

    name: str  # the property name: the option's long name with "_" for "-", or the positional's
    option: str | None  # "--min-gap"; None for a positional
    flag: bool  # a store_true option: given or not
    many: bool  # takes several values (nargs "+" or "*")
    required: bool  # a positional that must be given
    schema: dict[str, Any]


@dataclass(frozen=True)
class Tool:
    """A command served as a tool."""

    name: str
    command: str
    description: str
    arguments: tuple[ToolArgument, ...]

    def input_schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": {a.name: a.schema for a in self.arguments},
                "required": [a.name for a in self.arguments if a.required], "additionalProperties": False}

    def argv(self, given: Mapping[str, Any]) -> list[str]:
        """The command line that runs this tool with ``given``: the options, then after ``--`` the
        positionals (so that a path or a query starting with "-" is not read as an option)."""
        unknown = sorted(set(given) - {a.name for a in self.arguments})
        if unknown:
            raise ValueError(f"{self.name} takes no argument {', '.join(unknown)}; "
                             f"it takes {', '.join(a.name for a in self.arguments)}")
        missing = [a.name for a in self.arguments if a.required and given.get(a.name) in (None, "", [])]
        if missing:
            raise ValueError(f"{self.name} needs {', '.join(missing)}")
        options: list[str] = []
        positionals: list[str] = []
        for a in self.arguments:
            value = given.get(a.name)
            if value is None or value is False:
                continue
            values = [str(v) for v in value] if isinstance(value, list) else [str(value)]
            if a.option is None:
                positionals += values
            elif a.flag:
                options.append(a.option)
            elif a.many:
                options += [a.option, *values]
            else:
                options.append(f"{a.option}={value}")  # (a value starting with "-" stays the option's)
        return [self.command, *options, "--json", "--", *positionals]


def tools(commands: Sequence[str] = TOOL_COMMANDS) -> list[Tool]:
    """The tools of ``commands``, their arguments read from the commands' own parsers."""
    from tracewhy.cli import build_parser

    parsers: dict[str, argparse.ArgumentParser] = build_parser().commands  # type: ignore[attr-defined]
    made = []
    for command in commands:
        parser = parsers[command]
        arguments = tuple(a for a in (_argument(action) for action in parser._actions) if a is not None)
        summary = (parser.description or "").split("\n\n")[0].replace("\n", " ")
        made.append(Tool(command.replace("-", "_"), command, summary, arguments))
    return made


def _argument(action: argparse.Action) -> ToolArgument | None:
    long = next((s for s in action.option_strings if s.startswith("--")), None)
    name = long.removeprefix("--").replace("-", "_") if long else action.dest
    if name in SHOWN_ONLY or isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
        return None
    flag = isinstance(action, argparse._StoreTrueAction)
    many = action.nargs in ("+", "*")
    value: dict[str, Any]
    if flag:
        value = {"type": "boolean"}
    elif action.type is int or action.type is positive_int:
        value = {"type": "integer", **({"minimum": 0} if action.type is positive_int else {})}
    elif action.type is float:
        value = {"type": "number"}
    else:
        value = {"type": "string"}
    if action.choices is not None:
        value["enum"] = list(action.choices)
    if action.default not in (None, False, argparse.SUPPRESS) and not many:
        value["default"] = action.default
    if many:  # (one value alone, or a list: "trace": "a.json" as well as "trace": ["r0.json", "r1.json"])
        listed = {"type": "array", "items": value, **({"minItems": 1} if action.nargs == "+" else {})}
        value = {"anyOf": [value, listed]}
    if action.help:
        value["description"] = action.help.replace("%(default)s", str(action.default)).replace("%%", "%")
    required = long is None and action.nargs not in ("?", "*")
    return ToolArgument(name, long, flag, many, required, value)


def run_tool(tool: Tool, given: Mapping[str, Any], no_cache: bool = False) -> tuple[dict[str, Any] | None, str]:
    """The command's ``--json`` document and a summary; (None, the one-line message) when it
    failed (bad arguments, an unreadable trace, a usage error). ``no_cache``: as ``--no-cache``."""
    from tracewhy.cli import main

    try:
        argv = tool.argv(given)
        if no_cache:
            argv.insert(1, "--no-cache")
    except ValueError as e:
        return None, str(e)
    with json_documents_kept() as documents:
        code = main(argv)
    if not documents:
        return None, f"tracewhy {tool.command} exited {code} without a document"
    document: dict[str, Any] = json.loads(documents[-1])
    error = document.get("error")
    if isinstance(error, dict):
        return None, str(error.get("message", "failed"))
    return document, summary(tool.command, document)


def summary(command: str, document: Mapping[str, Any]) -> str:
    """A few lines saying what the document holds: its verdict or findings first."""
    lines = [f"tracewhy {command}: the full result is the structured content (schema: tracewhy schema {command})."]
    for key in ("verdict", "statement"):
        if isinstance(document.get(key), str):
            lines.append(f"{key}: {document[key]}")
    findings = document.get("findings")
    if isinstance(findings, list):
        lines.append(f"{len(findings)} finding{'s' if len(findings) != 1 else ''}" + (":" if findings else ""))
        lines += [f"- {f.get('severity')} {f.get('code')}: {f.get('statement')}" for f in findings[:5]]
    counts = [f"{key}: {len(value)}" for key, value in document.items() if isinstance(value, list) and key not in
              ("findings", "warnings")]
    if counts:
        lines.append("rows: " + ", ".join(counts))
    warnings = document.get("warnings") or []
    if warnings:
        lines.append(f"{len(warnings)} reader warning{'s' if len(warnings) != 1 else ''}: {warnings[0]}")
    return "\n".join(lines)


def resource_text(uri: str) -> str:
    """The page of a resource URI, as shipped in the package."""
    for known, file, _, _ in RESOURCES:
        if known == uri:
            return resources.files("tracewhy").joinpath(DOCS_PACKAGE).joinpath(file).read_text(encoding="utf-8")
    raise ValueError(f"no resource {uri}; the resources are {', '.join(r[0] for r in RESOURCES)}")


def build_server(commands: Sequence[str] = TOOL_COMMANDS, no_cache: bool = False) -> Server[Any]:
    """The server: its tools, their schemas and its resources; with ``no_cache``, every command
    reads its traces afresh (``tracewhy mcp --no-cache``). Needs the ``mcp`` extra."""
    import anyio
    import mcp_types as types
    from mcp.server import Server

    served = {t.name: t for t in tools(commands)}
    listed = [types.Tool(name=t.name, title=f"tracewhy {t.command}", description=t.description,
                         input_schema=t.input_schema(), output_schema=json.loads(shipped_text(t.command)),
                         annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False))
              for t in served.values()]

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = served.get(params.name)
        if tool is None:
            return _error(f"no tool {params.name!r}; the tools are {', '.join(served)}")
        # (the analysis is CPU work: a thread, so that the server keeps answering meanwhile)
        document, text = await anyio.to_thread.run_sync(run_tool, tool, dict(params.arguments or {}), no_cache)
        if document is None:
            return _error(text)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=document)

    async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=uri, name=file.removesuffix(".md"), title=title, description=about,
                           mime_type="text/markdown") for uri, file, title, about in RESOURCES])

    async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult:
        text = resource_text(str(params.uri))
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=str(params.uri),
                                                                             mime_type="text/markdown", text=text)])

    return Server("tracewhy", version=__version__, instructions=INSTRUCTIONS, on_list_tools=list_tools,
                  on_call_tool=call_tool, on_list_resources=list_resources, on_read_resource=read_resource)


def _error(message: str) -> mcp_types.CallToolResult:
    import mcp_types as types

    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


#: What the server tells an agent when it connects.
INSTRUCTIONS: Final = (
    "tracewhy reads GPU profiler traces (PyTorch profiler / Kineto JSON, Nsight Systems SQLite exports) and says "
    "why a PyTorch job is slower than it should be. Start with `diagnose` on a trace path: ranked findings, each "
    "with its evidence, the time it costs per step and the next step to take. Then `steps`, `gaps`, `kernels`, "
    "`overlap`, `critical_path`, `lines`, `memory` or `compile` for the part a finding names; `diff` compares two "
    "runs; `sql` queries the trace's tables. Times are integer nanoseconds. The resource tracewhy://docs/"
    "finding-codes explains every finding code; tracewhy://docs/decisions how tracewhy decides.")


def serve_stdio(no_cache: bool = False) -> None:
    """Serve on stdin and stdout until the client closes them."""
    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server(no_cache=no_cache)

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(serve)
