from __future__ import annotations

import argparse
import json
import sys

from tracewhy.cli.base import Command, emit
from tracewhy.cli.schemas import command_names, shipped_text
from tracewhy.errors import UsageError
from tracewhy.renderers.contract import SCHEMA_DOCUMENT, SchemaListPayload, render_schema_list


class SchemaCommand(Command):
    """The JSON Schema (draft 2020-12) of a command's --json document.

    tracewhy schema COMMAND prints it: one self-contained document ($defs inside), whose
    top-level anyOf holds each shape the command's document can take, the error document among
    them (--json prints the same document). tracewhy schema alone lists the commands.
    """

    name = "schema"
    takes_trace = False
    json_payloads = (SchemaListPayload,)
    json_documents = (SCHEMA_DOCUMENT,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("of", nargs="?", metavar="COMMAND", help="the command whose schema to print")
        parser.add_argument("--json", action="store_true",
                            help="with COMMAND, the same document; alone, the list as versioned JSON")

    def run(self, args: argparse.Namespace) -> int:
        names = command_names()
        if args.of is None:  # (from the shipped files: listing imports no command's analyses)
            shipped = {n: json.loads(shipped_text(n)) for n in names}
            payload: SchemaListPayload = {"commands": [
                {"name": n, "summary": _first_sentence(shipped[n]["description"]), "schema_id": shipped[n]["$id"]}
                for n in names]}
            emit(args, self.name, payload, lambda: render_schema_list(payload))
            return 0
        if args.of not in names:
            raise UsageError(f"no command {args.of!r}; tracewhy schema lists them")
        sys.stdout.write(shipped_text(args.of))
        return 0


def _first_sentence(description: str) -> str:
    """What a command's document says, in the first sentence of its schema's description."""
    head = description.split("\n\n")[0]
    end = head.find(". ")
    return head if end < 0 else head[:end + 1]
