"""Hostile Nsight Compute input: each case is a real export from ../shared/traces/ncu
with cells edited here, run through the CLI. The contract: exit 0 with every skipped or
reinterpreted value named in a warning (stderr and --json), or exit 3 with one line naming the
file and the problem; never an internal error (70)."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import shared_trace
from tracewhy.cli import main
from tracewhy.model.ncu import NcuCol
from tracewhy.readers.ncu.reader import read_ncu

SAXPY = "ncu/csv_rtx5070_olajide/saxpy.csv"
GEMM = "ncu/csv_rtx5070_olajide/gemm_naive.csv"
Table = list[list[str]]


def _split(path: Path) -> tuple[list[str], Table]:
    """A real export as (lines before its table, table rows with the header first)."""
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    return lines[:start], list(csv.reader(ln for ln in lines[start:] if not ln.startswith("==")))


def _text(preamble: list[str], table: Table) -> str:
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(table)
    return "\n".join(preamble) + "\n" + out.getvalue()


def _hostile(tmp_path: Path, edit: Callable[[Table], None], source: str = SAXPY) -> Path:
    preamble, table = _split(shared_trace(source))
    edit(table)
    path = tmp_path / "hostile.csv"
    path.write_text(_text(preamble, table), encoding="utf-8")
    return path


def _two_launches(table: Table) -> None:
    """The saxpy export's rows again as launch 1 (so that one launch can be spoiled alone)."""
    table.extend([["1", *row[1:]] for row in table[1:]])


def _set(table: Table, column: str, value: str, *, launch: str | None = None, metric: str | None = None) -> None:
    header = table[0]
    col, id_col, metric_col = header.index(column), header.index("ID"), header.index("Metric Name")
    for row in table[1:]:
        if (launch is None or row[id_col] == launch) and (metric is None or row[metric_col] == metric):
            row[col] = value


def _roofline(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["roofline", str(path), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def _json(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    code, out, err = _roofline(path, capsys, "--json")
    assert code == 0, err
    return json.loads(out), err


def _warned(doc: dict[str, Any], err: str, *fragments: str) -> str:
    """The one warning holding every fragment, checked to be both on stderr and in the JSON."""
    found = [w for w in doc["warnings"] if all(f in w for f in fragments)]
    assert len(found) == 1, doc["warnings"]
    assert found[0] in err and "tracewhy: warning:" in err
    return str(found[0])


NOT_A_NUMBER = ["inf", "nan", "-nan", "+nan"]  # glibc printf writes "-nan" for a NaN with its sign bit
HUGE = "1" * 25  # past int64 (and past float's exact integers)


# --- ID / Process ID / Stream -------------------------------------------------------------------


@pytest.mark.parametrize("value", [*NOT_A_NUMBER, HUGE])
def test_bad_launch_id_skips_that_launch_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     value: str) -> None:
    def edit(table: Table) -> None:
        _two_launches(table)
        _set(table, "ID", value, launch="1")

    doc, err = _json(_hostile(tmp_path, edit), capsys)
    assert [launch["launch_id"] for launch in doc["launches"]] == [0]
    problem = "beyond int64" if value == HUGE else "nan or inf"
    rows = len(_split(shared_trace(SAXPY))[1]) - 1
    assert f"{rows} rows" in _warned(doc, err, "rows skipped", f"ID {problem}")


@pytest.mark.parametrize("value", [*NOT_A_NUMBER, HUGE])
def test_no_usable_launch_id_is_one_line_naming_file_and_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 value: str) -> None:
    path = _hostile(tmp_path, lambda t: _set(t, "ID", value))
    code, out, err = _roofline(path, capsys)
    assert code == 3 and not out
    assert err.count("\n") == 1 and str(path) in err and "no profiled kernel launches" in err
    assert ("ID beyond int64" if value == HUGE else "ID nan or inf") in err


@pytest.mark.parametrize("column", ["Process ID", "Stream"])
@pytest.mark.parametrize("value", [*NOT_A_NUMBER, HUGE])
def test_bad_process_or_stream_is_left_empty_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            column: str, value: str) -> None:
    path = _hostile(tmp_path, lambda t: _set(t, column, value))
    doc, err = _json(path, capsys)
    assert doc["launches"][0]["dur_ns"] == 292_928  # the rest of the launch is read as before
    _warned(doc, err, column, "left empty")
    launch = read_ncu(path).launches.row(0, named=True)
    assert launch[NcuCol.PROCESS if column == "Process ID" else NcuCol.STREAM] is None


# --- durations and units --------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "problem"), [
    *[(v, "nan or inf") for v in NOT_A_NUMBER],
    ("9" * 22, "beyond int64"),
    ("-292,928", "negative"),  # today a ModelError ("a bug")
])
def test_unusable_duration_is_left_empty_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        value: str, problem: str) -> None:
    path = _hostile(tmp_path, lambda t: _set(t, "Metric Value", value, metric="gpu__time_duration.sum"))
    doc, err = _json(path, capsys)
    assert doc["launches"][0]["dur_ns"] is None
    assert doc["launches"][0]["sm_pct"] is not None
    _warned(doc, err, "dur_ns", problem, "1 launch")


def test_unknown_time_unit_is_refused_not_read_as_ns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _hostile(tmp_path, lambda t: _set(t, "Metric Unit", "fortnight", metric="gpu__time_duration.sum"))
    doc, err = _json(path, capsys)
    assert doc["launches"][0]["dur_ns"] is None  # the old reader said 292928 ns
    _warned(doc, err, "gpu__time_duration.sum", "'fortnight'", "dur_ns")


# --- table shape ----------------------------------------------------------------------------------


def test_kernel_name_longer_than_csv_field_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = "k" * 200_000  # csv's default field limit is 131072
    doc, err = _json(_hostile(tmp_path, lambda t: _set(t, "Kernel Name", name)), capsys)
    assert doc["launches"][0]["name"] == name and not err


def test_id_column_need_not_be_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def move_id_last(table: Table) -> None:
        for row in table:
            row.append(row.pop(0))

    moved = read_ncu(_hostile(tmp_path, move_id_last))
    original = read_ncu(shared_trace(SAXPY))
    assert moved.launches.equals(original.launches)
    code, out, _ = _roofline(tmp_path / "hostile.csv", capsys)
    assert code == 0 and "saxpy_kernel" in out


# --- several exports appended into one file ---------------------------------------------------------


def test_appended_exports_are_separate_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sources = [SAXPY, GEMM, SAXPY]  # as `ncu --csv ... >> all.csv` three times leaves them
    path = tmp_path / "appended.csv"
    path.write_bytes(b"".join(shared_trace(s).read_bytes() for s in sources))
    report = read_ncu(path)
    alone = [read_ncu(shared_trace(s)).launches.row(0, named=True) for s in sources]
    launches = report.launches
    assert launches.height == 3  # the old reader kept 1: "launch ID 0 appears twice; kept the first"
    assert launches.get_column(NcuCol.RUN).to_list() == [0, 1, 2]
    assert launches.get_column(NcuCol.LAUNCH).to_list() == [0, 1, 2]  # ncu's IDs restart at 0 in each
    assert launches.get_column(NcuCol.NAME).to_list() == [r[NcuCol.NAME] for r in alone]
    assert launches.get_column(NcuCol.DUR).to_list() == [r[NcuCol.DUR] for r in alone]
    for run in report.runs:  # each run alone is the export it came from
        sub = report.run_report(run.index)
        sub.check()
        export = read_ncu(shared_trace(sources[run.index]))
        assert sub.launches.drop(NcuCol.RUN).equals(export.launches.drop(NcuCol.RUN))

    doc, err = _json(path, capsys)
    _warned(doc, err, "3 ncu runs")
    assert [r["run"] for r in doc["runs"]] == [0, 1, 2]
    assert [[k["name"] for k in r["kernels"]] for r in doc["runs"]] == [[r[NcuCol.NAME]] for r in alone]
    assert [r["launches"][0]["launch_id"] for r in doc["runs"]] == [0, 0, 0]  # as ncu numbered them
    code, out, _ = _roofline(path, capsys)
    assert code == 0 and all(f"run {k} of 3" in out for k in (1, 2, 3))
    # One table row per saxpy run, each of one launch: never merged into a row of 2 launches.
    # (Piped output has names whole.)
    assert len(re.findall(r"saxpy_kernel\(float, const float \*, float \*, int\)\s+1\s", out)) == 2


# --- .ncu-rep ----------------------------------------------------------------------------------------


def test_rep_strings_with_lone_surrogates(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """ncu_report hands strings through as it decoded them; a lone surrogate in a rule message or a
    kernel name made every output fail with UnicodeEncodeError. No real file here has one, so the
    report object is wrapped to return them."""
    ncu_report = pytest.importorskip("ncu_report")
    path = shared_trace("ncu/v100_ncar_miniweather_baseline.ncu-rep")
    real_load = ncu_report.load_report

    class Action:
        def __init__(self, action: Any) -> None:
            self._action = action

        def __getattr__(self, name: str) -> Any:
            return getattr(self._action, name)

        def name(self, *args: Any) -> str:
            return "kern\udc80el"

        def rule_results_as_dicts(self) -> list[dict[str, Any]]:
            results: list[dict[str, Any]] = self._action.rule_results_as_dicts()
            for result in results:
                message = result.get("rule_message") or {}
                if message.get("message"):
                    message["message"] = "lone \ud800 surrogate. " + message["message"]
            return results

    class Range:
        def __init__(self, rng: Any) -> None:
            self._range = rng

        def __getattr__(self, name: str) -> Any:
            return getattr(self._range, name)

        def action_by_idx(self, i: int) -> Action:
            return Action(self._range.action_by_idx(i))

    class Context:
        def __init__(self, context: Any) -> None:
            self._context = context

        def __getattr__(self, name: str) -> Any:
            return getattr(self._context, name)

        def range_by_idx(self, i: int) -> Range:
            return Range(self._context.range_by_idx(i))

    monkeypatch.setattr(ncu_report, "load_report", lambda p: Context(real_load(p)))
    code, out, err = _roofline(path, capsys)
    assert code == 0, err
    assert "kern\ufffdel" in out
    doc, err = _json(path, capsys)
    assert doc["kernels"][0]["name"] == "kern\ufffdel"
    assert any(m.startswith("lone \ufffd surrogate") for m in (r["message"] for r in doc["rules"]))
    _warned(doc, err, "lone UTF-16 surrogates", "U+FFFD")


def test_a_duration_in_words_is_left_empty_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """gpu__time_duration.sum = "fast": no duration, and the user is told (it was read as a
    0 ns kernel without a word)."""
    path = _hostile(tmp_path, lambda t: _set(t, "Metric Value", "fast", metric="gpu__time_duration.sum"))
    report = read_ncu(path)
    assert report.launches.get_column(NcuCol.DUR).to_list() == [None]
    assert ("gpu__time_duration.sum is text, not a number: dur_ns left empty: 1 launch (first: ID 0 at line 10: "
            "'fast')") in report.warnings
    assert main(["roofline", str(path)]) == 0
    assert "gpu__time_duration.sum is text, not a number" in capsys.readouterr().err


def test_two_kernels_under_one_id_are_not_merged_silently(tmp_path: Path) -> None:
    """The saxpy rows again under ID 0 with another kernel's name: the second kernel's rows are
    skipped, and the warning says so (they had been merged into the first launch unseen)."""
    def edit(table: Table) -> None:
        name = table[0].index("Kernel Name")
        table.extend([[*row[:name], "other_kernel()", *row[name + 1:]] for row in table[1:]])

    path = _hostile(tmp_path, edit)
    report = read_ncu(path)
    assert report.launches.get_column(NcuCol.NAME).to_list() == ["unnamed>::saxpy_kernel(float, const float *, "
                                                                  "float *, int)"]
    assert [w for w in report.warnings if w.startswith("rows skipped: an ID that an earlier launch of another "
                                                       "kernel has")], report.warnings
