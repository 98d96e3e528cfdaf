"""``schema``: the JSON Schemas shipped in the package (``tracewhy/schemas/COMMAND.json``, made
from the payload declarations by ``cli/schemas.py``), read back as they are shipped; and the list
of them, each command with what its document says. Reads no trace and generates nothing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Final

#: The package folder the schemas are shipped in.
FOLDER: Final = "schemas"


def shipped_path(name: str) -> str:
    """The file name of a command's schema in the package's schema folder."""
    return f"{name}.json"


def shipped_text(name: str) -> str:
    """The schema shipped for ``name`` (what ``tracewhy schema NAME`` prints)."""
    return resources.files("tracewhy").joinpath(FOLDER).joinpath(shipped_path(name)).read_text(encoding="utf-8")


@dataclass(frozen=True)
class ShippedSchema:
    """A command, the first sentence of what its document says, and its schema's ``$id``."""

    name: str
    summary: str
    schema_id: str


def schema_list(names: Sequence[str]) -> list[ShippedSchema]:
    """Every command of ``names`` with its shipped schema, in that order."""
    shipped = {n: json.loads(shipped_text(n)) for n in names}
    return [ShippedSchema(n, _first_sentence(shipped[n]["description"]), shipped[n]["$id"]) for n in names]


def _first_sentence(description: str) -> str:
    """What a command's document says, in the first sentence of its schema's description."""
    head = description.split("\n\n")[0]
    end = head.find(". ")
    return head if end < 0 else head[:end + 1]
