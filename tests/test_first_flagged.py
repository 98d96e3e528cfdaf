"""first_flagged gives the same rows whether a few starts climb from themselves or every row
takes the pointer jumping: checked on a real Kineto trace's stacks (CPU ops as the flag)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import shared_trace
from tracewhy.model import linking
from tracewhy.model.schema import Col, Kind
from tracewhy.readers import read_trace


@pytest.mark.parametrize("rounds", [1, 3, 64])
def test_few_starts_climb_to_the_rows_pointer_jumping_finds(rounds: int, monkeypatch: pytest.MonkeyPatch) -> None:
    slices = read_trace(shared_trace("hta/a100_alexnet_critical_path.json.gz")).slices
    parent = slices.get_column(Col.PARENT).fill_null(-1).to_numpy()
    flag = (slices.get_column(Col.KIND) == Kind.CPU_OP.value).to_numpy()
    # A few starts (fewer than one per 16 rows), deep in stacks, and one that is none.
    deep = np.flatnonzero(slices.get_column(Col.DEPTH).fill_null(0).to_numpy() >= 2)
    starts = np.r_[-1, deep[:: max(1, 20 * deep.size // slices.height)]][: slices.height // 20].astype(np.int64)
    expected = linking._nearest_flagged(parent, flag)[np.maximum(starts, 0)]
    expected[starts < 0] = -1
    monkeypatch.setattr(linking, "_CLIMB_ROUNDS", rounds)
    got = linking.first_flagged(starts, parent, flag)
    assert np.array_equal(got, expected)
    assert (got >= 0).sum() > 10  # and many starts have a CPU op above them
    # With every row a start, the pointer jumping alone.
    every = np.arange(slices.height, dtype=np.int64)
    assert np.array_equal(linking.first_flagged(every, parent, flag)[starts[1:]], expected[1:])
