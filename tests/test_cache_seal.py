"""The parse cache's seal: a hit on an entry its own store wrote is not checked again, any other
entry is (``Trace.check()``), and every read is checked once before it is stored.

The checks are counted by wrapping ``Trace.check``; the reference for every hit is the same file
read with the cache off.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import polars as pl
import pytest
import xxhash

import test_cache
from conftest import shared_trace
from test_cache import ALWAYS, FRESH, _entry
from tracewhy.model.cache import cached_read
from tracewhy.model.cache_seal import SEAL_FILE
from tracewhy.model.schema import TABLE_SCHEMAS
from tracewhy.model.trace import ModelError, Trace
from tracewhy.readers import read_trace

cache_dir = test_cache.cache_dir  # autouse: each test reads and writes its own cache directory

TRACE = "hta/a100_alexnet_critical_path.json.gz"


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[Trace]:
    """Every Trace checked from now on, in order."""
    seen: list[Trace] = []
    real = Trace.check

    def counted(self: Trace) -> None:
        seen.append(self)
        real(self)

    monkeypatch.setattr(Trace, "check", counted)
    return seen


@pytest.fixture
def path(tmp_path: Path) -> Path:
    dst = tmp_path / "traces" / "trace.json.gz"
    dst.parent.mkdir()
    shutil.copyfile(shared_trace(TRACE), dst)
    return dst


def _same(a: Trace, b: Trace) -> bool:
    return all(a.table(n).equals(b.table(n)) for n in TABLE_SCHEMAS) and a.meta == b.meta


def test_a_read_is_checked_once_and_a_sealed_hit_not_again(path: Path, cache_dir: Path, checks: list[Trace]) -> None:
    first = read_trace(path, cache=ALWAYS)
    assert checks == [first]  # the cold read, once, before the store
    assert (_entry(cache_dir) / SEAL_FILE).is_file()
    hit = read_trace(path, cache=ALWAYS)
    assert len(checks) == 1, "a hit on the store's own entry is not checked again"
    assert _same(hit, first)


@pytest.mark.parametrize("unsealed", ["no-seal", "stale-seal", "manifest-re-encoded"])
def test_an_entry_the_store_did_not_seal_is_checked(
    unsealed: str, path: Path, cache_dir: Path, checks: list[Trace]
) -> None:
    read_trace(path, cache=ALWAYS)
    entry = _entry(cache_dir)
    if unsealed == "no-seal":  # as an entry of code before the seal would be
        (entry / SEAL_FILE).unlink()
    elif unsealed == "stale-seal":
        (entry / SEAL_FILE).write_text("0" * 32)
    else:  # the same manifest, written by another encoder: not the bytes the store sealed
        meta = entry / "meta.json"
        meta.write_bytes(msgspec.json.format(meta.read_bytes(), indent=1))
    hit = read_trace(path, cache=ALWAYS)
    assert len(checks) == 2 and checks[1] is not checks[0], "the hit was checked"
    assert _same(hit, read_trace(path, cache=FRESH))


def test_a_rewritten_table_with_its_checksum_is_checked_and_rebuilt(
    path: Path, cache_dir: Path, checks: list[Trace]
) -> None:
    """A table written again, with its size and checksum put into the manifest (what code the
    fingerprint missed could do), leaves the seal stale: the hit's check finds the broken
    invariant and the trace is read again, never served broken."""
    read_trace(path, cache=ALWAYS)
    entry = _entry(cache_dir)
    slices = entry / "slices.parquet"
    df = pl.read_parquet(slices).with_columns(pl.lit(-1, pl.Int64).alias("dur_ns"))
    df.write_parquet(slices, compression="uncompressed", statistics=False)
    manifest = msgspec.json.decode((entry / "meta.json").read_bytes())
    data = slices.read_bytes()
    manifest["tables"]["slices"].update(bytes=len(data), xxh3_64=xxhash.xxh3_64_intdigest(data))
    (entry / "meta.json").write_bytes(msgspec.json.encode(manifest))
    again = read_trace(path, cache=ALWAYS)
    assert len(checks) == 3  # the cold read, the hit's check (failed), the read again
    assert int(again.slices.get_column("dur_ns").min()) >= 0  # type: ignore[arg-type]
    read_trace(path, cache=ALWAYS)
    assert len(checks) == 3, "the rebuilt entry is sealed"


def test_a_reader_that_breaks_the_model_is_refused_and_not_stored(path: Path, cache_dir: Path) -> None:
    good = read_trace(path, cache=FRESH)
    broken = Trace(meta=good.meta, **{**{n: good.table(n) for n in TABLE_SCHEMAS},
                                      "slices": good.slices.with_columns(pl.lit(None, pl.Int64).alias("ts_ns"))})
    with pytest.raises(ModelError, match="never be null"):
        cached_read(path, lambda p: broken, ALWAYS)
    assert not cache_dir.exists() or not [p for p in cache_dir.iterdir() if not p.name.startswith(".")]
