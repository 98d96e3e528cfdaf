"""Every Trace that ``read_trace`` returns has passed ``Trace.check()``.

Each invariant is broken on a real trace read with the cache off, and ``check()`` must name
it; a reader that returns a broken Trace is a bug (``ModelError``, exit 70), never a Trace
handed to the analyses. The cache's side (a hit is checked too) is in test_cache.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
import pytest

import tracewhy.readers.kineto.reader as kineto_reader
from conftest import shared_trace
from tracewhy.cli import main
from tracewhy.model.cache import CacheOptions
from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import ModelError, Trace
from tracewhy.readers import read_trace

FRESH = CacheOptions(enabled=False)
REAL = "hta/a100_alexnet_critical_path.json.gz"  # kernels with launches, ops, nesting


@pytest.fixture(scope="module")
def trace() -> Trace:
    return read_trace(shared_trace(REAL), cache=FRESH)


def _with(trace: Trace, expr: pl.Expr, column: str) -> Trace:
    return dataclasses.replace(trace, slices=trace.slices.with_columns(expr.alias(column)))


def _first(trace: Trace, cond: pl.Expr) -> int:
    return int(trace.slices.filter(cond).get_column(Col.ID)[0])


def _set(trace: Trace, row: int, column: str, value: object) -> Trace:
    dtype = trace.slices.schema[column]
    expr = pl.when(pl.col(Col.ID) == row).then(pl.lit(value, dtype=dtype)).otherwise(pl.col(column))
    return _with(trace, expr, column)


def test_a_real_read_passes(trace: Trace) -> None:
    trace.check()
    assert trace.slices.filter(pl.col(Col.LAUNCH).is_not_null()).height > 100
    assert trace.slices.filter(pl.col(Col.PARENT).is_not_null()).height > 100


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("negative-dur", "negative dur_ns"),
        ("ids-out-of-order", "row number"),
        ("gpu-without-device", "needs a device"),
        ("launch-out-of-range", "launch_id outside"),
        ("launch-to-a-kernel", "runtime or driver call"),
        ("launch-other-correlation", "share the correlation id"),
        ("op-to-a-kernel", "CPU op"),
        ("parent-out-of-range", "parent_id outside"),
        ("parent-after-child", "starts before its parent"),
        ("schema", "schema mismatch"),
    ],
)
def test_each_invariant_is_caught(trace: Trace, breakage: str, message: str) -> None:
    s = trace.slices
    kernel = _first(trace, pl.col(Col.KIND) == Kind.KERNEL.value)
    launched = _first(trace, pl.col(Col.LAUNCH).is_not_null())
    child = _first(trace, pl.col(Col.PARENT).is_not_null())
    with_op = trace.slices.filter(pl.col(Col.OP).is_not_null())
    if breakage == "negative-dur":
        broken = _set(trace, 0, Col.DUR, -5)
    elif breakage == "ids-out-of-order":
        broken = dataclasses.replace(trace, slices=pl.concat([s.slice(1), s.slice(0, 1)]))
    elif breakage == "gpu-without-device":
        broken = _set(trace, kernel, Col.DEVICE, None)
    elif breakage == "launch-out-of-range":
        broken = _set(trace, launched, Col.LAUNCH, s.height + 10)
    elif breakage == "launch-to-a-kernel":
        broken = _set(trace, launched, Col.LAUNCH, kernel)
    elif breakage == "launch-other-correlation":
        launch = int(s.get_column(Col.LAUNCH)[launched])
        broken = _set(trace, launch, Col.CORRELATION, -7)
    elif breakage == "op-to-a-kernel":
        assert with_op.height, "the real trace must link GPU work to ops"
        broken = _set(trace, int(with_op.get_column(Col.ID)[0]), Col.OP, kernel)
    elif breakage == "parent-out-of-range":
        broken = _set(trace, child, Col.PARENT, -1)
    elif breakage == "parent-after-child":
        parent = int(s.get_column(Col.PARENT)[child])
        broken = _set(trace, parent, Col.TS, int(s.get_column(Col.TS)[child]) + 1)
    else:
        broken = dataclasses.replace(trace, slices=s.with_columns(pl.col(Col.TS).cast(pl.Float64)))
    with pytest.raises(ModelError, match=message):
        broken.check()


def test_a_reader_that_breaks_the_model_is_a_bug(
    trace: Trace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = _set(trace, 0, Col.DUR, -1)
    monkeypatch.setattr(kineto_reader, "read_kineto", lambda path, progress=None, kinds=None: broken)
    with pytest.raises(ModelError, match="negative dur_ns"):
        read_trace(shared_trace(REAL), cache=FRESH)
    # Cached or not: a large file goes through the cache's store path, which must not swallow it.
    with pytest.raises(ModelError, match="negative dur_ns"):
        read_trace(shared_trace(REAL), cache=CacheOptions(min_bytes=0))
    monkeypatch.setenv("TRACEWHY_NO_CACHE", "1")
    assert main(["steps", str(shared_trace(REAL))]) == 70
    assert "internal error" in capsys.readouterr().err


def test_no_file_reaches_a_trace_unchecked(tmp_path: Path) -> None:
    """The cache's hit path checks too: a hit returns only what check() accepts."""
    path = tmp_path / Path(REAL).name
    path.write_bytes(shared_trace(REAL).read_bytes())
    opts = CacheOptions(directory=tmp_path / "cache", min_bytes=0)
    first, second = read_trace(path, cache=opts), read_trace(path, cache=opts)
    first.check()
    second.check()
    assert first.slices.equals(second.slices)
