"""The orders the dependency graph is built in, each computed a cheaper way than it was first
written and compared with that way: a GPU row's stream key is the rank of its (pid, device,
stream) among the distinct triples in sorted order (numpy's distinct rows over the triples), and
the host boundaries are ordered by their seven keys (one sort over all seven), on real traces;
the pair (pid, tid) as one integer keeps the pairs' order."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from conftest import shared_trace
from tracewhy.analyses.critical_path_edges import stream_keys
from tracewhy.analyses.critical_path_graph import _boundary_order, _thread_ranks, build_graph
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col
from tracewhy.readers import read_trace


def _distinct_rows_rank(frame: pl.DataFrame, rows: np.ndarray) -> np.ndarray:
    keys = frame.select(pl.col(Col.PID).fill_null(-1), pl.col(Col.DEVICE).fill_null(-1).cast(pl.Int64),
                        pl.col(Col.STREAM).fill_null(-1)).to_numpy()[rows]
    _, inverse = np.unique(keys, axis=0, return_inverse=True)
    return inverse.reshape(-1)


@pytest.mark.parametrize("name", ["nsys/nsysai_mfu_2gpu_before.sqlite.gz", "hta/a100_ddp2_rank0_nccl2.17.json.gz"])
def test_stream_keys_rank_the_distinct_triples(name: str) -> None:
    s = read_trace(shared_trace(name)).slices
    rows = np.flatnonzero(s.get_column(Col.KIND).is_in([k.value for k in GPU_ACTIVITY_KINDS]).to_numpy())
    got = stream_keys(s, rows)
    assert got.max() > 0
    assert np.array_equal(got, _distinct_rows_rank(s, rows))
    assert np.array_equal(stream_keys(s, rows[::-3]), _distinct_rows_rank(s, rows[::-3]))


def test_stream_keys_with_nulls_and_negative_streams() -> None:
    frame = pl.DataFrame({Col.PID: [3, None, 3, 1, 3, None], Col.DEVICE: [0, 0, None, 1, 0, 0],
                          Col.STREAM: [7, -5, 7, None, 2, -5]},
                         schema={Col.PID: pl.Int64, Col.DEVICE: pl.Int32, Col.STREAM: pl.Int64})
    rows = np.arange(frame.height)
    assert stream_keys(frame, rows).tolist() == [4, 0, 2, 1, 3, 0]
    assert np.array_equal(stream_keys(frame, rows), _distinct_rows_rank(frame, rows))
    assert stream_keys(frame, np.zeros(0, np.int64)).size == 0


@pytest.mark.parametrize("name", ["nsys/nsysai_mfu_2gpu_before.sqlite.gz", "hta/a100_ddp2_rank0_nccl2.17.json.gz"])
def test_host_boundaries_in_the_order_of_their_seven_keys(name: str) -> None:
    s = read_trace(shared_trace(name)).slices
    pid, tid = s.get_column(Col.PID).fill_null(-1).to_numpy(), s.get_column(Col.TID).fill_null(-1).to_numpy()
    ts, dur = s.get_column(Col.TS).to_numpy(), np.maximum(s.get_column(Col.DUR).to_numpy(), 0)
    depth = s.get_column(Col.DEPTH).fill_null(0).to_numpy().astype(np.int64)
    n = s.height
    dur = dur.copy()
    dur[::50] = 0  # zero-length slices (their end right after their start) and ties at one instant
    is_end = np.r_[np.zeros(n, bool), np.ones(n, bool)]
    group = np.where(is_end & ~np.r_[dur == 0, dur == 0], 0, 1)
    level = np.where(group == 0, -np.r_[depth, depth], np.r_[depth, depth])
    keys = (np.r_[pid, pid], np.r_[tid, tid], np.r_[ts, ts + dur], group, level, np.r_[np.arange(n), np.arange(n)],
            is_end)
    want = np.lexsort(keys[::-1])
    assert depth.max() > 0 and (dur == 0).any()
    thread = _thread_ranks(pid, tid)
    assert np.array_equal(_boundary_order(thread, ts, dur, depth), want)
    deep = (*keys[:4], keys[4] * (1 << 40), *keys[5:])  # no room to pack the last four keys
    assert np.array_equal(_boundary_order(thread, ts, dur, depth * (1 << 40)), np.lexsort(deep[::-1]))
    # A depth below zero (no reader makes one) packs as the seven keys order it: here a slice's end
    # (group 0) and the next one's start at the same instant, the end first.
    one = np.zeros(2, dtype=np.int64)
    assert _boundary_order(one, np.array([0, 10]), np.array([10, 5]), np.array([-5, 0])).tolist() == [0, 2, 1, 3]


def test_thread_ranks_keep_the_order_of_the_pairs() -> None:
    pid = np.array([5, -1, 5, 2**40, 5, -1], dtype=np.int64)  # one pid too large to share an integer
    tid = np.array([9, 3, 2, 0, 9, 3], dtype=np.int64)
    ranks = _thread_ranks(pid, tid)
    assert ranks.tolist() == [2, 0, 1, 3, 2, 0]
    packed = _thread_ranks(pid[[0, 1, 2, 4]], tid[[0, 1, 2, 4]])  # these fit: both in one integer
    assert np.array_equal(np.argsort(packed, kind="stable"), np.lexsort((tid[[0, 1, 2, 4]], pid[[0, 1, 2, 4]])))
    assert len(set(packed.tolist())) == 3


@pytest.mark.parametrize("name", ["nsys/nsysai_mfu_2gpu_before.sqlite.gz", "hta/a100_ddp2_rank0_nccl2.17.json.gz"])
def test_end_nodes_are_each_slices_end(name: str) -> None:
    """``Graph.end_nodes``, one search for many slices, is each slice's own end node: the node
    after its start, of the same slice, at its start plus its duration."""
    trace = read_trace(shared_trace(name))
    g = build_graph(trace)
    ids = np.unique(g.node_slice)[::7]
    ends = g.end_nodes(ids)
    assert ends.size == ids.size > 100 and (ends % 2 == 1).all()
    assert np.array_equal(g.node_slice[ends], ids) and np.array_equal(g.node_slice[ends - 1], ids)
    s = trace.slices
    dur = np.maximum(s.get_column(Col.DUR).to_numpy()[ids], 0)
    assert np.array_equal(g.node_ts[ends], s.get_column(Col.TS).to_numpy()[ids] + dur)
