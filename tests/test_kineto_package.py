"""The Kineto reader's package stays a set of small modules that each stand alone.

The import-linter contract in pyproject.toml keeps its imports pointing one way; these tests keep
what that contract cannot see: a module that imports only because another was imported first, a
module grown past the size at which it should be split, a private name borrowed across modules.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import tracewhy.readers.kineto as package

PACKAGE_DIR = Path(package.__file__).parent
MODULES = sorted(info.name for info in pkgutil.iter_modules([str(PACKAGE_DIR)]))
#: About 400 lines is the sign to split a module (STYLE.md, rule 11).
MAX_LINES = 400


def test_the_package_holds_the_reader_s_parts() -> None:
    # (A rename that drops a module from the listing would silently shrink the tests below.)
    assert {"reader", "parallel", "builder", "document", "pieces", "events", "header", "categories",
            "repair"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_alone(module: str) -> None:
    name = f"{package.__name__}.{module}"
    done = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("path", sorted(PACKAGE_DIR.glob("*.py")), ids=lambda p: p.name)
def test_no_module_is_over_the_size_to_split(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.name} has {lines} lines: split it"


@pytest.mark.parametrize("path", sorted(PACKAGE_DIR.glob("*.py")), ids=lambda p: p.name)
def test_no_private_name_is_imported_from_another_module(path: Path) -> None:
    borrowed = [f"{node.module}.{alias.name}" for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tracewhy")
                for alias in node.names if alias.name.startswith("_")]
    assert borrowed == []
