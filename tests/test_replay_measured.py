"""A replay's walk back takes the account's measured path whole below the first instant its edit
reaches (``MeasuredStretches``): the same end, path and lengths as the walk that decides every
instant, on real windows replayed with no edit, with the drain's edges into the sink, and with
edits that drop, scale and add edges late in the window; and it does take stretches there."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conftest import shared_trace
from tracewhy.analyses import critical_path_replay, replay_measured
from tracewhy.analyses.account import step_model
from tracewhy.analyses.critical_path_replay import GraphEdit
from tracewhy.readers import read_trace


@pytest.mark.parametrize("name", ["nsys/nsysai_mfu_2gpu_before.sqlite.gz", "hta/a100_ddp2_rank0_nccl2.17.json.gz"])
def test_the_walk_takes_the_measured_path_below_the_first_instant_edited(name: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(critical_path_replay, "STRETCHES_FROM", 0)  # (small windows take them too)
    taken = []
    real_take = replay_measured.MeasuredStretches.take

    def take(self: Any, v: int, path: Any, seen: bytearray) -> int:
        before = len(path)
        out = real_take(self, v, path, seen)
        taken.append(len(path) - before)
        return out

    monkeypatch.setattr(replay_measured.MeasuredStretches, "take", take)
    m = step_model(read_trace(shared_trace(name)))
    g = m.graph
    rng = np.random.default_rng(5)
    for path in m.paths[:2]:
        if path.sink < 0:
            continue
        w = m.replay.window(path.window_start, path.window_end)
        late = path.edges[-max(path.edges.size // 5, 1):]  # the path's last fifth
        ends = np.flatnonzero((g.node_ts >= path.window_start) & (g.node_ts < g.node_ts[path.sink]))
        drain = rng.choice(ends, min(50, ends.size))
        drain = drain[g.node_ts[drain] <= g.node_ts[path.sink]]
        into_sink = dict(add_src=drain, add_dst=np.full(drain.size, path.sink),
                         add_weight=np.zeros(drain.size, np.int64), add_kind=np.full(drain.size, 4, np.int64),
                         add_attr=np.full(drain.size, -1, np.int64))
        for edit in (GraphEdit(), GraphEdit(**into_sink), GraphEdit(drop=late[-3:]),
                     GraphEdit(scaled=late, factor=rng.uniform(0, 1, late.size))):
            taken.clear()
            got = w.edited(path.sink, edit, path.edges)
            want = w.edited(path.sink, edit)
            assert (got.end_ns, got.start_ns) == (want.end_ns, want.start_ns)
            assert np.array_equal(got.edges, want.edges) and np.array_equal(got.dur_ns, want.dur_ns)
            if edit.empty:
                assert sum(taken) > 0  # the walk took the measured path's edges whole
