"""The parsed-trace cache: exact round trip, keying, damage tolerance, concurrency, placement.

The reference for every round trip is the same file read with the cache off: a cached Trace
must be indistinguishable from a fresh one (every table equal with its declared dtypes, the
metadata equal, ``Trace.check()`` passing).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
from pathlib import Path

import msgspec
import polars as pl
import pytest
import xxhash

from conftest import GENERATED, shared_trace
from tracewhy.cli import main
from tracewhy.errors import TraceError
from tracewhy.model.cache import CacheOptions, _content_hash, _key, _store, cached_read
from tracewhy.model.schema import TABLE_SCHEMAS
from tracewhy.model.trace import Trace
from tracewhy.readers import read_trace

ALWAYS = CacheOptions(min_bytes=0)  # the test files are small; cache them anyway
FRESH = CacheOptions(enabled=False)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("TRACEWHY_CACHE_DIR", str(d))
    monkeypatch.delenv("TRACEWHY_NO_CACHE", raising=False)
    return d


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "traces" / src.name
    dst.parent.mkdir(exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def _assert_same(a: Trace, b: Trace) -> None:
    for name, schema in TABLE_SCHEMAS.items():
        ta, tb = a.table(name), b.table(name)
        assert ta.schema == schema and tb.schema == schema, name
        assert ta.equals(tb), name
    assert a.meta == b.meta


class _CountingReader:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, path: Path) -> Trace:
        self.calls += 1
        return read_trace(path, cache=FRESH)


@pytest.mark.parametrize(
    "source",
    [
        # Enums in copy_attrs (memcpy kinds, pinned/pageable) and flows (ac2g phases).
        lambda: shared_trace("hta/a100_alexnet_critical_path.json.gz"),
        # Enums in nvtx_attrs (PushPop/StartEnd) and nsys capture settings in the metadata.
        lambda: shared_trace("nsys/nvfuser_matmul_h200_2024.6.sqlite.gz"),
        # Memory events, Python frames, op attributes with shapes and FLOPs.
        lambda: GENERATED / "cpu_with_stack_memory.pt.trace.json.gz",
    ],
    ids=["kineto-gpu", "nsys", "kineto-memory"],
)
def test_cached_trace_equals_a_fresh_read(source, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = _copy(source(), tmp_path)
    reader = _CountingReader()
    first = cached_read(path, reader, ALWAYS)
    second = cached_read(path, reader, ALWAYS)
    assert reader.calls == 1, "the second read must come from the cache"
    second.check()
    _assert_same(second, read_trace(path, cache=FRESH))
    _assert_same(first, second)
    # Categoricals come back as Categoricals, Enums with exactly their declared categories.
    assert second.slices.schema["name"] == pl.Categorical()
    assert second.copy_attrs.schema == TABLE_SCHEMAS["copy_attrs"]


def test_entry_is_keyed_by_size_and_mtime(tmp_path: Path, cache_dir: Path) -> None:
    path = _copy(GENERATED / "cpu_slow_step_base.pt.trace.json.gz", tmp_path)
    reader = _CountingReader()
    cached_read(path, reader, ALWAYS)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    cached_read(path, reader, ALWAYS)
    assert reader.calls == 2, "a newer mtime is a different file"
    # The stale entry of the same file was dropped: one entry per trace file.
    assert len([p for p in cache_dir.iterdir() if not p.name.startswith(".")]) == 1
    # Same size, same mtime, other content (a rewrite within one coarse mtime tick).
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-8] ^= 0xFF  # the gzip CRC-32: the file now differs in one byte of its trailer only
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size
    with pytest.raises(TraceError, match="gzip"):  # the reader was asked, and saw the bad CRC
        cached_read(path, reader, ALWAYS)
    assert reader.calls == 3
    data[-8] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    # Another file with the same content at another path is another entry.
    other = tmp_path / "other.json.gz"
    shutil.copyfile(path, other)
    cached_read(other, reader, ALWAYS)
    assert reader.calls == 4


def _entry(cache_dir: Path) -> Path:
    (entry,) = [p for p in cache_dir.iterdir() if not p.name.startswith(".")]
    return entry


@pytest.mark.parametrize(
    "damage",
    [
        "truncate-table", "garbage-manifest", "missing-table", "missing-manifest", "swapped-table", "flipped-byte",
        "broken-invariant",
    ],
)
def test_damaged_entry_is_rebuilt_not_an_error(damage: str, tmp_path: Path, cache_dir: Path) -> None:
    path = _copy(shared_trace("hta/a100_alexnet_critical_path.json.gz"), tmp_path)
    reader = _CountingReader()
    cached_read(path, reader, ALWAYS)
    entry = _entry(cache_dir)
    slices = entry / "slices.parquet"
    if damage == "truncate-table":
        slices.write_bytes(slices.read_bytes()[: slices.stat().st_size // 2])
    elif damage == "garbage-manifest":
        (entry / "meta.json").write_bytes(b'{"key": [1, 2')
    elif damage == "missing-table":
        (entry / "flows.parquet").unlink()
    elif damage == "missing-manifest":  # a half-written entry, as a crash mid-write would leave
        (entry / "meta.json").unlink()
    elif damage == "swapped-table":  # a table from elsewhere under this name
        shutil.copyfile(entry / "threads.parquet", slices)
    elif damage == "broken-invariant":
        # Well-formed, with a manifest that matches it, but a negative duration: only the hit's
        # Trace.check() can tell (written by code whose change the fingerprint missed).
        df = pl.read_parquet(slices)
        df = df.with_columns(pl.when(pl.col("id") == 0).then(-1).otherwise(pl.col("dur_ns")).alias("dur_ns"))
        df.write_parquet(slices, compression="uncompressed", statistics=False)
        manifest = msgspec.json.decode((entry / "meta.json").read_bytes())
        data = slices.read_bytes()
        manifest["tables"]["slices"].update(bytes=len(data), xxh3_64=xxhash.xxh3_64_intdigest(data))
        (entry / "meta.json").write_bytes(msgspec.json.encode(manifest))
    else:  # same size, one byte changed: only the checksum can tell
        data = bytearray(slices.read_bytes())
        data[len(data) // 2] ^= 0x01
        slices.write_bytes(bytes(data))
    again = cached_read(path, reader, ALWAYS)
    assert reader.calls == 2
    _assert_same(again, read_trace(path, cache=FRESH))
    # ... and the rebuilt entry serves the next read.
    cached_read(path, reader, ALWAYS)
    assert reader.calls == 2


def _read_in_child(args: tuple[str, str]) -> tuple[int, int]:
    path, cache = args
    os.environ["TRACEWHY_CACHE_DIR"] = cache
    t = read_trace(path, cache=ALWAYS)
    return t.slices.height, int(t.slices.get_column("dur_ns").sum())


def test_concurrent_runs_share_one_entry(tmp_path: Path, cache_dir: Path) -> None:
    path = _copy(GENERATED / "cpu_slow_step_base.pt.trace.json.gz", tmp_path)
    fresh = read_trace(path, cache=FRESH)
    expected = (fresh.slices.height, int(fresh.slices.get_column("dur_ns").sum()))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        results = pool.map(_read_in_child, [(str(path), str(cache_dir))] * 6, chunksize=1)
    assert results == [expected] * 6
    names = sorted(p.name for p in cache_dir.iterdir())
    assert len(names) == 1 and not names[0].startswith("."), names  # no temporary leftovers
    _assert_same(read_trace(path, cache=ALWAYS), fresh)


def test_losing_the_race_to_store_is_harmless(tmp_path: Path, cache_dir: Path) -> None:
    path = _copy(GENERATED / "cpu_slow_step_base.pt.trace.json.gz", tmp_path)
    trace = read_trace(path, cache=ALWAYS)
    entry = _entry(cache_dir)
    before = {p.name: p.read_bytes() for p in entry.iterdir()}
    # Another run finishing the same entry after us: its rename fails, ours stays intact.
    _store(cache_dir, entry, _key(path, path.stat()), _content_hash(path), {}, trace)
    assert sorted(p.name for p in cache_dir.iterdir()) == [entry.name]
    assert {p.name: p.read_bytes() for p in entry.iterdir()} == before


def test_never_beside_the_trace_unless_asked(tmp_path: Path, cache_dir: Path) -> None:
    path = _copy(GENERATED / "cpu_slow_step_base.pt.trace.json.gz", tmp_path)
    before = sorted(os.listdir(path.parent))
    read_trace(path, cache=ALWAYS)
    assert sorted(os.listdir(path.parent)) == before
    assert cache_dir.is_dir()
    read_trace(path, cache=CacheOptions(min_bytes=0, beside_trace=True))
    assert (path.parent / f"{path.name}.tracewhy-cache").is_dir()


def test_unwritable_cache_dir_still_reads(tmp_path: Path) -> None:
    path = _copy(GENERATED / "cpu_slow_step_base.pt.trace.json.gz", tmp_path)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    t = read_trace(path, cache=CacheOptions(min_bytes=0, directory=blocker / "cache"))
    _assert_same(t, read_trace(path, cache=FRESH))


def test_cli_no_cache(tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A real trace above the default size floor (750 KB), so the default options cache it.
    path = shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz")
    assert main(["steps", "--json", "--no-cache", str(path)]) == 0
    uncached = capsys.readouterr().out
    assert not cache_dir.exists()
    assert main(["steps", "--json", str(path)]) == 0
    assert capsys.readouterr().out == uncached
    assert len(list(cache_dir.iterdir())) == 1
    assert main(["steps", "--json", str(path)]) == 0  # served from the cache, same output
    assert capsys.readouterr().out == uncached


def test_the_fingerprint_covers_every_module_the_readers_import() -> None:
    """An entry is keyed by the code that made it: every package module the readers and the
    model import must be fingerprinted, or its change would serve a Trace the new code would not
    build. Found from the imports themselves, so a new helper module outside the two folders
    fails here until it is added (the errors and the version hold no reading logic)."""
    import ast

    from tracewhy.model import cache

    package = Path(cache.__file__).resolve().parent.parent
    covered = {p for p in cache._FINGERPRINTED}
    imported: set[str] = set()
    for folder in ("readers", "model"):
        for f in (package / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tracewhy."):
                    imported.add(node.module.split(".")[1])
    outside = {m for m in imported if m not in covered and f"{m}.py" not in covered} - {"errors", "_version"}
    assert not outside, f"imported by the readers or the model but not fingerprinted: {sorted(outside)}"
    assert "read_helpers" in imported  # the check sees the imports at all
