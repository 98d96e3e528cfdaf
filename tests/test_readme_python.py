"""The documentation's Python API page runs: every ```python block of docs/python-api.md, in order,
in one namespace, from the repository root (where its example paths start; ../shared/traces is the
shared traces).

TRACEWHY_PYTHON_API_PAGE=FILE reads the blocks from FILE instead (to try a draft)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import ROOT, shared_trace

PAGE = ROOT / "docs" / "python-api.md"
#: A path of the shared test traces in an example: the run needs them (skipped where they are absent).
_SHARED = re.compile(r"\.\./shared/traces/([\w./-]+)")
#: A ```python block, at the margin or indented (inside a list item).
_BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```$", re.DOTALL | re.MULTILINE)


def python_blocks(markdown: str) -> list[str]:
    """The page's ```python blocks, in order, with their indentation removed."""
    blocks = []
    for indent, body in _BLOCK.findall(markdown):
        lines = body.splitlines(keepends=True)
        blocks.append("".join(line[len(indent):] if line.startswith(indent) else line for line in lines))
    return blocks


def test_python_blocks_are_found() -> None:
    text = "\n".join(["# x", "```python", "a = 1", "```", "```", "not python", "```", "- item", "",
                      "    ```python", "    b = a", "    ```", ""])
    assert python_blocks(text) == ["a = 1\n", "b = a\n"]


def test_python_api_page_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    page = Path(os.environ.get("TRACEWHY_PYTHON_API_PAGE", PAGE))
    blocks = python_blocks(page.read_text(encoding="utf-8"))
    assert len(blocks) >= 5, "the page shows each function in a ```python block"
    for relative in _SHARED.findall("".join(blocks)):
        shared_trace(relative)
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {"__name__": "python_api_page"}
    for i, block in enumerate(blocks, 1):
        exec(compile(block, f"{page.name}: block {i}", "exec"), namespace)


def test_the_page_calls_every_command_function() -> None:
    """Every command but ``capture`` (a profiler run; ``tracewhy.capture.profile`` in Python) and
    the ``mcp`` server is called in a block of the page, so each has a runnable example."""
    from tracewhy.cli.commands import COMMAND_MODULES

    code = "".join(python_blocks(PAGE.read_text(encoding="utf-8")))
    uncalled = [c for c in COMMAND_MODULES if c != "capture" and f"tw.{c.replace('-', '_')}(" not in code]
    assert not uncalled, f"docs/python-api.md shows no call of {uncalled}"
