"""A cache hit is trusted from the file's identity and hashes the file only when that changed.

The identity is device, inode, size, mtime and ctime. ``touch -r``/``os.utime`` can put an old
mtime back, never an old ctime (the kernel sets it on every write), so a same-size edit with the
mtime restored still changes the identity and gets the file hashed; a file replaced by a copy
has another inode and is hashed too. The hashing function's calls are counted: a trusted hit
never calls it, so it never reads the trace's bytes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from test_cache import cache_dir  # noqa: F401 (the same autouse fixture: a private cache directory)
from test_cache_fresh import FRESH, _edit_middle_kernel_dur, _kernel_dur_ns, _kernel_dur_ns_from_json, _plain_copy
from tracewhy.model import cache
from tracewhy.model.trace import Trace
from tracewhy.readers import read_trace


class _Counts:
    def __init__(self) -> None:
        self.hashes = 0
        self.reads = 0


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> _Counts:
    """Count whole-file hashes; identities count as settled at once (no racy window)."""
    seen = _Counts()
    real_hash = cache._content_hash

    def counting_hash(path: Path) -> str:
        seen.hashes += 1
        return real_hash(path)

    monkeypatch.setattr(cache, "_content_hash", counting_hash)
    monkeypatch.setattr(cache, "RACY_WINDOW_NS", -1)
    return seen


def _read(path: Path, counts: _Counts) -> Trace:
    def fresh(p: Path) -> Trace:
        counts.reads += 1
        return read_trace(p, cache=FRESH)

    return cache.cached_read(path, fresh)


def test_a_hit_with_the_same_identity_does_not_hash_the_file(tmp_path: Path, counts: _Counts) -> None:
    path = _plain_copy(tmp_path)
    first = _read(path, counts)
    assert (counts.reads, counts.hashes) == (1, 2)  # before the read, and again before storing
    second = _read(path, counts)
    assert (counts.reads, counts.hashes) == (1, 2)  # served without a read or a hash
    assert _kernel_dur_ns(second) == _kernel_dur_ns(first) == _kernel_dur_ns_from_json(path)
    assert second.slices.equals(first.slices)


def test_same_size_edit_with_mtime_restored_changes_the_ctime_and_is_hashed(
    tmp_path: Path, counts: _Counts
) -> None:
    path = _plain_copy(tmp_path)
    before = _kernel_dur_ns(_read(path, counts))
    st = path.stat()
    _edit_middle_kernel_dur(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # what `touch -r` or `cp -p` does
    now = path.stat()
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    assert now.st_ctime_ns != st.st_ctime_ns
    hashes = counts.hashes
    after = _kernel_dur_ns(_read(path, counts))
    assert counts.hashes > hashes and counts.reads == 2  # hashed, found changed, read afresh
    assert after == _kernel_dur_ns_from_json(path) != before


def test_a_copy_at_another_inode_is_hashed_then_served(tmp_path: Path, counts: _Counts) -> None:
    path = _plain_copy(tmp_path)
    first = _read(path, counts)
    copy = path.with_name("copy.json")
    shutil.copy2(path, copy)  # same bytes and mtime, another inode
    os.replace(copy, path)
    assert path.stat().st_mtime_ns == cache._key(path, path.stat())["mtime_ns"]
    hashes = counts.hashes
    second = _read(path, counts)
    assert counts.hashes == hashes + 1  # the identity differs: every byte hashed once ...
    assert counts.reads == 1  # ... and, equal, the entry is served without a read
    assert second.slices.equals(first.slices)


def test_an_identity_taken_right_after_a_write_is_not_trusted(
    tmp_path: Path, counts: _Counts, monkeypatch: pytest.MonkeyPatch
) -> None:
    # File times tick coarsely: a write just after the identity was taken may not change them.
    monkeypatch.setattr(cache, "RACY_WINDOW_NS", 10**18)
    path = _plain_copy(tmp_path)
    _read(path, counts)
    hashes = counts.hashes
    _read(path, counts)
    assert counts.hashes == hashes + 1 and counts.reads == 1
