"""Every result of the Python API is sized, iterable over its main rows, indexable and a table
(``tracewhy.rows.Rows``), and every table it hands out measures times from the trace start."""

from __future__ import annotations

import contextlib
import gzip
import json
from enum import Enum
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import tracewhy as tw
from api_support import A100, CALLS, a100, result
from conftest import shared_trace
from tracewhy.api import RAW_SUFFIX, TIME_COLUMNS, time_origin_ns
from tracewhy.rows import Rows


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_result_is_sized_iterable_indexable_and_a_table(name: str) -> None:
    r = result(name)
    assert isinstance(r, Rows)
    rows = list(r)
    assert len(r) == len(rows) > 0
    assert r[0] == rows[0] and r[-1] == rows[-1]
    head = r[0:2]
    assert len(head) == min(2, len(rows))
    table = r.to_polars()
    assert isinstance(table, pl.DataFrame) and table.height == len(rows)
    pandas = r.to_pandas()
    assert len(pandas) == len(rows) and list(pandas.columns) == table.columns
    assert tw.to_pandas(r).equals(pandas)
    assert len(r.top(1)) == 1 and len(r.top(None)) == len(rows)
    with pytest.raises(IndexError):
        r[len(rows)]


def test_a_diagnosis_is_its_findings() -> None:
    d = result("diagnose")
    assert [f.code for f in d] == [f.code for f in d.findings]
    first = d.findings[0]
    assert d[first.code] is first and first.code in d and "no-such-code" not in d
    assert d.to_pandas().loc[0, "code"] == first.code
    with pytest.raises(KeyError, match="no row with code 'gpu-idel"):
        d["gpu-idel"]


def test_rows_of_a_table_are_dicts_looked_up_by_name() -> None:
    k = result("kernels")
    by_name = k.by_name
    assert next(iter(k)) == by_name.row(0, named=True)
    name = by_name.get_column("name")[1]
    assert k[name]["total_ns"] == by_name.filter(pl.col("name") == name).get_column("total_ns")[0]
    assert k[1:3].equals(by_name[1:3])
    s = result("steps")
    assert [row["name"] for row in s] == s.table.get_column("name").to_list()
    assert s["ProfilerStep#5"]["number"] == 5


def test_top_keeps_the_first_rows_or_the_largest_where_a_result_ranks_by_a_column() -> None:
    assert tw.kernels(a100(), top=5).by_name.equals(result("kernels").by_name.head(5))
    assert len(tw.ops(a100(), top=3)) == 3 and len(tw.diagnose(a100(), top=1)) == 1
    gaps = result("gaps").gaps
    largest = tw.gaps(a100(), top=4).gaps
    assert sorted(largest.get_column("dur_ns").to_list()) == sorted(gaps.get_column("dur_ns").to_list())[-4:]
    assert largest.get_column("start_ns").is_sorted()  # still in time order
    with pytest.raises(ValueError, match="top must be >= 0"):
        tw.kernels(a100(), top=-1)


def _first_event_start_ns(path: str) -> int:
    """The trace start read from the raw file: the earliest complete event's start (Kineto's
    microseconds as nanoseconds), leaving out the profiler's own span (category "Trace"), which
    the reader does not keep as a slice."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    return min(round(float(e["ts"]) * 1000) for e in events if e.get("ph") == "X" and e.get("cat") != "Trace")


def test_times_run_from_the_first_event_and_the_raw_clock_is_kept() -> None:
    origin = _first_event_start_ns(str(shared_trace(A100)))
    assert time_origin_ns(a100()) == origin
    steps = result("steps").table
    assert steps.get_column("ts_ns")[0] == 0 and steps.get_column("ts_raw_ns")[0] == origin
    assert (steps.get_column("window_end_raw_ns") - steps.get_column("window_end_ns") == origin).all()
    kernels = tw.slices(a100(), "kernel")
    assert (kernels.get_column("ts_raw_ns") - kernels.get_column("ts_ns") == origin).all()
    assert kernels.get_column("ts_ns").min() > 0 and kernels.schema["name"] == pl.String()


def _tables(value: Any, seen: set[int] | None = None) -> list[pl.DataFrame]:
    """Every DataFrame in a result, nested results and lists of them included."""
    import dataclasses

    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, pl.DataFrame):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tables(v, seen)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and not isinstance(value, tw.Trace):
        return [t for f in dataclasses.fields(value) for t in _tables(getattr(value, f.name), seen)]
    return []


@pytest.mark.parametrize("name", ["diagnose", "steps", "gaps", "kernels", "ops", "overlap", "blocks", "nvtx",
                                  "critical_path", "lines", "compile", "memory trace"])
def test_every_table_of_a_one_trace_result_has_plain_names_and_times_from_the_start(name: str) -> None:
    tables = _tables(result(name))
    assert tables
    for table in tables:
        assert not [c for c, t in table.schema.items() if isinstance(t, (pl.Categorical, pl.Enum))], table.columns
        for column in table.columns:
            if column in TIME_COLUMNS and table.schema[column].is_integer():
                raw = column.removesuffix("_ns") + RAW_SUFFIX
                assert raw in table.columns, f"{name}: {column} has no {raw}"
                starts = table.get_column(column).drop_nulls()
                assert starts.is_empty() or starts.min() >= 0, f"{name}: {column} before the trace start"


def test_an_nsys_exports_times_run_from_its_first_record_as_gaps_says(tmp_path: Path) -> None:
    """On an Nsight Systems export the origin is the earliest start of any record (read here
    from the SQLite tables themselves), and the one ``gaps --json`` states."""
    import shutil
    import sqlite3

    from api_support import cli_json

    source = shared_trace("nsys/nsysai_mock_rtx3080.sqlite.gz")
    export = tmp_path / "export.sqlite"
    with gzip.open(source) as packed, export.open("wb") as out:
        shutil.copyfileobj(packed, out)
    with contextlib.closing(sqlite3.connect(f"file:{export}?mode=ro", uri=True)) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        timed = [t for t in tables if "start" in {r[1] for r in db.execute(f"PRAGMA table_info('{t}')")}]
        first = min(m for t in timed if (m := db.execute(f"SELECT min(start) FROM '{t}'").fetchone()[0]) is not None)
    assert time_origin_ns(tw.load(source)) == first == cli_json("gaps", str(source))["time_origin_ns"]
    kernels = tw.slices(source, "kernel")
    assert (kernels.get_column("ts_raw_ns") - kernels.get_column("ts_ns") == first).all()


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_table_of_every_result_has_names_as_plain_strings(name: str) -> None:
    for table in _tables(result(name)):
        kept = [c for c, t in table.schema.items() if isinstance(t, (pl.Categorical, pl.Enum))
                or (isinstance(t, pl.List) and isinstance(t.inner, (pl.Categorical, pl.Enum)))]
        assert not kept, f"{name}: {kept} are not plain strings"


def _records(value: Any, seen: set[int]) -> list[object]:
    """Every object of a tracewhy class in a result: nested results, records and the items of its
    lists, tuples and dicts (a Trace and tables are not walked into)."""
    import dataclasses

    if id(value) in seen or isinstance(value, (pl.DataFrame, tw.Trace, str, bytes, int, float, type)):
        return []
    seen.add(id(value))
    if isinstance(value, (list, tuple)):
        return [r for v in value for r in _records(v, seen)]
    if isinstance(value, dict):
        return [r for v in value.values() for r in _records(v, seen)]
    if not type(value).__module__.startswith("tracewhy"):
        return []
    held = [getattr(value, f.name) for f in dataclasses.fields(value)] if dataclasses.is_dataclass(value) else []
    return [value, *(r for v in held for r in _records(v, seen))]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_record_a_result_holds_is_a_frozen_dataclass(name: str) -> None:
    """docs/python-api.md promises frozen dataclasses: dataclasses.replace, fields and asdict work
    on a result and on every record in it. (Records the package keeps to itself are msgspec
    Structs, cheaper to define at import; none of them may leak into a result.)"""
    import dataclasses

    import msgspec

    for record in _records(result(name), set()):
        kind = type(record).__qualname__
        if isinstance(record, Enum):
            continue
        assert not isinstance(record, msgspec.Struct), f"{name}: a {kind} in the result is a msgspec Struct"
        assert dataclasses.is_dataclass(record), f"{name}: a {kind} in the result is not a dataclass"
        params = type(record).__dataclass_params__  # type: ignore[attr-defined]
        assert params.frozen, f"{name}: {kind} is not frozen"
