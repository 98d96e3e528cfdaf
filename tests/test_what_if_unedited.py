"""A prediction whose edits change nothing in a window reuses that window's unedited replay.

A replay is a function of the window and the edit, so every such prediction replays the same
thing; on a large export without step markers the window is the whole trace and one replay takes
seconds. Checked on a real nsys export: the replays are counted, and the shared replay's
predictions equal those of fresh windows, which replay everything again.
"""

from __future__ import annotations

from typing import Any

import pytest

from conftest import shared_trace
from tracewhy.analyses import critical_path_replay
from tracewhy.analyses.account import StepModel, step_model
from tracewhy.analyses.what_if import Prediction, predict, window_edges
from tracewhy.readers import read_trace


@pytest.fixture(scope="module")
def model() -> StepModel:
    return step_model(read_trace(shared_trace("nsys/nsysai_mfu_2gpu_before.sqlite.gz")))


def _same(a: Prediction, b: Prediction) -> None:
    assert (a.predicted_ns, a.measured_ns, a.parts, a.changed, a.next_bottleneck) == (
        b.predicted_ns, b.measured_ns, b.parts, b.changed, b.next_bottleneck)


def test_predictions_that_change_nothing_replay_each_window_once(model: StepModel,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    replays = []
    real = critical_path_replay.ReplayWindow.edited

    def counting(self: Any, sink: int, edit: Any, known: Any = None) -> Any:
        replays.append(sink)
        return real(self, sink, edit, known)

    monkeypatch.setattr(critical_path_replay.ReplayWindow, "edited", counting)
    windows = window_edges(model)
    replayable = sum(w.path.sink >= 0 for w in windows)
    assert replayable > 0
    first = predict(model, [], windows)
    second = predict(model, [], windows)
    assert len(replays) == replayable  # the second prediction replayed nothing
    assert not first.changed
    _same(first, second)
    _same(first, predict(model, [], window_edges(model)))  # fresh windows: replayed again, same result
    assert len(replays) == 2 * replayable
