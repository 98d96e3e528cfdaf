"""The README's "Python API" section runs: every ```python block in it, in order, in one namespace,
from the repository root (where its example paths start; ../shared/traces is the shared traces).

TRACEWHY_README=FILE reads the section from FILE instead of README.md (to try a draft)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import ROOT, shared_trace

SECTION = "## Python API"
#: A path of the shared test traces in an example: the run needs them (skipped where they are absent).
_SHARED = re.compile(r"\.\./shared/traces/([\w./-]+)")
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks(markdown: str) -> list[str]:
    """The ```python blocks of the section, from its heading to the next heading of its level."""
    heading = re.search(rf"^{re.escape(SECTION)}$", markdown, re.MULTILINE)
    assert heading is not None, f"no {SECTION!r} section"
    body = markdown[heading.end():]
    end = re.search(r"^## ", body, re.MULTILINE)
    return _BLOCK.findall(body[: end.start()] if end else body)


def test_python_blocks_are_found() -> None:
    text = "\n".join(["# x", SECTION, "```python", "a = 1", "```", "```", "not python", "```", "### Sub",
                      "```python", "b = a", "```", "## Next", "```python", "raise SystemExit", "```", ""])
    assert python_blocks(text) == ["a = 1\n", "b = a\n"]


def test_readme_python_api_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    readme = Path(os.environ.get("TRACEWHY_README", ROOT / "README.md"))
    blocks = python_blocks(readme.read_text(encoding="utf-8"))
    assert len(blocks) >= 5, "the section shows each function in a ```python block"
    for relative in _SHARED.findall("".join(blocks)):
        shared_trace(relative)
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {"__name__": "readme"}
    for i, block in enumerate(blocks, 1):
        exec(compile(block, f"{readme.name}: {SECTION} block {i}", "exec"), namespace)
