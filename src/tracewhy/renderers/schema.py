"""``schema``: the commands with a JSON Schema, as a table and as JSON; and the shape of one
command's schema, which ``schema COMMAND`` prints as it is shipped, without the envelope."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, TypedDict

from tracewhy.renderers.layout import Layout, label, text

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tracewhy.reports.schema import ShippedSchema

#: The shape of a command's schema as ``schema COMMAND`` prints it (``renderers.json_schema``
#: makes them): the parts every one has, their content a JSON Schema's.
SCHEMA_DOCUMENT: Final[dict[str, Any]] = {
    "title": "JSON Schema",
    "description": "tracewhy schema COMMAND: the command's JSON Schema (draft 2020-12), one self-contained document.",
    "type": "object",
    "properties": {
        "$schema": {"const": "https://json-schema.org/draft/2020-12/schema"},
        "$id": {"type": "string"},
        "title": {"type": "string"},
        "description": {"type": "string"},
        "type": {"const": "object"},
        "anyOf": {"type": "array", "items": {"type": "object", "additionalProperties": True}},
        "$defs": {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": True}},
    },
    "required": ["$schema", "$id", "title", "description", "type", "anyOf", "$defs"],
    "additionalProperties": False,
}


class SchemaEntry(TypedDict):
    #: The command, as typed.
    name: str
    #: What its document says: the first sentence of its help.
    summary: str
    #: The schema's ``$id``; ``tracewhy schema NAME`` prints the schema.
    schema_id: str


class SchemaListPayload(TypedDict):
    """``schema`` without a command: every command that has a JSON Schema."""

    commands: list[SchemaEntry]


def schema_list_payload(schemas: list[ShippedSchema]) -> SchemaListPayload:
    return {"commands": [{"name": s.name, "summary": s.summary, "schema_id": s.schema_id} for s in schemas]}


#: ``schema``: the command, and what its document says (wrapped to fit).
SCHEMA_TABLE: Final = Layout((label("command"), text("what its --json document says")))


def render_schema_list(p: SchemaListPayload) -> RenderableType:
    t = SCHEMA_TABLE.table("commands and their JSON Schemas (tracewhy schema COMMAND prints one)")
    for entry in p["commands"]:
        t.add_row(entry["name"], entry["summary"])
    return t
