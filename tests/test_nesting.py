"""The vectorized nesting must agree with the exact stack walk on any input."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracewhy.model.linking import nest_host_slices


def _nested_intervals(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Properly nested intervals built recursively (the normal shape of a host thread)."""
    starts: list[int] = []
    durs: list[int] = []

    def build(lo: int, hi: int, depth: int) -> None:
        t = lo
        while t < hi and depth < 6:
            if not draw(st.booleans()):
                break
            a = t + draw(st.integers(0, 5))
            b = a + draw(st.integers(0, 40))
            if b > hi:
                break
            starts.append(a)
            durs.append(b - a)
            build(a, b, depth + 1)
            t = b + draw(st.integers(0, 3))

    build(0, 400, 0)
    return starts, durs


@st.composite
def host_slices(draw: st.DrawFn, jitter: bool) -> tuple[np.ndarray, ...]:  # type: ignore[type-arg]
    threads = draw(st.integers(1, 3))
    ts: list[int] = []
    dur: list[int] = []
    tid: list[int] = []
    for t in range(threads):
        s, d = _nested_intervals(draw)
        if jitter and s:
            i = draw(st.integers(0, len(s) - 1))
            d[i] += draw(st.integers(1, 30))  # overrun the parent: clock jitter
        ts += s
        dur += d
        tid += [t] * len(s)
    n = len(ts)
    is_op = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return (np.zeros(n, dtype=np.int64), np.array(tid, dtype=np.int64), np.array(ts, dtype=np.int64),
            np.array(dur, dtype=np.int64), np.array(is_op, dtype=bool))


def _reference(pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, dur: np.ndarray, is_op: np.ndarray):  # type: ignore[no-untyped-def,type-arg]
    """The obvious stack walk, written out per slice: the specification of nesting."""
    n = ts.shape[0]
    order = sorted(range(n), key=lambda i: (pid[i], tid[i], ts[i], -dur[i], i))
    depth, parent, op = [0] * n, [-1] * n, [-1] * n
    stack: list[int] = []
    key = None
    for i in order:
        if (pid[i], tid[i]) != key:
            stack, key = [], (pid[i], tid[i])
        while stack and ts[stack[-1]] + dur[stack[-1]] <= ts[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            depth[i] = len(stack)
            op[i] = next((j for j in reversed(stack) if is_op[j]), -1)
        stack.append(i)
    return np.array(depth), np.array(parent), np.array(op)


@settings(max_examples=300, deadline=None)
@given(host_slices(jitter=False))
def test_vectorized_nesting_matches_stack_walk(arrays: tuple[np.ndarray, ...]) -> None:  # type: ignore[type-arg]
    got = nest_host_slices(*arrays)
    want = _reference(*arrays)
    for g, w in zip(got, want, strict=True):
        assert g.tolist() == w.tolist()


@settings(max_examples=200, deadline=None)
@given(host_slices(jitter=True))
def test_overrunning_children_fall_back_to_the_stack_walk(arrays: tuple[np.ndarray, ...]) -> None:  # type: ignore[type-arg]
    got = nest_host_slices(*arrays)
    want = _reference(*arrays)
    for g, w in zip(got, want, strict=True):
        assert g.tolist() == w.tolist()
