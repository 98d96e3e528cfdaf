"""``tracewhy mcp``: the server answers the SDK's own client, in process (and once over stdio, as
an agent starts it): its tools are the commands with their shipped schemas, a tool's result is the
command's ``--json`` document, its resources are the docs pages, and a bad input is a tool error."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from api_support import A100, RANKS, cli_json
from conftest import ROOT, shared_trace
from tracewhy import __version__
from tracewhy.cli.mcp_server import RESOURCES, TOOL_COMMANDS, build_server
from tracewhy.reports.schema import shipped_text

Client = pytest.importorskip("mcp").Client  # the mcp extra
anyio = pytest.importorskip("anyio")  # (which the mcp SDK runs on)
SMALL = "hta/a100_cuda_event_sync_small.json.gz"


def with_client(check: Callable[[Any], Awaitable[None]]) -> None:
    """Run ``check`` against a fresh server through the SDK's client, with the initialize handshake."""

    async def session() -> None:
        async with Client(build_server(), mode="legacy") as client:
            await check(client)

    anyio.run(session)


def test_initialize_and_every_tool_with_its_schemas() -> None:
    async def check(client: Any) -> None:
        assert client.server_info is not None
        assert (client.server_info.name, client.server_info.version) == ("tracewhy", __version__)
        assert client.instructions is not None and "diagnose" in client.instructions
        listed = (await client.list_tools()).tools
        assert [t.name for t in listed] == [c.replace("-", "_") for c in TOOL_COMMANDS]
        for tool in listed:
            command = tool.name.replace("_", "-")
            assert tool.output_schema == json.loads(shipped_text(command)), tool.name
            jsonschema.Draft202012Validator.check_schema(tool.input_schema)
            assert tool.input_schema["additionalProperties"] is False
            assert "json" not in tool.input_schema["properties"] and "top" not in tool.input_schema["properties"]
        by_name = {t.name: t.input_schema for t in listed}
        assert by_name["diagnose"]["required"] == ["trace"]
        assert by_name["diagnose"]["properties"]["trace"]["anyOf"][1]["type"] == "array"  # one path, or several
        assert by_name["diff"]["required"] == ["a", "b"] and by_name["sql"]["required"] == ["trace", "query"]
        assert by_name["gaps"]["properties"]["min_gap"] == {
            "type": "integer", "minimum": 0, "default": 2000,
            "description": "shortest gap listed, in ns (default 2000)"}

    with_client(check)


def test_a_tool_returns_the_commands_json_document() -> None:
    path = str(shared_trace(A100))

    async def check(client: Any) -> None:
        result = await client.call_tool("diagnose", {"trace": path})
        assert not result.is_error
        document = result.structured_content
        assert document == cli_json("diagnose", path)
        jsonschema.validate(document, json.loads(shipped_text("diagnose")))
        text = result.content[0].text  # type: ignore[union-attr]
        first = document["findings"][0]
        assert f"{first['code']}: {first['statement']}" in text
        gaps = await client.call_tool("gaps", {"trace": path, "class": "launch", "min_gap": 5000})
        assert gaps.structured_content == cli_json("gaps", path, "--class", "launch", "--min-gap", "5000")
        assert len(gaps.structured_content["gaps"]) > 0
        ranks = [str(p) for p in RANKS]  # several traces: a list, as several paths on the command line
        several = await client.call_tool("diagnose", {"trace": ranks})
        assert several.structured_content == cli_json("diagnose", *ranks)
        assert several.structured_content["grouping"]["read_as"] == "ranks"
        query = "-- a comment first\nSELECT count(*) AS kernels FROM kernels"  # (not an option)
        counted = await client.call_tool("sql", {"trace": path, "query": query})
        assert counted.structured_content["rows"] == [{"kernels": 2700}]

    with_client(check)


def test_resources_are_the_docs_pages_shipped_in_the_package() -> None:
    async def check(client: Any) -> None:
        listed = (await client.list_resources()).resources
        assert [(str(r.uri), r.mime_type) for r in listed] == [(uri, "text/markdown") for uri, *_ in RESOURCES]
        for uri, page, _, _ in RESOURCES:
            read = await client.read_resource(uri)
            assert read.contents[0].text == (ROOT / "docs" / page).read_text(encoding="utf-8")  # type: ignore[union-attr]

    with_client(check)


def test_the_shipped_pages_are_the_docs_pages() -> None:
    """src/tracewhy/agent_docs/ holds copies (a wheel has no docs/): run scripts/agent_docs.py after
    editing docs/finding-codes.md or docs/decisions.md."""
    for _, page, _, _ in RESOURCES:
        shipped = ROOT / "src" / "tracewhy" / "agent_docs" / page
        assert shipped.read_bytes() == (ROOT / "docs" / page).read_bytes(), f"{page}: run scripts/agent_docs.py"


def test_bad_input_is_a_tool_error_with_the_commands_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "cut.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1')

    async def check(client: Any) -> None:
        calls: list[tuple[str, dict[str, Any], str]] = [
            ("diagnose", {"trace": str(bad)}, str(bad)),
            ("diagnose", {"trace": str(tmp_path / "missing.json")}, "missing.json"),
            ("diagnose", {}, "diagnose needs trace"),
            ("kernels", {"trace": str(bad), "topp": 3}, "kernels takes no argument topp"),
            ("gaps", {"trace": str(bad), "class": "nope"}, "invalid choice: 'nope'"),
            ("diagnos", {"trace": str(bad)}, "no tool 'diagnos'"),
        ]
        for tool, arguments, says in calls:
            result = await client.call_tool(tool, arguments)
            assert result.is_error and result.structured_content is None, (tool, arguments)
            text = result.content[0].text  # type: ignore[union-attr]
            assert says in text and "\n" not in text and "Traceback" not in text, text

    with_client(check)


def test_over_stdio_as_an_agent_starts_it() -> None:
    """``tracewhy mcp`` as a subprocess: everything on its stdout is the protocol (the client
    would fail on anything else), and a call returns the command's document."""
    from mcp import StdioServerParameters

    path = str(shared_trace(SMALL))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    server = StdioServerParameters(command=sys.executable, args=["-m", "tracewhy", "mcp", "--no-cache"], env=env)

    async def session() -> None:
        async with Client(server, mode="legacy") as client:
            assert len((await client.list_tools()).tools) == len(TOOL_COMMANDS)
            result = await client.call_tool("kernels", {"trace": path})
            assert not result.is_error and result.structured_content == cli_json("kernels", path)

    anyio.run(session)
