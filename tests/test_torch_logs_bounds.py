"""TORCH_LOGS captures that cost more than their size: a guard line of white space (the guard
pattern must not backtrack), a line of tens of megabytes (cut to a bound, with a warning, and
never a table cell of that size), and ``--logs`` files that are empty, not regular or not
readable (a warning naming the file; a FIFO never blocks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import GENERATED
from tracewhy.cli import main
from tracewhy.model.torch_logs import LogRecompileCol
from tracewhy.readers.torch_logs.reader import MAX_LINE_CHARS, parse_torch_logs
from tracewhy.renderers.layout import MAX_CELL_CHARS, Layout, name, number

TRACE = GENERATED / "cpu_compile_recompile.pt.trace.json.gz"
LOG = GENERATED / "cpu_compile_recompile.torch_logs.txt"
_PREFIX = "V1126 00:26:21.966000 20714 site-packages/torch/_dynamo/guards.py:5396] [0/1] [__recompiles] "


def _recompile_log(guard: str) -> str:
    """The real recompile capture with its guard line's text replaced by ``guard``."""
    lines = LOG.read_text().splitlines()
    at = next(i for i, x in enumerate(lines) if "- 0/0:" in x)
    lines[at] = f"{_PREFIX}    - 0/0: {guard}"
    return "\n".join(lines) + "\n"


def test_guard_lines_of_white_space_are_read_in_linear_time(tmp_path: Path) -> None:
    # Runs of spaces just under the line bound, then a character: the old guard and last-reason
    # patterns (a lazy group before an optional "  # comment" tail) tried every split of the
    # spaces, about 17 s a line here (300,000 spaces: over 60 s); a linear reader takes
    # milliseconds for all six, so a generous timeout tells the two apart on any machine.
    spaces = " " * (MAX_LINE_CHARS - 200)
    guards = "".join(f"{_PREFIX}    - 0/0: {spaces}x{i}\n" for i in range(5))
    limit = "W1126 00:26:22.000000 20714 site-packages/torch/_dynamo/convert_frame.py:1000] [0/1] "
    limit_warning = f"{limit}torch._dynamo hit config.recompile_limit (8)\n{limit}   last reason: 0/0: {spaces}y\n"
    lines = _recompile_log("first").splitlines()
    at = next(i for i, x in enumerate(lines) if "- 0/0: first" in x)
    log = tmp_path / "spaces.log"
    log.write_text("\n".join(lines[:at + 1]) + "\n" + guards + "\n".join(lines[at + 1:]) + "\n" + limit_warning)
    code = ("import sys; from pathlib import Path; from tracewhy.readers.torch_logs.reader import read_torch_logs; "
            "logs = read_torch_logs(Path(sys.argv[1])); "
            "print(logs.recompiles.get_column('failed_guards')[0], logs.fallbacks.get_column('reason')[0][-1])")
    done = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, timeout=30,
                          env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}, check=True)
    assert done.stdout.split() == ["6", "y"]


def test_a_line_of_300k_spaces_is_cut_not_parsed_whole() -> None:
    logs = parse_torch_logs(_recompile_log(" " * 300_000 + "x"))
    assert logs.recompiles.get_column(LogRecompileCol.GUARD).to_list() == [None]
    assert any("longer than" in w for w in logs.warnings)


def test_the_guard_keeps_its_text_and_drops_the_comment_tail() -> None:
    logs = parse_torch_logs(_recompile_log("L['x'].size()[0] == 16  # x.size(0) in forward  # more"))
    assert logs.recompiles.get_column(LogRecompileCol.GUARD).to_list() == ["L['x'].size()[0] == 16"]
    logs = parse_torch_logs(_recompile_log("a # b  #c"))  # one space before the first '#': kept
    assert logs.recompiles.get_column(LogRecompileCol.GUARD).to_list() == ["a # b"]


def test_a_line_longer_than_the_bound_is_cut_with_a_warning() -> None:
    logs = parse_torch_logs(_recompile_log("g" * (3 * MAX_LINE_CHARS)))
    guard = logs.recompiles.get_column(LogRecompileCol.GUARD)[0]
    assert guard.startswith("ggg") and len(guard) <= MAX_LINE_CHARS
    assert any("1 line longer than" in w for w in logs.warnings)


def test_a_huge_guard_never_makes_a_huge_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "huge.log"
    log.write_text(_recompile_log("g" * 5_000_000))
    assert main(["compile", str(TRACE), "--logs", str(log)]) == 0
    out = capsys.readouterr()
    assert len(out.out) < 100_000
    assert str(log) in out.err and "longer than" in out.err


@pytest.mark.parametrize("wide", [False, True])
def test_table_cells_are_cut_to_a_bound_with_an_ellipsis(wide: bool) -> None:
    from rich.console import Console

    table = Layout((name("kernel"), number("time"))).table()
    table.add_row("k" * 1_000_000, "1.0 ms")
    console = Console(width=120, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    with console:
        console.print(table)
    text = console.export_text()
    assert len(text) < 4 * MAX_CELL_CHARS + 2_000
    assert "…" in text
    cut = table.rows[0][0]
    assert isinstance(cut, str) and len(cut) == MAX_CELL_CHARS and cut.startswith("kkk")


def test_an_empty_logs_file_is_a_warning_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert main(["compile", str(TRACE), "--logs", str(empty)]) == 0
    err = capsys.readouterr().err
    assert str(empty) in err and "empty" in err


def test_a_fifo_as_logs_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "logs.fifo"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "tracewhy", "compile", str(TRACE), "--logs", str(fifo)],
                          capture_output=True, text=True, timeout=60,
                          env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert str(fifo) in done.stderr and "not a regular file" in done.stderr


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_logs_file_is_a_warning_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked.log"
    locked.write_text(LOG.read_text())
    locked.chmod(0)
    assert main(["compile", str(TRACE), "--logs", str(locked)]) == 0
    err = capsys.readouterr().err
    assert str(locked) in err and "cannot be read" in err
