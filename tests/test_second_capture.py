"""The getting-started page's 3 steps (and the README's), as written, on the second capture:
``traces/`` then holds two traces of one program, and the commands the pages give (the shell's
glob expanded as a shell would) diagnose both and compare them, and write one report page."""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
from pathlib import Path

import pytest

import tracewhy.capture
from conftest import ROOT
from tracewhy.cli import main

PAGES = (ROOT / "docs" / "getting-started.md", ROOT / "README.md")


def _steps_commands(page: Path) -> list[list[str]]:
    """The tracewhy commands of the page's "Your own trace in 3 steps" section, shell-split."""
    text = page.read_text()
    section = text[text.index("## Your own trace in 3 steps"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    return [shlex.split(line.strip()) for line in re.findall(r"^\s*tracewhy .*$", section, re.M)]


def _capture_twice(folder: Path) -> None:
    torch = pytest.importorskip("torch")  # (a CPU build is enough; without torch this test is skipped)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    for _ in range(2):
        with tracewhy.capture.profile(folder, steps=5) as prof:
            for _ in range(8):
                model(torch.randn(16, 64)).sum().backward()
                prof.step()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_3_steps_work_on_the_second_capture(page: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    commands = _steps_commands(page)
    assert [c[:2] for c in commands] == [["tracewhy", "diagnose"], ["tracewhy", "report"]]
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        _capture_twice(Path("traces"))
        capsys.readouterr()
        assert len(glob.glob("traces/*.pt.trace.json.gz")) == 2
        for argv in commands:
            expanded = [a for arg in argv[1:] for a in (sorted(glob.glob(arg)) if "*" in arg else [arg])]
            assert main(expanded) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert "1 of 2" in out and "2 of 2" in out and "compared with the first" in out
        assert main([*[a for a in commands[0][1:] if "*" not in a], *sorted(glob.glob("traces/*")), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["comparison"]["compared"], doc["comparison"]["note"]
        assert Path("report.html").stat().st_size > 0
    finally:
        os.chdir(cwd)
