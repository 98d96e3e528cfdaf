"""The parse cache's table files: columns mapped from raw arrays come back exactly as a fresh
read has them, chunked like the Parquet columns beside them, and a damaged mapped file is
caught like a damaged Parquet one.

The test traces are small, so the row threshold for mapping is lowered to one row: every table
with a null-free number column then has a mapped file. The reference for every hit is the same
file read with the cache off.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import polars as pl
import pytest

import test_cache
from conftest import GENERATED, shared_trace
from test_cache import ALWAYS, FRESH, _assert_same, _copy, _CountingReader, _entry
from tracewhy.model import cache_tables
from tracewhy.model.cache import cached_read
from tracewhy.model.schema import TABLE_SCHEMAS
from tracewhy.readers import read_trace

cache_dir = test_cache.cache_dir  # autouse: each test reads and writes its own cache directory


@pytest.fixture(autouse=True)
def every_table_mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """(``cache_dir``, test_cache's autouse fixture, gives each test its own cache.)"""
    monkeypatch.setattr(cache_tables, "MAPPED_MIN_ROWS", 1)


SOURCES: dict[str, Callable[[], Path]] = {
    "kineto-gpu": lambda: shared_trace("hta/a100_alexnet_critical_path.json.gz"),
    "nsys": lambda: shared_trace("nsys/nvfuser_matmul_h200_2024.6.sqlite.gz"),
    "kineto-memory": lambda: GENERATED / "cpu_with_stack_memory.pt.trace.json.gz",
}


@pytest.mark.parametrize("source", list(SOURCES))
def test_mapped_columns_round_trip(source: str, tmp_path: Path, cache_dir: Path) -> None:
    path = _copy(SOURCES[source](), tmp_path)
    reader = _CountingReader()
    cached_read(path, reader, ALWAYS)
    manifest = msgspec.json.decode((_entry(cache_dir) / "meta.json").read_bytes())
    mapped = {name: [c for c, _ in t["mapped"]["columns"]] for name, t in manifest["tables"].items() if "mapped" in t}
    assert "id" in mapped["slices"] and "ts_ns" in mapped["slices"], mapped
    hit = cached_read(path, reader, ALWAYS)
    assert reader.calls == 1, "the second read must come from the cache"
    hit.check()
    _assert_same(hit, read_trace(path, cache=FRESH))
    for name in TABLE_SCHEMAS:
        df = hit.table(name)
        # Every column cut alike: polars never has to copy one to line it up with the others.
        assert len({tuple(df.get_column(c).chunk_lengths()) for c in df.columns}) <= 1, name


@pytest.fixture
def stored(tmp_path: Path, cache_dir: Path) -> tuple[Path, _CountingReader, Path]:
    """A trace, its counting reader, which has read it once, and the entry that read stored."""
    path = _copy(shared_trace("hta/a100_alexnet_critical_path.json.gz"), tmp_path)
    reader = _CountingReader()
    cached_read(path, reader, ALWAYS)
    return path, reader, _entry(cache_dir)


@pytest.mark.parametrize("damage", ["truncate", "flipped-byte", "missing", "column-renamed"])
def test_damaged_mapped_file_is_rebuilt_not_an_error(damage: str, stored: tuple[Path, _CountingReader, Path]) -> None:
    path, reader, entry = stored
    columns = entry / "slices.columns"
    data = bytearray(columns.read_bytes())
    if damage == "truncate":
        columns.write_bytes(data[: len(data) // 2])
    elif damage == "flipped-byte":  # same size: only the checksum can tell
        data[len(data) // 2] ^= 0x01
        columns.write_bytes(bytes(data))
    elif damage == "missing":
        columns.unlink()
    else:  # a manifest naming a column the table does not declare
        meta = entry / "meta.json"
        meta.write_bytes(meta.read_bytes().replace(b'["ts_ns",', b'["ts_nz",', 1))
    again = cached_read(path, reader, ALWAYS)
    assert reader.calls == 2
    _assert_same(again, read_trace(path, cache=FRESH))
    cached_read(path, reader, ALWAYS)
    assert reader.calls == 2, "the rebuilt entry serves the next read"


def test_small_tables_stay_whole_in_parquet(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_tables, "MAPPED_MIN_ROWS", 1 << 16)
    path = _copy(shared_trace("hta/a100_alexnet_critical_path.json.gz"), tmp_path)
    read_trace(path, cache=ALWAYS)
    assert not list(_entry(cache_dir).glob("*.columns"))


def test_mapped_columns_are_cut_like_the_parquet_ones(tmp_path: Path) -> None:
    """Above a few hundred thousand rows Parquet comes back in one chunk per row group; the
    mapped columns are cut at the same rows, so the table needs no copy to line them up."""
    schema = TABLE_SCHEMAS["flows"]
    n = 300_000
    kinds, phases = schema["kind"].categories.to_list(), schema["phase"].categories.to_list()  # type: ignore[attr-defined]
    df = pl.DataFrame(
        {
            "flow_id": range(n), "kind": [kinds[i % len(kinds)] for i in range(n)],
            "phase": [phases[i % len(phases)] for i in range(n)], "ts_ns": range(0, 10 * n, 10),
            "pid": [7] * n, "tid": range(n, 0, -1),
        },
        schema=schema,
    )
    info = cache_tables.write_table(df, "flows", tmp_path)
    assert [c for c, _ in info["mapped"]["columns"]] == ["flow_id", "ts_ns", "pid", "tid"]
    back = cache_tables.load_table(tmp_path, "flows", info)
    assert back.schema == schema and back.equals(df)
    cuts = {tuple(back.get_column(c).chunk_lengths()) for c in back.columns}
    assert len(cuts) == 1 and len(next(iter(cuts))) > 1, cuts
