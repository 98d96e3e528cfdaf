"""The parsed-trace cache never serves numbers the file no longer holds, and never stops a read.

Freshness: the key covers every byte of the trace, because a same-size edit with the
mtime put back (``touch -r``, ``cp -p``, an archive extraction) leaves size and mtime alone.
Robustness: a cache directory that cannot be determined or created means no cache, not an error.
"""

from __future__ import annotations

import gzip
import json
import os
import pwd
import re
import tracemalloc
from pathlib import Path

import pytest

from conftest import shared_trace
from test_cache import cache_dir  # noqa: F401 (the same autouse fixture: a private cache directory)
from tracewhy.model.cache import MIN_CACHED_BYTES, CacheOptions, _content_hash, cached_read
from tracewhy.model.schema import Kind
from tracewhy.model.trace import Trace
from tracewhy.readers import read_trace

FRESH = CacheOptions(enabled=False)


def _plain_copy(tmp_path: Path) -> Path:
    """A real Kineto trace written out uncompressed, so a digit can change without changing the size."""
    path = tmp_path / "traces" / "alexnet.json"
    path.parent.mkdir()
    path.write_bytes(gzip.decompress(shared_trace("hta/a100_alexnet_critical_path.json.gz").read_bytes()))
    assert path.stat().st_size >= MIN_CACHED_BYTES  # cached under the default options
    return path


def _kernel_dur_ns(trace: Trace) -> int:
    return int(trace.of_kind(Kind.KERNEL).get_column("dur_ns").sum())


def _kernel_dur_ns_from_json(path: Path) -> int:
    """The same sum straight from the file with the standard library's decoder (durations in us)."""
    events = json.loads(path.read_bytes())["traceEvents"]
    return round(sum(e["dur"] for e in events if e.get("cat") == "kernel") * 1000)


def _edit_middle_kernel_dur(path: Path) -> int:
    """Change the leading digit of the duration of the kernel nearest the file's middle; return its offset."""
    data = bytearray(path.read_bytes())
    kernels = [m.end() for m in re.finditer(rb'"cat": "kernel"', data)]
    start = min(kernels, key=lambda pos: abs(pos - len(data) // 2))
    dur = re.compile(rb'"dur": (\d)').search(data, start)
    assert dur is not None
    at = dur.start(1)
    data[at] = ord("1") if data[at] == ord("9") else data[at] + 1
    path.write_bytes(bytes(data))
    return at


def test_same_size_edit_in_the_middle_with_mtime_restored_is_seen(tmp_path: Path) -> None:
    path = _plain_copy(tmp_path)
    before = read_trace(path)  # default options: cached
    assert _kernel_dur_ns(before) == _kernel_dur_ns_from_json(path)
    assert _kernel_dur_ns(read_trace(path)) == _kernel_dur_ns(before)  # served from the cache
    st = path.stat()
    at = _edit_middle_kernel_dur(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # what `touch -r` or `cp -p` does
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert 64 * 1024 < at < st.st_size - 64 * 1024  # far from either end
    expected = _kernel_dur_ns_from_json(path)
    assert expected != _kernel_dur_ns(before)
    after = read_trace(path)
    assert _kernel_dur_ns(after) == expected
    assert _kernel_dur_ns(read_trace(path, cache=FRESH)) == expected
    assert _kernel_dur_ns(read_trace(path)) == expected  # and the new entry serves the next read


def test_a_file_changed_during_the_read_is_not_stored(tmp_path: Path) -> None:
    # The key is taken before the reader runs; an entry must hold what the key describes.
    path = _plain_copy(tmp_path)
    original = path.read_bytes()
    st = path.stat()
    expected = _kernel_dur_ns_from_json(path)

    def read_while_rewritten(p: Path) -> Trace:
        _edit_middle_kernel_dur(p)  # another process rewrites the file after the key was taken
        return read_trace(p, cache=FRESH)

    changed = cached_read(path, read_while_rewritten)
    assert _kernel_dur_ns(changed) != expected
    path.write_bytes(original)  # the original bytes and mtime are back: the key matches again
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _kernel_dur_ns(read_trace(path)) == expected


def test_unresolvable_cache_dir_reads_without_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(KeyError):
        pwd.getpwnam("nosuchuser")
    monkeypatch.setenv("TRACEWHY_CACHE_DIR", "~nosuchuser/x")
    monkeypatch.chdir(tmp_path)
    path = shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz")
    assert path.stat().st_size >= MIN_CACHED_BYTES
    trace = read_trace(path)
    assert _kernel_dur_ns(trace) == _kernel_dur_ns(read_trace(path, cache=FRESH))
    assert os.listdir(tmp_path) == []  # not taken as a relative directory named '~nosuchuser'


def test_no_home_and_no_passwd_entry_reads_without_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_home(cls: type[Path]) -> Path:
        raise RuntimeError("Could not determine home directory.")  # a uid without a passwd entry

    for var in ("TRACEWHY_CACHE_DIR", "HOME", "XDG_CACHE_HOME", "LOCALAPPDATA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(Path, "home", classmethod(no_home))
    monkeypatch.chdir(tmp_path)
    path = shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz")
    trace = read_trace(path)
    assert _kernel_dur_ns(trace) == _kernel_dur_ns(read_trace(path, cache=FRESH))
    assert os.listdir(tmp_path) == []


def test_content_hash_reads_in_bounded_chunks(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(64 * 1024 * 1024)  # sparse: 64 MiB of zeros without writing them
    tracemalloc.start()
    try:
        digest = _content_hash(big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, f"hashing held {peak:,} bytes at once"
    # Every byte counts: the last one changes the hash.
    with open(big, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"\x01")
    assert _content_hash(big) != digest
