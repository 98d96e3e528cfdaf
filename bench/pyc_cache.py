"""Run the benchmarks' child processes as an installed tracewhy runs: with its bytecode cache.

pip compiles an installed package's modules to ``.pyc`` files, and the peers (HTA, numpy,
polars) are installed that way. A shell with ``PYTHONDONTWRITEBYTECODE=1`` (as some CI images
and this project's development machine set it) leaves an editable install without them, so
every tracewhy process would compile each module it imports, 0.1-0.2 s of CPU that no user pays.
``as_installed()`` removes the variable from this process's environment, which the children
inherit, and compiles ``src`` once, untimed.
"""

from __future__ import annotations

import compileall
import os
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def as_installed() -> None:
    """Let children write and read ``.pyc`` files, and write tracewhy's now."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    compileall.compile_dir(SRC, quiet=1)
