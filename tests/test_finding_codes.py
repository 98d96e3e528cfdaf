"""Finding codes are declared once, in findings/codes.py: every code is emitted by some rule, no
code is written as a bare string anywhere else, and the documentation's finding-codes page holds
exactly the table that scripts/finding_codes.py prints from them (TRACEWHY_UPDATE_DOCS=1 rewrites
it there)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tracewhy.findings.codes import Code

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "tracewhy"
SCRIPT = ROOT / "scripts" / "finding_codes.py"
PAGE = ROOT / "docs" / "finding-codes.md"
START, END = "<!-- finding-codes:start -->", "<!-- finding-codes:end -->"


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (PACKAGE / folder).rglob("*.py") if p.name != "codes.py")


def _table() -> str:
    return subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=True).stdout


def test_every_code_is_emitted_by_a_rule() -> None:
    """A member no ``Finding(code=...)`` names is a code no output can carry: delete it. (Naming it
    in ``see=`` or a list of parts does not count.)"""
    emitted = {n.attr for p in _sources(".") for call in ast.walk(ast.parse(p.read_text(), str(p)))
               if isinstance(call, ast.Call) for k in call.keywords if k.arg == "code"
               for n in ast.walk(k.value)
               if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "Code"}
    assert sorted(c.name for c in Code if c.name not in emitted) == []


def test_no_code_is_written_as_a_string() -> None:
    """Rules, renderers and the CLI name codes as ``Code`` members, so a typo fails mypy, not a script."""
    values = {c.value for c in Code}
    literals = [f"{p.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}"
                for p in _sources("findings", "renderers", "cli")
                for node in ast.walk(ast.parse(p.read_text(), str(p)))
                if isinstance(node, ast.Constant) and node.value in values]
    assert literals == []


def test_code_is_its_string_in_text_and_json() -> None:
    code: str = Code.EMPTY_TRACE  # what a script comparing with a string sees
    assert code == "empty-trace"
    assert (str(Code.EMPTY_TRACE), f"{Code.EMPTY_TRACE}", f"{Code.EMPTY_TRACE:>12}") == (
        "empty-trace", "empty-trace", " empty-trace")


def test_every_code_has_a_one_line_meaning() -> None:
    assert [c.name for c in Code if not c.meaning.strip() or "\n" in c.meaning or "|" in c.meaning] == []


def test_table_reads_severities_from_the_rules() -> None:
    """A rule's own severities, what a helper like ``_severity`` returns, and diagnose's re-grading
    by recoverable share (consolidate) all reach the table; ranks findings are not re-graded."""
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ")[1] for line in _table().splitlines()[2:]}
    assert rows["empty-trace"] == "trust"
    assert rows["gpu-low-utilization"] == "info"  # a summary: no recoverable time of its own
    assert rows["gpu-idle-graph-launch"] == "high, medium, low"  # LOW, re-graded by share
    assert rows["pageable-memcpy"] == "medium, low"  # MEDIUM, and LOW once explained without time
    assert rows["nsys-gpu-gaps"] == "low"  # MEDIUM with no time, and not a part of the step: capped
    assert rows["slow-comm-backend"] == "high, low"  # structural: HIGH without a time, low in a small capture
    assert rows["rank-straggler"] == "high, medium"  # tracewhy ranks does not consolidate
    assert set(rows) == {c.value for c in Code}


def test_the_docs_page_holds_the_table() -> None:
    """Fails until the output of ``python scripts/finding_codes.py`` is between the page's markers;
    ``TRACEWHY_UPDATE_DOCS=1`` puts it there."""
    page = PAGE.read_text(encoding="utf-8")
    assert START in page and END in page, f"{PAGE.name} lacks {START} ... {END}"
    before, rest = page.split(START, 1)
    between, after = rest.split(END, 1)
    if os.environ.get("TRACEWHY_UPDATE_DOCS"):
        PAGE.write_text(f"{before}{START}\n{_table().strip()}\n{END}{after}", encoding="utf-8")
        return
    assert between.strip() == _table().strip(), (
        f"{PAGE.relative_to(ROOT)} is stale: TRACEWHY_UPDATE_DOCS=1 python -m pytest tests/test_finding_codes.py")
