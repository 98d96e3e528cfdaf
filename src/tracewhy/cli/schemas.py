"""The JSON Schema of each command's ``--json`` document: generated from the command's payload
declarations (``Command.json_payloads``, ``renderers.json_schema``), shipped in the package as
``tracewhy/schemas/COMMAND.json`` and read back by ``tracewhy schema`` (``reports/schema.py``),
which generates nothing.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Final

from tracewhy.cli.commands import COMMAND_MODULES, load_command
from tracewhy.reports.schema import FOLDER, shipped_path, shipped_text

__all__ = ["FOLDER", "REGENERATE", "command_names", "generate", "generated_text", "shipped_text", "summary",
           "write_all"]

#: What regenerates the shipped files after a payload declaration changed (from a clone).
REGENERATE: Final = "python scripts/json_schemas.py"


def command_names() -> list[str]:
    """Every command with a schema, in ``tracewhy --help`` order."""
    return list(COMMAND_MODULES)


def summary(name: str) -> str:
    """The first paragraph of a command's help, on one line."""
    doc = inspect.getdoc(load_command(name)) or name
    return " ".join(doc.split("\n\n")[0].split())


def generate(name: str) -> dict[str, Any]:
    """The schema of ``name`` from its declarations (imports every renderer it names)."""
    from tracewhy.renderers.json_schema import command_schema

    cls = load_command(name)
    return command_schema(name, cls.json_payloads, summary(name), extra_documents=cls.json_documents)


def generated_text(name: str) -> str:
    """``generate(name)`` as the shipped file holds it."""
    return json.dumps(generate(name), indent=2, ensure_ascii=False) + "\n"


def write_all(folder: Path) -> list[Path]:
    """Every command's schema into ``folder`` (the package's schema folder, from a clone)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in command_names():
        path = folder / shipped_path(name)
        path.write_text(generated_text(name), encoding="utf-8")
        written.append(path)
    return written
