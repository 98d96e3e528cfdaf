"""The package keeps the shape docs/architecture.md draws: no module grows past about 400 lines
(STYLE 11); every command has a report (``reports/``, what it computes) and a renderer
(``renderers/``, how it is shown), each named as the command; a CLI command module only parses
arguments, calls its report and picks a renderer, so it imports reports, renderers and the CLI's
own helpers, never an analysis, a rule, a reader or the model; and the Python API calls the
reports and imports no renderer. Imports are read from the source (``ast``), those inside
functions and ``TYPE_CHECKING`` blocks included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tracewhy.cli.commands import COMMAND_MODULES

SRC = Path(__file__).resolve().parent.parent / "src" / "tracewhy"
#: A module over this many lines is a sign to split it (STYLE 11).
MAX_LINES = 400
#: Modules allowed over ``MAX_LINES`` while another change splits them (paths under src/tracewhy).
#: Empty it as they are split: ``test_known_exceptions_are_still_over`` fails on one that was.
KNOWN_OVER: frozenset[str] = frozenset()
#: What a CLI command module may import from tracewhy: the reports, the renderers, the CLI's own
#: helpers, the output-file writer it shares with the API, and the error and unit helpers every
#: stage shares.
CLI_MAY_IMPORT = ("tracewhy.cli", "tracewhy.reports", "tracewhy.renderers", "tracewhy.output_files",
                  "tracewhy.errors", "tracewhy.units")


def line_counts() -> dict[str, int]:
    return {str(p.relative_to(SRC)): len(p.read_text(encoding="utf-8").splitlines()) for p in sorted(SRC.rglob("*.py"))}


def tracewhy_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a tracewhy module in ``source``, at any depth."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "tracewhy"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "tracewhy":  # from tracewhy import cli -> tracewhy.cli
                found += [(node.lineno, f"tracewhy.{a.name}") for a in node.names]
            elif node.module.startswith("tracewhy."):
                found.append((node.lineno, node.module))
    return sorted(found)


def stage_imports_outside(source: str, allowed: tuple[str, ...]) -> list[str]:
    """The tracewhy imports of ``source`` outside the ``allowed`` packages and modules."""
    return [f"line {line}: {module}" for line, module in tracewhy_imports(source)
            if not any(module == a or module.startswith(a + ".") for a in allowed)]


def command_module_names() -> dict[str, str]:
    """Each command and its module's name (``critical-path``: ``critical_path``)."""
    return {command: module.rsplit(".", 1)[1] for command, module in COMMAND_MODULES.items()}


def test_no_module_is_over_the_line_bound() -> None:
    over = {path: n for path, n in line_counts().items() if n > MAX_LINES and path not in KNOWN_OVER}
    assert not over, f"modules over {MAX_LINES} lines (split them by job): {over}"


def test_known_exceptions_are_still_over() -> None:
    counts = line_counts()
    split = sorted(p for p in KNOWN_OVER if counts.get(p, 0) <= MAX_LINES)
    assert not split, f"no longer over {MAX_LINES} lines (or gone): take them out of KNOWN_OVER: {split}"


@pytest.mark.parametrize("command", sorted(COMMAND_MODULES))
def test_a_command_is_a_report_a_renderer_and_a_cli_entry(command: str) -> None:
    module = command_module_names()[command]
    assert (SRC / "reports" / f"{module}.py").is_file(), f"{command}: no reports/{module}.py"
    assert (SRC / "renderers" / f"{module}.py").is_file(), f"{command}: no renderers/{module}.py"
    entry = SRC / "cli" / "commands" / f"{module}.py"
    imported = {m for _, m in tracewhy_imports(entry.read_text(encoding="utf-8"))}
    assert f"tracewhy.reports.{module}" in imported, f"{command}: the CLI entry does not call its report"
    assert any(m.startswith("tracewhy.renderers.") for m in imported), f"{command}: the CLI entry picks no renderer"


@pytest.mark.parametrize("path", sorted((SRC / "cli" / "commands").glob("*.py")), ids=lambda p: p.name)
def test_cli_commands_import_only_reports_renderers_and_cli_helpers(path: Path) -> None:
    wrong = stage_imports_outside(path.read_text(encoding="utf-8"), CLI_MAY_IMPORT)
    assert not wrong, f"cli/commands/{path.name} imports past the reports (move the work to its report): {wrong}"


def test_the_api_calls_reports_and_only_its_file_writers_import_renderers() -> None:
    """The API's functions call the commands' reports; only ``report`` and ``export``, which write
    the files the command's renderer draws, import renderers (and only those that draw files)."""
    modules: set[str] = set()
    for path in sorted((SRC / "api").glob("*.py")):
        imported = {m for _, m in tracewhy_imports(path.read_text(encoding="utf-8"))}
        drawn = {m for m in imported if m.startswith("tracewhy.renderers")}
        if path.name == "file_commands.py":
            assert drawn <= {"tracewhy.renderers.html", "tracewhy.renderers.jsonout", "tracewhy.renderers.report",
                             "tracewhy.renderers.export", "tracewhy.renderers.perfetto"}, drawn
        else:
            assert not drawn, f"api/{path.name} imports {drawn}"
        modules |= imported
    commands = {"diagnose", "steps", "diff", "lines", "critical_path", "memory", "compile", "sql", "pipeline",
                "ranks", "roofline", "report", "export", "which", "check"}
    assert {f"tracewhy.reports.{c}" for c in commands} <= modules


def test_the_import_check_sees_what_it_must_refuse() -> None:
    """The checks above can fail: imports at the top, inside a function, under TYPE_CHECKING and
    of the package root are all read; a neighbour whose name only starts alike is not allowed."""
    source = '''
from tracewhy.cli.base import emit
from tracewhy.analyses.steps import steps
import tracewhy.readers.registry
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from tracewhy.model.trace import Trace
def run():
    from tracewhy.findings.idle import findings
    from tracewhy import api
from tracewhy.reportsx import y
'''
    assert stage_imports_outside(source, CLI_MAY_IMPORT) == [
        "line 3: tracewhy.analyses.steps", "line 4: tracewhy.readers.registry", "line 7: tracewhy.model.trace",
        "line 9: tracewhy.findings.idle", "line 10: tracewhy.api", "line 11: tracewhy.reportsx"]


def test_no_class_name_is_defined_twice() -> None:
    """One name per concept: a class name (private ones too) is defined in one module only, so a
    reader who meets ``SyncCol`` or ``GapsResult`` knows which table or result it is."""
    where: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(str(path.relative_to(SRC)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}

