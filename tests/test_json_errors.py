"""Every command that takes ``--json`` still prints one JSON document when it refuses its input:
the error document (``{"error": {"message", "exit_code"}}`` in the envelope), with the same
one-line message on stderr and the same exit code as without ``--json``. The commands are read
from the parser, so a new command is covered the day it is added."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import shared_trace
from tracewhy.cli import EXIT_BAD_INPUT, EXIT_USAGE, build_parser, main

#: ``check``'s exit code for a threshold crossed: a result, not a refusal.
EXIT_CHECK_FAILED = 1

#: Positional arguments that name an input file (or a directory of them), by the name commands give them.
INPUT_ARGUMENTS = frozenset({"trace", "paths", "report", "a", "b"})
#: What a command needs besides its input to get as far as reading it.
EXTRA_ARGUMENTS: dict[str, list[str]] = {"sql": ["SELECT 1"], "check": ["--max-gpu-idle", "20%"]}
#: Output options a command needs without --json (``report`` writes its page with -o).
OUTPUT_OPTIONS: dict[str, tuple[str, ...]] = {"report": ("output",)}


def _commands_with_inputs() -> list[str]:
    parser = build_parser()
    commands: dict[str, argparse.ArgumentParser] = parser.commands  # type: ignore[attr-defined]
    return sorted(name for name, sub in commands.items()
                  if any("--json" in a.option_strings for a in sub._actions)
                  and any(not a.option_strings and a.dest in INPUT_ARGUMENTS for a in sub._actions))


def _argv(command: str, bad: Path, tmp: Path) -> list[str]:
    sub = build_parser([command]).commands[command]  # type: ignore[attr-defined]
    argv = [command]
    for action in sub._actions:
        if not action.option_strings and action.dest in INPUT_ARGUMENTS:
            argv.append(str(bad))
        elif action.option_strings and (action.required or action.dest in OUTPUT_OPTIONS.get(command, ())):
            argv += [action.option_strings[0], str(tmp / f"out-{action.dest}")]  # (an output file: -o)
    return argv + EXTRA_ARGUMENTS.get(command, []) + ["--json", "--no-cache"]


def _refused_inputs(tmp: Path) -> dict[str, Path]:
    empty = tmp / "empty.json"
    empty.write_bytes(b"")
    notes = tmp / "notes.txt"
    notes.write_text("these are notes, not a trace\n")
    cut = tmp / "cut.json.gz"
    cut.write_bytes(shared_trace("hta/legacy_2022_inference_rank1_tiny.json.gz").read_bytes()[:20])
    no_events = tmp / "no_events.json"
    no_events.write_text('{"traceEvents": []}')
    return {"missing file": tmp / "absent.json", "empty file": empty, "unknown format": notes,
            "truncated gzip": cut, "trace without events": no_events}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_sweep_finds_the_commands_that_read_traces() -> None:
    found = _commands_with_inputs()
    assert {"diagnose", "info", "steps", "gaps", "diff", "ranks", "roofline", "sql", "report"} <= set(found)
    assert "which" not in found and "mcp" not in found


@pytest.mark.parametrize("command", _commands_with_inputs())
def test_a_refused_input_prints_the_error_document(command: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    for what, bad in _refused_inputs(tmp_path).items():
        argv = _argv(command, bad, tmp_path)
        code, out, err = _run(argv, capsys)
        plain_code, plain_out, plain_err = _run([a for a in argv if a != "--json"], capsys)
        documents = out.strip().splitlines()
        doc: dict[str, Any] = json.loads(out)  # one document: the whole of stdout
        if "error" not in doc and code == plain_code in (0, EXIT_CHECK_FAILED):
            assert what == "trace without events", (what, code)  # answered (an empty trace): not refused
            continue
        assert code == plain_code != 0, (what, argv, err)
        assert set(doc["error"]) == {"message", "exit_code"} and doc["error"]["exit_code"] == code, doc
        assert doc["command"] == command and documents[0] == "{" and documents[-1] == "}"
        last = err.strip().splitlines()[-1]
        assert last == f"tracewhy: error: {doc['error']['message']}", (what, err)
        assert plain_err.strip().splitlines()[-1] == last and plain_out == ""
        assert code in (EXIT_BAD_INPUT, EXIT_USAGE), (what, code)
