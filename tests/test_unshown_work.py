"""Commands skip the analyses they do not show: the same findings, the unshown part not computed."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import shared_trace
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.model.trace import Trace
from tracewhy.readers import read_trace
from tracewhy.reports.diagnose import diagnose_in


@pytest.fixture(scope="module")
def nsys_export() -> Trace:
    return read_trace(shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz"))


def _diagnosis_and_replays(trace: Trace, options: DiagnoseOptions) -> tuple[Any, list[str]]:
    """The diagnosis, and the fixes it asked to replay, one entry per prediction."""
    replayed: list[str] = []

    class Counting(Context):
        def predict(self, edits: Any) -> Any:
            replayed.append(" + ".join(repr(e) for e in edits))
            return super().predict(edits)

    return diagnose_in(Counting(trace, options)), replayed


def test_without_the_fixes_together_the_findings_are_the_same_and_one_replay_fewer(nsys_export: Trace) -> None:
    shown, shown_replays = _diagnosis_and_replays(nsys_export, DiagnoseOptions())
    skipped, skipped_replays = _diagnosis_and_replays(nsys_export, DiagnoseOptions(fixes_together=False))
    assert shown.together is not None and len(shown.together.codes) >= 2
    assert skipped.together is None
    assert skipped.findings == shown.findings
    assert skipped.lead == shown.lead
    # The fixes together are the last replay diagnose asks for, and the only one left out.
    assert skipped_replays == shown_replays[:-1]
    assert len(shown_replays) == len(skipped_replays) + 1
