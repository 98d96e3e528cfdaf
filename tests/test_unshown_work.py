"""Commands skip the analyses they do not show: the same findings, the unshown part not computed."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import shared_trace
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.model.trace import Trace
from tracewhy.readers import read_trace
from tracewhy.reports.diagnose import Report, diagnose_in
from tracewhy.reports.diff import compare

TRACES = {"nsys": "nsys/nsysai_h100_2gpu_1s.sqlite.gz", "bert": "tracelens/h100_bert-small_bs1_seq512.json.gz"}


def _diagnosis_and_replays(trace: Trace, options: DiagnoseOptions) -> tuple[Report, list[str]]:
    """The diagnosis, and the fixes it asked to replay, one entry per prediction."""
    replayed: list[str] = []

    class Counting(Context):
        def predict(self, edits: Any) -> Any:
            replayed.append(" + ".join(repr(e) for e in edits))
            return super().predict(edits)

    return diagnose_in(Counting(trace, options)), replayed


@pytest.fixture(scope="module")
def traces() -> dict[str, Trace]:
    return {name: read_trace(shared_trace(path)) for name, path in TRACES.items()}


@pytest.fixture(scope="module")
def diagnosed(traces: dict[str, Trace]) -> dict[str, tuple[Report, list[str]]]:
    """Each trace's diagnosis as ``diagnose`` makes it, and its predictions."""
    return {name: _diagnosis_and_replays(t, DiagnoseOptions()) for name, t in traces.items()}


def test_without_the_fixes_together_the_findings_are_the_same_and_one_replay_fewer(
        traces: dict[str, Trace], diagnosed: dict[str, tuple[Report, list[str]]]) -> None:
    shown, shown_replays = diagnosed["nsys"]
    skipped, skipped_replays = _diagnosis_and_replays(traces["nsys"], DiagnoseOptions(fixes_together=False))
    assert shown.together is not None and len(shown.together.codes) >= 2
    assert skipped.together is None
    assert skipped.findings == shown.findings
    assert skipped.lead == shown.lead
    # The fixes together are the last prediction diagnose asks for, and the only one left out.
    assert skipped_replays == shown_replays[:-1]


@pytest.mark.parametrize("name", list(TRACES))
def test_a_diagnosis_without_replays_has_the_same_codes(name: str, traces: dict[str, Trace],
                                                         diagnosed: dict[str, tuple[Report, list[str]]]) -> None:
    priced, priced_replays = diagnosed[name]
    unpriced = diagnose_in(Context(traces[name], DiagnoseOptions()), replay=False)
    assert priced_replays
    assert sorted(f.code for f in unpriced.findings) == sorted(f.code for f in priced.findings)
    assert all(f.predicted_step_ns is None for f in unpriced.findings)
    assert unpriced.lead is None and unpriced.together is None


def test_a_diff_of_runs_with_the_same_codes_replays_nothing(traces: dict[str, Trace],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    replayed: list[Any] = []
    original = Context.predict
    monkeypatch.setattr(Context, "predict", lambda self, edits: replayed.append(edits) or original(self, edits))
    c = compare(traces["bert"], traces["bert"])
    assert c.findings_compared and not c.findings_appeared and not c.findings_disappeared
    assert replayed == []


def test_a_diff_of_runs_with_other_codes_shows_the_full_diagnoses_findings(
        traces: dict[str, Trace], diagnosed: dict[str, tuple[Report, list[str]]]) -> None:
    c = compare(traces["bert"], traces["nsys"])
    a, b = diagnosed["bert"][0], diagnosed["nsys"][0]
    codes_a, codes_b = {f.code for f in a.findings}, {f.code for f in b.findings}
    assert codes_a != codes_b
    assert c.findings_appeared == [f for f in b.findings if f.code not in codes_a]
    assert c.findings_disappeared == [f for f in a.findings if f.code not in codes_b]
    assert any(f.predicted_step_ns is not None for f in c.findings_appeared + c.findings_disappeared)
