"""The readers' serial tail run on two threads: a large table's host nesting starts beside the
rest of the join (``readers/kineto/tables.join_batches``, ``model/linking.link_slices``), and a
Kineto read joins its memory events, flows and threads beside the slices (``Builder.finish``).

What either order makes must be the same Trace, table for table and row for row. Real traces,
read twice: with every threshold at 0 (each tail on two threads, whatever its size) and out of
reach (one thread, as before the change). The V100 DDP rank is above the default thresholds
(101 k host slices) and is also read as the command reads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from tests.conftest import shared_trace

import tracewhy.model.linking as linking
import tracewhy.readers.kineto.builder as builder
import tracewhy.readers.kineto.tables as tables
from test_cache import _assert_same
from tracewhy.model.linking import NEST_APART_ROWS
from tracewhy.model.schema import HOST_KINDS
from tracewhy.model.trace import Trace
from tracewhy.readers import CacheOptions, read_trace

V100 = "hta/v100_ddp2_rank1_memprofile.json.gz"
TRACES = (
    V100,
    "tracelens/h100_owlv2-large_zero-shot.json.gz",  # slices that overrun the one they began in
    "hta/a100_16rank_rank0_alltoall.json.gz",
    "nsys/nsysai_mfu_2gpu_before.sqlite.gz",  # link_slices per process, from the nsys reader
)


@contextmanager
def _apart_from(rows: int) -> Iterator[None]:
    """Every two-thread tail from ``rows`` rows on."""
    saved = linking.NEST_APART_ROWS, tables.NEST_APART_ROWS, builder._APART_ROWS
    linking.NEST_APART_ROWS = tables.NEST_APART_ROWS = builder._APART_ROWS = rows
    try:
        yield
    finally:
        linking.NEST_APART_ROWS, tables.NEST_APART_ROWS, builder._APART_ROWS = saved


def _read(path: Path, apart_from: int) -> Trace:
    with _apart_from(apart_from):
        return read_trace(path, cache=CacheOptions(enabled=False))


@pytest.mark.parametrize("relative", TRACES)
def test_two_threads_make_the_trace_one_thread_makes(relative: str) -> None:
    path = shared_trace(relative)
    one = _read(path, 2**62)
    _assert_same(_read(path, 0), one)
    assert one.slices.get_column("depth").max() > 0  # (nested: the comparison says something)


def test_the_large_rank_takes_the_two_thread_tail_by_default() -> None:
    path = shared_trace(V100)
    trace = read_trace(path, cache=CacheOptions(enabled=False))
    hosts = trace.slices.filter(pl.col("depth").is_not_null()).height
    assert hosts >= NEST_APART_ROWS  # (else the default path below is the one-thread one)
    _assert_same(trace, _read(path, 2**62))


def test_a_given_nesting_is_the_one_link_slices_makes() -> None:
    """``link_slices(nesting=...)`` takes the caller's nesting as its own: given the one it would
    make, the table is the same; given another, the other shows (so it is not ignored)."""
    slices = _read(shared_trace(V100), 2**62).slices
    bare = slices.with_columns(pl.lit(None, dtype=c.dtype).alias(c.name)
                               for c in slices.select("depth", "parent_id", "launch_id", "op_id").iter_columns())
    host_idx = np.flatnonzero(bare.get_column("kind").is_in([k.value for k in HOST_KINDS]).to_numpy())
    made = linking._nesting(bare, host_idx)
    assert_frame_equal(linking.link_slices(bare, nesting=lambda: made), slices, check_exact=True)
    flat = tuple(a.copy() for a in made)
    flat[0][flat[0] > 0] = 0
    assert not linking.link_slices(bare, nesting=lambda: flat).equals(slices)


@pytest.mark.parametrize("relative", (V100, "tracelens/h100_owlv2-large_zero-shot.json.gz"))
def test_the_metadata_made_beside_the_nesting_is_the_finished_tables(relative: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The builder makes the metadata while the nesting is being made, from the table whose
    launches are linked: what it gives is what the finished table gives (``trace_meta`` reads no
    nesting column), and the table it was given had none yet (so the check is not vacuous)."""
    calls: list[tuple[tuple[Any, ...], pl.DataFrame]] = []
    made = builder.trace_meta

    def recording(*args: Any) -> Any:
        calls.append((args[:-1], args[-1]))
        return made(*args)

    monkeypatch.setattr(builder, "trace_meta", recording)
    trace = _read(shared_trace(relative), 0)
    (others, given), = calls
    assert given.get_column("depth").null_count() == given.height
    assert given.get_column("launch_id").null_count() < given.height
    assert made(*others, trace.slices) == trace.meta
