"""Directories on the command line: a directory stands for the timeline traces directly in it,
told by content (a trace needs no trace-like name; a file named like one that is not one is
skipped with a warning that names it and says what it is); one without a trace is one error line
and a non-zero exit, for each of the commands that take several traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import GENERATED, shared_trace
from tracewhy.cli import main
from tracewhy.reports.trace_dirs import directory_traces

BASE = GENERATED / "cpu_slow_step_base.pt.trace.json.gz"
MEMORY_TIMELINE = GENERATED / "memory_timeline" / "cpu_adam_memory_timeline.json.gz"
INSTRUMENT_LOG = GENERATED / "pipeline" / "d1" / "tracewhy-instrument.rank0.jsonl"
#: Each command that takes several traces, with what it needs besides them.
COMMANDS: dict[str, tuple[str, ...]] = {
    "diagnose": (), "steps": (), "gaps": (), "check": ("--max-step-p50", "1s"), "report": ("--json",),
}


def _mixed(tmp_path: Path) -> Path:
    """A capture directory: one trace, a note, a memory-timeline export and an instrument log."""
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / BASE.name).symlink_to(BASE)
    (folder / "notes.txt").write_text("lr 3e-4, batch 64\n")
    (folder / "memory.json.gz").symlink_to(MEMORY_TIMELINE)
    (folder / "run.rank0.jsonl").symlink_to(INSTRUMENT_LOG)
    (folder / ".hidden.pt.trace.json").write_text("{}")
    return folder


def test_directory_traces_are_told_by_content(tmp_path: Path) -> None:
    nsys = shared_trace("nsys/nsysai_mock_rtx3080.sqlite.gz")  # an Nsight Systems export
    folder = _mixed(tmp_path)
    (folder / "renamed.dat").symlink_to(BASE)  # a trace under a name no reader registers
    (folder / nsys.name).symlink_to(nsys)
    traces, skipped = directory_traces(folder)
    assert [p.name for p in traces] == [BASE.name, nsys.name, "renamed.dat"]
    why = {Path(s.path).name: s.why for s in skipped}
    assert set(why) == {"notes.txt", "memory.json.gz", "run.rank0.jsonl"}  # the hidden file is passed over
    assert "not a trace" in why["notes.txt"]
    assert "memory" in why["memory.json.gz"].lower()
    assert "instrument" in why["run.rank0.jsonl"]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_directory_holding_one_trace_is_that_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     command: str) -> None:
    folder = _mixed(tmp_path)
    extra = COMMANDS[command]
    json_flag = () if "--json" in extra else ("--json",)
    rc = main([command, str(folder), *extra, *json_flag])
    from_folder = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert main([command, str(folder / BASE.name), *extra, *json_flag]) == 0
    alone = json.loads(capsys.readouterr().out)
    skipped = [w for w in from_folder["warnings"] if "skipped" in w]
    assert sorted(Path(w.split(":")[0]).name for w in skipped) == ["memory.json.gz", "notes.txt", "run.rank0.jsonl"]
    unwarned: dict[str, Any] = {k: v for k, v in from_folder.items() if k != "warnings"}
    assert unwarned == {k: v for k, v in alone.items() if k != "warnings"}


def test_skipped_file_is_one_warning_line_on_stderr(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = _mixed(tmp_path)
    assert main(["steps", str(folder)]) == 0
    err = capsys.readouterr().err.splitlines()
    notes = [line for line in err if "notes.txt" in line]
    assert notes == [f"tracewhy: warning: {folder / 'notes.txt'}: skipped: not a trace: expected PyTorch profiler "
                     "JSON (.json or .json.gz) or an Nsight Systems SQLite export"]


@pytest.mark.parametrize("command", COMMANDS)
def test_empty_directory_is_one_line_and_a_failure(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   command: str) -> None:
    empty = tmp_path / "traces"
    empty.mkdir()
    rc = main([command, str(empty), *COMMANDS[command]])
    out = capsys.readouterr()
    assert rc not in (0, 1, 70)
    assert out.err.splitlines() == [f"tracewhy: error: {empty}: no timeline traces in this directory"]


def test_directory_of_run_directories_names_them(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A TensorBoard log directory keeps one subdirectory per run: the message says to give them."""
    log = tmp_path / "log"
    for run in ("run_a", "run_b"):
        (log / run).mkdir(parents=True)
        (log / run / BASE.name).symlink_to(BASE)
    assert main(["diagnose", str(log)]) == 3
    assert capsys.readouterr().err.strip() == (f"tracewhy: error: {log}: no timeline traces in this directory; its "
                                               f"subdirectories run_a/, run_b/ hold some: give them (e.g. {log}/*/)")
    assert main(["steps", str(log / "run_a"), str(log / "run_b"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["grouping"]["read_as"] == "runs" and doc["comparison"]["runs"][1]["verdict"] == "within noise"


def test_named_file_that_is_not_a_trace_still_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    rc = main(["diagnose", str(BASE), str(notes)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc not in (0, 70) and len(err) == 1 and str(notes) in err[0]
