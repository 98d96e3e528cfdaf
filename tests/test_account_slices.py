"""The step account reads each copy's attributes by slice id through ``CopyAttrs`` (columns, not a
tuple of Python objects per copy) and labels the copies by one key per kind of copy
(``label_copies``). Both must answer what the dict of tuples and the loop over the copies that
they replace answered: the same attributes for every id (the last row of an id that has
several, None for one that has none), and the same code for every copy with the items numbered
in the same order."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pytest
from tests.conftest import shared_trace

from tracewhy.analyses.account_slices import CopyAttrs, KindNames, copy_label, label_copies
from tracewhy.model.schema import COPY_ATTRS_SCHEMA, Col, CopyAttrCol, Kind
from tracewhy.readers import read_trace

#: An nsys export (copies with directions and memories), a Kineto trace whose copies have bytes
#: alone, and one with memsets and copies on several streams.
TRACES = ("nsys/nsysai_mfu_2gpu_before.sqlite.gz", "hta/v100_ddp2_rank1_memprofile.json.gz",
          "hta/a100_cuda_event_sync_multistream.json.gz")


def _as_dict(table: pl.DataFrame) -> dict[int, tuple[Any, ...]]:
    """The dict of tuples ``CopyAttrs`` replaces."""
    return {row[0]: row[1:] for row in table.select(
        CopyAttrCol.ID, pl.col(CopyAttrCol.COPY_KIND).cast(pl.String), pl.col(CopyAttrCol.SRC_MEM).cast(pl.String),
        pl.col(CopyAttrCol.DST_MEM).cast(pl.String), CopyAttrCol.BYTES).iter_rows()}


def _loop_labels(copies: list[int], kinds: KindNames, attrs_of: Any, n: int) -> tuple[list[int], list[str]]:
    """The loop ``label_copies`` replaces: a label per copy, an item per distinct label."""
    items: list[str] = []
    out = np.full(n, -1, dtype=np.int64)
    labels: dict[tuple[object, ...], int] = {}
    for i in copies:
        attrs = attrs_of(i)
        key = (kinds[i], attrs[:3] if attrs is not None else None)
        if key not in labels:
            label = copy_label(kinds[i], attrs)
            if label not in items:
                items.append(label)
            labels[key] = items.index(label)
        out[i] = labels[key]
    return out.tolist(), items


def _labels(copies: np.ndarray, kinds: KindNames, attrs: CopyAttrs, n: int) -> tuple[list[int], list[str]]:
    items: list[str] = []

    def item(label: str) -> int:
        if label not in items:
            items.append(label)
        return items.index(label)

    out = np.full(n, -1, dtype=np.int64)
    label_copies(out, copies, kinds, attrs, item)
    return out.tolist(), items


@pytest.mark.parametrize("relative", TRACES)
def test_copy_attrs_answer_what_the_dict_answered(relative: str) -> None:
    trace = read_trace(shared_trace(relative))
    table = trace.copy_attrs
    expected = _as_dict(table)
    got = CopyAttrs(table)
    assert expected
    for slice_id in [*expected, -1, 0, trace.slices.height, 10**12]:
        assert got.get(slice_id) == expected.get(slice_id), slice_id
    assert got.get(-1, (None,)) == (None,)


@pytest.mark.parametrize("relative", TRACES)
def test_bytes_and_directions_of_many_copies_at_once(relative: str) -> None:
    """``bytes_of`` and ``going`` answer for many copies what a ``get`` per copy answers."""
    trace = read_trace(shared_trace(relative))
    expected = _as_dict(trace.copy_attrs)
    got = CopyAttrs(trace.copy_attrs)
    ids = np.array([*expected, -1, trace.slices.height], dtype=np.int64)
    assert got.bytes_of(ids) == sum(int(expected[i][3] or 0) for i in expected)
    assert got.bytes_of(ids[:0]) == 0
    directions = {a[0] for a in expected.values()} | {None, "no such direction"}
    for direction in directions:
        want = [i for i in ids.tolist() if expected.get(i, (None,))[0] == direction]
        assert ids[got.going(ids, direction)].tolist() == want, direction


def test_the_last_row_of_an_id_wins_and_missing_values_are_none() -> None:
    table = pl.DataFrame({CopyAttrCol.ID: [7, 3, 7, 5], CopyAttrCol.BYTES: [1, 2, None, 4],
                          CopyAttrCol.COPY_KIND: ["HtoD", None, "DtoH", "DtoD"],
                          CopyAttrCol.SRC_MEM: ["Pinned", None, "Device", None],
                          CopyAttrCol.DST_MEM: ["Device", None, "Pageable", "Device"]}, schema=COPY_ATTRS_SCHEMA)
    got = CopyAttrs(table)
    expected = _as_dict(table)
    assert expected[7] == ("DtoH", "Device", "Pageable", None)
    for slice_id in (3, 5, 7, 4, 8):
        assert got.get(slice_id) == expected.get(slice_id)


@pytest.mark.parametrize("relative", TRACES)
def test_label_copies_gives_the_loop_s_codes_in_the_loop_s_order(relative: str) -> None:
    trace = read_trace(shared_trace(relative))
    n = trace.slices.height
    kinds = KindNames(trace.slices.get_column(Col.KIND).to_physical().to_numpy().astype(np.int8))
    copies = trace.kind_columns((Kind.MEMCPY, Kind.MEMSET), Col.ID).get_column(Col.ID).to_numpy()
    assert copies.size
    attrs = CopyAttrs(trace.copy_attrs)
    expected = _loop_labels(copies.tolist(), kinds, _as_dict(trace.copy_attrs).get, n)
    assert _labels(copies, kinds, attrs, n) == expected
    # In another order of the copies, the items are numbered in that order.
    backwards = copies[::-1].copy()
    expected = _loop_labels(backwards.tolist(), kinds, _as_dict(trace.copy_attrs).get, n)
    assert _labels(backwards, kinds, attrs, n) == expected
