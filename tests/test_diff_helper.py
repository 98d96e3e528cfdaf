"""``diff`` of two small traces: run B read and diagnosed in a helper process
(``tracewhy.diff_helper``, ``reports/diff_elsewhere``).

The reference is the same command with no helper (``diff_helper.start_early`` made to start
nothing): B read and diagnosed in the command's own process, as before the helper existed. Each
real pair must give the same bytes on stdout and stderr and the same exit code, and the helper
must have been used (its answers are counted), including the pair whose finding codes differ
(the priced answer) and a pair with reader warnings (said A's first). A helper that dies, says
nonsense or is never started costs only time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import GENERATED, shared_trace
from tracewhy import diff_helper, read_helpers
from tracewhy.cli import main
from tracewhy.reports import diff_elsewhere
from tracewhy.reports.diff import DiffReportOptions, diff_report
from tracewhy.reports.inputs import PLAIN

BERT_H100 = "tracelens/h100_bert-small_bs1_seq512.json.gz"
BERT_MI300 = "tracelens/mi300x_bert-small_bs1_seq512.json.gz"
VIT_H100 = "tracelens/h100_falconsai-vit_bs4_224.json.gz"
NSYS_BEFORE = "nsys/nsysai_mfu_2gpu_before.sqlite.gz"
NSYS_AFTER = "nsys/nsysai_mfu_2gpu_after.sqlite.gz"


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The kinds of answer the command got from a helper, in order."""
    got: list[str] = []
    receive = diff_elsewhere.Elsewhere._receive

    def counted(self: diff_elsewhere.Elsewhere, kind: str, *types: type) -> object:
        message = receive(self, kind, *types)
        if message is not None:
            got.append(kind)
        return message

    monkeypatch.setattr(diff_elsewhere.Elsewhere, "_receive", counted)
    yield got


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _without_helper(argv: list[str], capsys: pytest.CaptureFixture[str],
                    monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    with monkeypatch.context() as m:
        m.setattr(diff_helper, "start_early", lambda argv: None)
        return _run(argv, capsys)


@pytest.mark.parametrize(("a", "b", "asked"), [
    (BERT_H100, None, ["read", "unpriced"]),  # a copy: the same finding codes, no fix replayed
    (BERT_H100, BERT_MI300, ["read", "unpriced", "priced"]),  # other finding codes: fixes replayed
    (NSYS_BEFORE, NSYS_AFTER, ["read", "unpriced", "priced"]),  # reader warnings in both
])
@pytest.mark.parametrize("as_json", [False, True])
def test_helper_gives_the_same_diff(a: str, b: str | None, asked: list[str], as_json: bool, answers: list[str],
                                    tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path_a = shared_trace(a)
    if b is None:
        path_b = tmp_path / path_a.name
        path_b.write_bytes(path_a.read_bytes())
    else:
        path_b = shared_trace(b)
    argv = ["diff", str(path_a), str(path_b), "--no-cache", *(["--json"] if as_json else [])]
    expected = _without_helper(argv, capsys, monkeypatch)
    assert answers == []
    assert _run(argv, capsys) == expected
    assert answers == asked
    assert expected[0] == 0 and expected[1]
    if a.startswith("nsys"):  # A's warnings first, then B's, as when read in turn
        lines = [line for line in expected[2].splitlines() if line.startswith("tracewhy: warning:")]
        names = [path_a.name if path_a.name in line else path_b.name for line in lines]
        assert names and names == sorted(names, key=lambda n: n != path_a.name)
        assert path_b.name in names


@pytest.mark.parametrize("first_bad", [False, True])
def test_bad_file_fails_as_without_helper(first_bad: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "cut.json"
    bad.write_text('{"traceEvents": [')
    good = str(shared_trace(BERT_H100))
    argv = ["diff", *([str(bad), good] if first_bad else [good, str(bad)]), "--no-cache"]
    expected = _without_helper(argv, capsys, monkeypatch)
    assert expected[0] == 3 and "cut.json" in expected[2]
    assert _run(argv, capsys) == expected


def _rendered(report: object) -> str:
    from tracewhy.renderers.diff import diff_output
    from tracewhy.renderers.jsonout import render_json

    payload, _ = diff_output(report, 10)  # type: ignore[arg-type]
    return render_json("diff", payload, [])


@pytest.mark.parametrize("program", [
    "pass",  # gone before its job
    "import sys; sys.stdout.write('not a pickle')",  # nonsense
    "import os, pickle, sys; pickle.dump(('read', os.getcwd), sys.stdout.buffer)",  # names a function: refused
    # reads B, then answers with objects of the wrong kinds
    "import pickle, sys; out = sys.stdout.buffer; pickle.dump(('read', []), out); pickle.dump(('unpriced', 1, 2), out)",
    "import pickle, sys; pickle.dump(('failed',), sys.stdout.buffer)",  # says it failed
])
def test_a_helper_that_fails_costs_only_time(program: str) -> None:
    a, b = shared_trace(BERT_H100), shared_trace(VIT_H100)
    expected = _rendered(diff_report(a, b, DiffReportOptions()))
    process = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    diff_helper._early.append(((), process))  # as if the command line had started it
    got = diff_report(a, b, DiffReportOptions(), PLAIN)
    assert diff_helper._early == []
    assert _rendered(got) == expected
    assert process.poll() is not None  # ended by the command, whatever it was doing


def test_started_only_for_a_diff_of_small_files(tmp_path: Path) -> None:
    small = str(GENERATED / "cpu_slow_step_base.pt.trace.json.gz")
    large = tmp_path / "large.json"
    with open(large, "wb") as f:  # a sparse file: its size is what counts
        f.truncate(64 * 10**6)
    try:
        for argv in (["diagnose", small], ["diff", small, str(large)], ["diff", "--help"]):
            diff_helper.start_early(argv)
            assert diff_helper._early == [], argv
        diff_helper.start_early(["diff", small, small, "--json"])
        assert len(diff_helper._early) == 1
        assert diff_helper.take([small, str(large)]) is None  # the files turned out large: stopped
        assert diff_helper._early == []
        diff_helper.start_early(["diff", "--step", "ProfilerStep", small, small])
        process = diff_helper.take([small, small])
        assert process is not None and process.poll() is None
        read_helpers.end(process)
        assert process.poll() is not None
    finally:
        diff_helper.stop()


def test_started_once_per_command_line() -> None:
    """The script starts the helper before the command line's imports and ``main`` asks again:
    the same line keeps the helper, another line stops it."""
    small = str(GENERATED / "cpu_slow_step_base.pt.trace.json.gz")
    try:
        diff_helper.start_early(["diff", small, small])
        first = diff_helper._early[-1][1]
        diff_helper.start_early(["diff", small, small])
        assert [p for _, p in diff_helper._early] == [first]
        diff_helper.start_early(["diff", small, small, "--json"])
        assert [p for _, p in diff_helper._early] != [first] and first.poll() is not None
        diff_helper.start_early(["diagnose", small])
        assert diff_helper._early == []
    finally:
        diff_helper.stop()


def test_the_script_starts_the_helper_first() -> None:
    """The installed ``tracewhy`` script is ``tracewhy.console``'s, and it starts the helper
    before the command line is imported."""
    import tomllib

    from conftest import ROOT

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tracewhy"] == "tracewhy.console:console_main"
    small = str(GENERATED / "cpu_slow_step_base.pt.trace.json.gz")
    probe = ("import os, sys; from tracewhy import diff_helper, console\n"
             "start = diff_helper.start_early\n"
             "cpus = os.sched_getaffinity(0) if hasattr(os, 'sched_getaffinity') else set()\n"
             "def apart():\n"
             "    if len(cpus) < 2: return True\n"
             "    mine, theirs = os.sched_getaffinity(0), os.sched_getaffinity(diff_helper._early[-1][1].pid)\n"
             "    return len(mine) == 1 and not mine & theirs and mine | theirs == cpus\n"
             "def stop_here(argv, **kw): start(argv, **kw); "
             "print(bool(diff_helper._early), 'tracewhy.cli' in sys.modules, apart()); diff_helper.stop(); "
             "raise SystemExit(0)\n"
             "diff_helper.start_early = stop_here; console.console_main()")
    out = subprocess.run([sys.executable, "-c", probe, "diff", small, small], capture_output=True, text=True,
                         check=True).stdout.split()
    # Started before the command line's imports; on two CPUs or more, the command keeps to one
    # and the helper to the others (command_process.keep_apart).
    assert out == ["True", "False", "True"]


def test_not_started_inside_a_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    small = str(GENERATED / "cpu_slow_step_base.pt.trace.json.gz")
    monkeypatch.setitem(os.environ, "TRACEWHY_READ_HELPER", "1")
    diff_helper.start_early(["diff", small, small])
    assert diff_helper._early == []
