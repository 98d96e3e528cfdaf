"""A device's busy time per bin from its running total (``DeviceBusy.busy_before``) is what
clipping every interval to each bin (``busy_in``) gives, on generated intervals and bins and on
the utilization series of real traces."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import shared_trace
from tracewhy.analyses.intervals import union
from tracewhy.analyses.utilization import DeviceBusy, device_busy, utilization
from tracewhy.readers import read_trace

_SPANS = st.lists(st.tuples(st.integers(-50, 500), st.integers(0, 80)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(_SPANS, st.lists(st.integers(-100, 700), min_size=1, max_size=12))
def test_busy_before_differences_are_busy_in(spans: list[tuple[int, int]], cuts: list[int]) -> None:
    ts = np.array([s for s, _ in spans], dtype=np.int64)
    s, e = union(ts, ts + np.array([d for _, d in spans], dtype=np.int64))
    busy = DeviceBusy(0, s, e)
    edges = np.array(sorted(cuts), dtype=np.int64)
    got = np.diff(busy.busy_before(edges)).tolist()
    assert got == [busy.busy_in(int(a), int(z)) for a, z in itertools.pairwise(edges)]


@pytest.mark.parametrize("name", ["tracelens/h100_bert-small_bs1_seq512.json.gz",
                                  "hta/v100_ddp2_rank1_memprofile.json.gz"])
def test_series_is_the_clipped_busy_time(name: str) -> None:
    trace = read_trace(shared_trace(name))
    series = utilization(trace, bins=50).series
    busy = device_busy(trace)
    assert series.height > 0
    for device, a, z, share in series.select("device", "start_ns", "end_ns", "busy_share").iter_rows():
        assert share == busy[device].busy_in(a, z) / max(z - a, 1)
