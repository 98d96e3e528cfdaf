"""Host nesting: the vectorized containment rule against two specifications written out by hand.

On properly nested slices (the normal shape of a thread) it must equal the stack walk a trace
viewer does. On slices that outlive the one they began in (``ProfilerStep#N`` opened inside the
short ``_record_function_enter_new`` frame, clock jitter) it must equal the brute-force
containment rule: the parent is the innermost slice that starts no later, ends no later, and is
open at the child's start.
"""

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


def _containment(pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, dur: np.ndarray, is_op: np.ndarray):  # type: ignore[no-untyped-def,type-arg]
    """Every pair compared: the parent is the container that comes last in (start, longest first,
    file order); depth and op follow the parent chain."""
    n = ts.shape[0]
    rank = {i: r for r, i in enumerate(sorted(range(n), key=lambda i: (ts[i], -dur[i], i)))}
    parent = [-1] * n
    for i in range(n):
        end_i = ts[i] + dur[i]
        containers = [
            j for j in range(n)
            if j != i and (pid[j], tid[j]) == (pid[i], tid[i]) and rank[j] < rank[i]
            and ts[j] <= ts[i] and ts[j] + dur[j] >= end_i and ts[j] + dur[j] > ts[i]
        ]
        if containers:
            parent[i] = max(containers, key=lambda j: rank[j])
    depth, op = [0] * n, [-1] * n
    for i in range(n):
        j = parent[i]
        while j >= 0:
            depth[i] += 1
            if op[i] < 0 and is_op[j]:
                op[i] = j
            j = parent[j]
    return np.array(depth), np.array(parent), np.array(op)


@settings(max_examples=300, deadline=None)
@given(host_slices(jitter=False))
def test_nested_slices_equal_the_containment_rule(arrays: tuple[np.ndarray, ...]) -> None:  # type: ignore[type-arg]
    got = nest_host_slices(*arrays)
    want = _containment(*arrays)
    for g, w in zip(got, want, strict=True):
        assert g.tolist() == w.tolist()


@settings(max_examples=300, deadline=None)
@given(host_slices(jitter=True))
def test_overrunning_slices_follow_the_containment_rule(arrays: tuple[np.ndarray, ...]) -> None:  # type: ignore[type-arg]
    got = nest_host_slices(*arrays)
    want = _containment(*arrays)
    for g, w in zip(got, want, strict=True):
        assert g.tolist() == w.tolist()


def test_profiler_step_opened_in_a_short_python_frame_is_its_callers_child() -> None:
    """The shape of every with_stack trace (tracelens h100_owlv2: ProfilerStep#6 begins 5 us into
    a 10 us ``_record_function_enter_new`` frame and lasts 1.2 s): the step and the ops in it
    belong to the loop frame, not to the frame that opened the step."""
    #        0: loop frame  1: enter_new frame  2: ProfilerStep  3: op inside the step  4: step() frame
    ts = np.array([0, 100, 105, 300, 990], dtype=np.int64)
    dur = np.array([2000, 10, 900, 50, 30], dtype=np.int64)
    zeros = np.zeros(5, dtype=np.int64)
    is_op = np.array([False, False, False, True, False])
    depth, parent, _ = nest_host_slices(zeros, zeros, ts, dur, is_op)
    assert parent.tolist() == [-1, 0, 0, 2, 0]
    assert depth.tolist() == [0, 1, 1, 2, 1]
