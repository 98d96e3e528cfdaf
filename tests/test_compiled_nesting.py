"""The compiled nesting (``model/compiled_loops.nest``, numba) gives the rows the numpy nesting
gives (``linking.nest_host_slices``: pointer jumping), which every earlier test and figure was
made with, so that is the reference: on generated host slices (threads interleaved, ties of start,
zero-length slices, slices that outlive the one they began in) and on real traces read whole."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from tests.conftest import shared_trace
from tests.test_compiled_loops import compiled_loops_from, needs_numba

from tracewhy.model import linking
from tracewhy.model.schema import Col
from tracewhy.readers import CacheOptions, read_trace

I64 = np.int64


@contextmanager
def _nesting(*, compiled_from: int | None) -> Iterator[list[int]]:
    """Nestings compiled from ``compiled_from`` rows on (None: never, the numpy reference); yields
    the sizes of the nestings that ran compiled."""
    with compiled_loops_from(compiled_from, ["nest"]) as ran:
        sizes: list[int] = []
        yield sizes
        sizes.extend(n for _, n in ran)


def _nest(columns: dict[str, np.ndarray[Any, Any]], compiled_from: int | None) -> tuple[Any, list[int]]:
    with _nesting(compiled_from=compiled_from) as ran:
        out = linking.nest_host_slices(*(columns[k].copy() for k in ("pid", "tid", "ts", "dur", "is_op")))
    return out, ran


@st.composite
def host_slices(draw: st.DrawFn) -> dict[str, np.ndarray[Any, Any]]:
    """Host slices of a few threads of two processes, in the time order a reader hands them over:
    starts on a coarse grid (ties), lengths that are often 0 and often overrun their container."""
    n = draw(st.integers(1, 60))
    rows = draw(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(0, 40), st.integers(0, 30)),
                         min_size=n, max_size=n))
    rows.sort(key=lambda r: r[2])  # (stable: ties keep the drawn order, as file order)
    pid, tid, ts, dur = (np.array(c, dtype=I64) for c in zip(*rows, strict=True))
    is_op = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    return {"pid": pid, "tid": tid * 7 + 100, "ts": ts * 1000, "dur": dur * 250, "is_op": is_op}


@needs_numba
@settings(max_examples=400, deadline=None)
@given(host_slices())
def test_compiled_nesting_nests_as_pointer_jumping(columns: dict[str, np.ndarray[Any, Any]]) -> None:
    expected, ran = _nest(columns, None)
    assert ran == []
    got, ran = _nest(columns, 0)
    assert ran == [len(columns["ts"])]
    for name, want, have in zip(("depth", "parent", "op"), expected, got, strict=True):
        np.testing.assert_array_equal(have, want, err_msg=name)


@needs_numba
def test_deep_chains_grow_the_stack() -> None:
    """Ranges nested 200 deep (the compiled stack starts at 64), then a sibling of the outermost."""
    n = 200
    columns = {"pid": np.zeros(n + 1, dtype=I64), "tid": np.zeros(n + 1, dtype=I64),
               "ts": np.append(np.arange(n, dtype=I64), 10_000),
               "dur": np.append(np.arange(2 * n, n, -1, dtype=I64), 5),
               "is_op": np.arange(n + 1) % 3 == 0}
    (depth, parent, op), ran = _nest(columns, 0)
    assert ran == [n + 1]
    assert depth.tolist() == [*range(n), 0]
    assert parent.tolist() == [-1, *range(n - 1), -1]
    assert op[n - 1] == n - 2 and op[n - 2] == n - 5  # (the nearest proper ancestor flagged: rows 0, 3, 6, ...)
    expected, _ = _nest(columns, None)
    for want, have in zip(expected, (depth, parent, op), strict=True):
        np.testing.assert_array_equal(have, want)


# Real traces: a with_stack trace whose Python frames nest deep, one with slices that overrun the
# one they began in, several host threads, and nsys exports (runtime calls under NVTX ranges).
REAL = (
    "hta/v100_ddp2_rank1_memprofile.json.gz",
    "tracelens/h100_owlv2-large_zero-shot.json.gz",
    "hta/a100_16rank_rank0_alltoall.json.gz",
    "nsys/nsysai_mfu_2gpu_before.sqlite.gz",
    "nsys/nsysai_h100_2gpu_1s.sqlite.gz",
)


@needs_numba
@pytest.mark.parametrize("relative", REAL)
def test_real_traces_nest_the_same_compiled(relative: str) -> None:
    path = shared_trace(relative)
    links = [Col.DEPTH, Col.PARENT, Col.OP]
    with _nesting(compiled_from=None):
        expected = read_trace(path, cache=CacheOptions(enabled=False)).slices.select(links)
    with _nesting(compiled_from=0) as ran:
        got = read_trace(path, cache=CacheOptions(enabled=False)).slices.select(links)
    assert ran, "the reader must have nested its host slices compiled"
    assert expected.get_column(Col.PARENT).is_not_null().sum() > 1000
    assert_frame_equal(got, expected)
