"""A batch's side columns as the reader builds them in bulk: grids and blocks split in one call
when every one is three integers and one at a time otherwise, op attribute rows only for ops
that carry one, and args decoded as one array per kind unless one of them is of the wrong
shape, which costs that event its args and no other. Expected values are written inline."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from tests.builders import KinetoBuilder

from tracewhy.readers.kineto.reader import read_kineto


def _kernel_dims(trace_path: Path) -> dict[str, tuple[int | None, ...]]:
    trace = read_kineto(trace_path)
    names = trace.slices.select("id", pl.col("name").cast(pl.String))
    rows = trace.kernel_attrs.join(names, on="id").sort("id")
    return {r[-1]: r[1:7] for r in rows.rows()}


def test_grids_of_three_integers_split_in_bulk(tmp_path: Path) -> None:
    b = KinetoBuilder()
    b.launch("k1", 0, 1, 10, 5, grid=[1, 2, 3], block=[128, 1, 1])
    b.launch("k2", 2, 1, 20, 5, grid=[4, 5, 6], block=[64, 2, 1])
    assert _kernel_dims(b.write(tmp_path / "t.json")) == {
        "k1": (1, 2, 3, 128, 1, 1), "k2": (4, 5, 6, 64, 2, 1)}


def test_a_grid_that_is_not_three_integers_is_null_for_that_kernel_alone(tmp_path: Path) -> None:
    """Text (Triton launches write it), another length, none at all: null where it stands."""
    b = KinetoBuilder()
    b.launch("three", 0, 1, 10, 5, grid=[1, 2, 3], block=[32, 1, 1])
    b.launch("text", 2, 1, 20, 5, grid="(7, 8, 9)", block=[32, 1, 1])
    b.launch("two", 4, 1, 30, 5, grid=[7, 8], block="128")
    b.launch("none", 6, 1, 40, 5, block=[32, 1, 1])
    nulls = (None, None, None)
    assert _kernel_dims(b.write(tmp_path / "t.json")) == {
        "three": (1, 2, 3, 32, 1, 1), "text": (*nulls, 32, 1, 1), "two": (*nulls, *nulls),
        "none": (*nulls, 32, 1, 1)}


def test_only_ops_that_carry_an_attribute_have_a_row(tmp_path: Path) -> None:
    b = KinetoBuilder()
    b.op("ids_only", 0, 1, **{"External id": 5, "Ev Idx": 1})
    b.op("types_only", 2, 1, **{"Input type": ["float"]})  # comes with shapes only: no row of its own
    b.op("flops_beyond_int64", 4, 1, flops=1e30)  # null flops: no row
    b.op("sequence", 6, 1, **{"Sequence number": 3})
    b.op("shapes", 8, 1, **{"Input Dims": [[2, 3]], "Input type": ["float"]})
    b.op("flops", 10, 1, flops=12.0)
    trace = read_kineto(b.write(tmp_path / "t.json"))
    names = trace.slices.select("id", pl.col("name").cast(pl.String))
    rows = trace.op_attrs.join(names, on="id").sort("id")
    assert rows.select("name", "input_dims", "input_types", "sequence_number", "flops").rows() == [
        ("sequence", None, None, 3, None), ("shapes", "[[2,3]]", '["float"]', None, None),
        ("flops", None, None, None, 12)]


def test_args_of_the_wrong_shape_cost_only_their_event(tmp_path: Path) -> None:
    b = KinetoBuilder()
    for i in range(5):
        b.op(f"op{i}", 2 * i, 1, **{"External id": 100 + i})
    b.events[2]["args"]["External id"] = "not a number"
    trace = read_kineto(b.write(tmp_path / "t.json"))
    ext = trace.slices.sort("ts_ns").get_column("external_id").to_list()
    assert ext == [100, 101, None, 103, 104]
    assert sum("args ignored" in w for w in trace.meta.warnings) == 1
