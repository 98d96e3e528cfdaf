"""The README's set-up is what CI runs: ``.ci/run`` reads the two commands from the README's
"Set up" section (``.ci/readme_commands.py``), so they are checked here for what a new user on a
fresh machine needs from them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import ModuleType

from conftest import ROOT


def _reader() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_commands", ROOT / ".ci" / "readme_commands.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_has_the_two_commands_ci_runs() -> None:
    printed = subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_commands.py")], check=True,
                             capture_output=True, text=True).stdout.splitlines()
    install, checks = printed
    # A fresh machine: a virtual environment first (PEP 668 refuses pip on Debian's system Python),
    # then the tool alone, run on the bundled demo trace.
    assert install.startswith("python3 -m venv .venv && . .venv/bin/activate && ")
    assert "pip install . " in install and "tracewhy diagnose examples/" in install
    assert (ROOT / install.split("tracewhy diagnose ")[1].split()[0]).is_file()
    # The second installs every extra the checks need (torch for the capture tests, docs for the
    # site) and runs every check CI runs.
    assert checks.startswith(". .venv/bin/activate && pip install -e '.[")
    extras = set(checks.split("'.[")[1].split("]'")[0].split(","))
    assert {"test", "torch", "docs", "mcp"} <= extras  # mcp: tests/test_mcp_server.py runs the server
    for check in ("python -m pytest -q", "mypy", "ruff check src tests bench scripts", "lint-imports",
                  "mkdocs build --strict"):
        assert check in checks


def test_a_third_block_or_a_missing_one_is_refused() -> None:
    reader = _reader()
    section = "## Set up\n\n```bash\na\n```\n\n```bash\nb\n```\n\n## Next\n\n```bash\nc\n```\n"
    assert reader.setup_commands(section) == ["a", "b"]
    for broken in ("## Set up\n\n```bash\na\n```\n", "## Set up\n" + "```bash\nx\n```\n" * 3):
        try:
            reader.setup_commands(broken)
        except SystemExit as e:
            assert "two commands" in str(e)
        else:
            raise AssertionError("a set-up section without exactly two commands was accepted")
