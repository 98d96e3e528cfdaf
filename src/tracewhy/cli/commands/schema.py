from __future__ import annotations

import argparse
import sys

from tracewhy.cli.base import Command, emit
from tracewhy.cli.schemas import command_names
from tracewhy.errors import UsageError
from tracewhy.renderers.schema import SCHEMA_DOCUMENT, SchemaListPayload, render_schema_list, schema_list_payload
from tracewhy.reports.schema import schema_list, shipped_text


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
            payload = schema_list_payload(schema_list(names))
            emit(args, self.name, payload, lambda: render_schema_list(payload))
            return 0
        if args.of not in names:
            raise UsageError(f"no command {args.of!r}; tracewhy schema lists them")
        sys.stdout.write(shipped_text(args.of))
        return 0
