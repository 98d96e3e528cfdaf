"""The ``tracewhy`` command ends without the interpreter's teardown (``cli.console_main``): these
run it as a user does, in a fresh process, and check that nothing that teardown would have done
is lost: the whole output, the exit code, files written, temporary files removed, and a
profiler's results when one is running."""

from __future__ import annotations

import json
import os
import pstats
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import shared_trace


def _tracewhy(args: list[str], scratch: Path, *, prefix: tuple[str, ...] = ("-m", "tracewhy"),
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    scratch.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, *prefix, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(scratch), "TRACEWHY_NO_CACHE": "1", **(env or {})})


def test_long_output_arrives_whole_and_the_inflated_export_is_removed(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    done = _tracewhy(["kernels", str(shared_trace("nsys/nsysai_mfu_2gpu_before.sqlite.gz")), "--json", "--top", "0"],
                     scratch)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # all of it: a cut-off document would not parse
    assert len(done.stdout) > 10_000 and doc["kernels"]
    assert list(scratch.iterdir()) == []  # the .sqlite.gz was inflated under TMPDIR, then removed


def test_parallel_read_leaves_nothing_behind(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    done = _tracewhy(["diagnose", str(shared_trace("hta/a100_alexnet_critical_path.json.gz")), "--json"], scratch,
                     env={"TRACEWHY_READ_WORKERS": "2"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["findings"]
    assert list(scratch.iterdir()) == []


def test_a_written_report_is_complete(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    done = _tracewhy(["report", str(shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz")), "-o", str(out)],
                     tmp_path / "tmp")
    assert done.returncode == 0, done.stderr
    assert out.read_text().rstrip().endswith("</html>")
    assert done.stderr.startswith("wrote ")


def test_bad_input_keeps_its_exit_code_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    done = _tracewhy(["diagnose", str(bad)], tmp_path / "tmp")
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1 and str(bad) in done.stderr


def test_a_profiler_still_gets_its_results(tmp_path: Path) -> None:
    profile = tmp_path / "which.prof"
    profiled = ("-m", "cProfile", "-o", str(profile), "-m", "tracewhy")
    done = _tracewhy(["which", "idle"], tmp_path / "tmp", prefix=profiled)
    assert done.returncode == 0, done.stderr
    assert pstats.Stats(str(profile)).get_stats_profile().func_profiles  # written at the ordinary exit


@pytest.mark.parametrize("command", [["which", "idle"], ["info"]])
def test_exit_code_of_each_kind(command: list[str], tmp_path: Path) -> None:
    args = command if command[0] == "which" else [*command, str(shared_trace("hta/a100_triton_single_kernel.json.gz"))]
    assert _tracewhy(args, tmp_path / "tmp").returncode == 0
    assert _tracewhy(["info", str(tmp_path / "missing.json")], tmp_path / "tmp").returncode == 3


def test_the_command_collects_garbage_less_often(tmp_path: Path) -> None:
    """While a command runs, the youngest generation is collected every 50,000 allocations (a
    library user's process keeps Python's default: only the command sets it)."""
    script = ("import gc, sys\nfrom tracewhy import cli\nprint(gc.get_threshold()[0])\n"
              "cli.main = lambda: print(gc.get_threshold()[0]) or 0\ncli.console_main()\n")
    done = _tracewhy([], tmp_path / "tmp", prefix=("-c", script))
    assert done.returncode == 0, done.stderr
    default = subprocess.run([sys.executable, "-c", "import gc; print(gc.get_threshold()[0])"], capture_output=True,
                             text=True, check=True).stdout.strip()  # 700 on Python 3.11 and 3.12
    assert done.stdout.split() == [default, "50000"]
