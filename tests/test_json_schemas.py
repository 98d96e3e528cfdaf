"""The JSON Schemas shipped in the package: what the payload declarations generate, one valid
draft 2020-12 document per command (its parts under $defs, no reference outside it, an object
at the top as an MCP tool's outputSchema must be), each admitting the error document; and
``tracewhy schema``, which prints them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tracewhy.cli import main
from tracewhy.cli.commands import COMMAND_MODULES
from tracewhy.cli.schemas import REGENERATE, command_names, generated_text, shipped_text

NAMES = command_names()


def test_every_command_has_a_schema() -> None:
    assert list(COMMAND_MODULES) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_the_shipped_schema_is_what_the_declarations_give(name: str) -> None:
    assert shipped_text(name) == generated_text(name), (
        f"src/tracewhy/schemas/{name}.json differs from what the payload declarations give: "
        f"regenerate the schemas with `{REGENERATE}` (and commit them)")


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


@pytest.mark.parametrize("name", NAMES)
def test_each_schema_is_one_valid_self_contained_document(name: str) -> None:
    doc = json.loads(shipped_text(name))
    Draft202012Validator.check_schema(doc)
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema" and doc["type"] == "object"
    refs = _refs(doc)
    assert all(r.startswith("#/$defs/") for r in refs), [r for r in refs if not r.startswith("#/$defs/")]
    assert {r.removeprefix("#/$defs/") for r in refs} == set(doc["$defs"])  # none missing, none unused
    titles = [d.get("title") for d in doc["anyOf"]]
    assert "ErrorDocument" in titles
    for document in doc["anyOf"]:
        if document.get("title") != "JSON Schema":  # (schema COMMAND prints a schema, not an envelope)
            assert document["properties"]["command"] == {"const": name}
            assert {"tool", "tool_version", "json_schema", "command", "warnings"} <= set(document["required"])
            assert document["additionalProperties"] is False


def _may_be_fractional(schema: Any) -> bool:
    """Whether a value of ``schema`` (or an item of it, for a list of times) may be a float."""
    if not isinstance(schema, dict):
        return False
    kinds = schema.get("type", [])
    if "number" in ([kinds] if isinstance(kinds, str) else kinds):
        return True
    return any(_may_be_fractional(s) for s in schema.get("anyOf", [])) or _may_be_fractional(schema.get("items"))


def _times(node: Any) -> list[tuple[str, Any]]:
    """Every (name, schema) of a property named *_ns (or the *_ns pattern) in a schema."""
    found: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        for key in ("properties", "patternProperties"):
            for prop, sub in (node.get(key) or {}).items():
                if prop.endswith(("_ns", "_ns$")):
                    found.append((prop, sub))
        for value in node.values():
            found += _times(value)
    elif isinstance(node, list):
        for value in node:
            found += _times(value)
    return found


@pytest.mark.parametrize("name", NAMES)
def test_every_time_is_declared_an_integer(name: str) -> None:
    """A property named *_ns is never declared a number that may have a fraction."""
    times = _times(json.loads(shipped_text(name)))
    assert times or name in ("which", "capture", "schema", "sql", "export")
    assert [prop for prop, sub in times if _may_be_fractional(sub)] == []


def test_the_error_document_is_admitted_by_every_schema() -> None:
    error = {"tool": "tracewhy", "tool_version": "0.1.0", "json_schema": 1, "warnings": [],
             "error": {"message": "x.json: no such file", "exit_code": 3}}
    for name in NAMES:
        validator = Draft202012Validator(json.loads(shipped_text(name)))
        assert validator.is_valid({**error, "command": name}), name
        assert not validator.is_valid({**error, "command": "another"}), name
        assert not validator.is_valid({**error, "command": name, "error": {"message": "x"}}), name


def test_schema_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in doc["commands"]] == NAMES
    assert all(c["schema_id"] == json.loads(shipped_text(c["name"]))["$id"] for c in doc["commands"])
    assert main(["schema"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in NAMES)


def test_schema_of_a_command_is_the_shipped_file(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("diagnose", "memory", "capture"):
        assert main(["schema", name]) == 0
        assert capsys.readouterr().out == shipped_text(name)
