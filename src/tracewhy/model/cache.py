"""The parsed-Trace cache: one Parquet file per table plus a JSON of TraceMeta, per trace file.

An entry is found by the trace's absolute path, size and mtime, the tool version and a
fingerprint of the reader and model code. It is served when the file's identity (device, inode,
size, mtime and ctime) is the one stored with it, or else when every byte of the file hashes as
it did when the entry was stored, so a changed file or a changed reader never serves a stale
Trace. It lives in ``$TRACEWHY_CACHE_DIR`` or the platform's user cache
directory, never beside the trace unless asked; with neither to be found, reads are not cached.
Entries are built in a private temporary directory and renamed into place in one step, so
concurrent runs never see half an entry; an entry that fails to load for any reason is ignored,
removed and rebuilt. Caching is best effort: it never raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
import polars as pl
import xxhash

from tracewhy._version import __version__
from tracewhy.cache_place import (
    ENV_DISABLE,
    META_FILE,
    RACY_WINDOW_NS,
    default_cache_dir,
    identity,
    identity_trusted,
    path_hash,
    read_manifest,
)
from tracewhy.model.cache_seal import sealed_manifest, write_seal
from tracewhy.model.cache_tables import load_table, write_table
from tracewhy.model.trace import Trace, TraceMeta

#: Bumped when the layout of an entry changes; old entries are then simply never found.
CACHE_FORMAT: Final = 6
#: Files smaller than this are not cached: they read in well under 0.1 s, about what writing and
#: later opening ten Parquet files costs, and tests read hundreds of them.
MIN_CACHED_BYTES: Final = 256 * 1024
#: Read size when hashing a trace: memory stays flat at any file size, and a buffer that fits the
#: CPU's cache hashed 1 GB as fast as 8 or 16 MiB ones here (0.07 s from the page cache).
_HASH_CHUNK_BYTES: Final = 1024 * 1024
#: The code whose output the cache stores, folders and files of the package: a change to any of
#: these files invalidates entries. ``read_helpers.py`` splits a large read between processes;
#: ``input_size.py`` measures the content a reader reads (``readers.source`` takes it from there).
_FINGERPRINTED: Final = ("readers", "model", "read_helpers.py", "cache_place.py", "input_size.py")


@dataclass(frozen=True)
class CacheOptions:
    """Where and whether to cache. ``directory`` None: ``$TRACEWHY_CACHE_DIR`` or the user cache dir."""

    enabled: bool = True
    directory: Path | None = None
    beside_trace: bool = False  # put entries in ``<trace>.tracewhy-cache/`` next to the file
    min_bytes: int = MIN_CACHED_BYTES


def cached_read(path: Path, read: Callable[[Path], Trace], options: CacheOptions | None = None) -> Trace:
    """``read(path)``, checked (``Trace.check()``), or the Trace it returned last time for the
    same file and code.

    Only whole Traces are stored; a cached whole Trace also answers a reader that would have
    returned a partial one (it holds everything the partial one would). What ``read`` returns is
    checked here, before it is stored, so that an entry's seal can say it was."""
    options = options or CacheOptions()

    def read_checked(p: Path) -> Trace:
        trace = read(p)
        trace.check()  # a ModelError is a bug in the reader, never the file's fault: it propagates
        return trace

    if not options.enabled or os.environ.get(ENV_DISABLE):
        return read_checked(path)
    place = _place(path, options)
    if place is None:
        return read_checked(path)
    root, key, current = place
    entry = root / _entry_name(key)
    manifest = _read_manifest(entry)
    if manifest is not None and identity_trusted(manifest, current, RACY_WINDOW_NS):
        # Same inode, size, mtime and ctime as when the bytes were hashed: the kernel sets ctime
        # on every write and no call sets it back, so the file has not been written since.
        trusted = _load(entry, manifest, key, path)
        if trusted is not None:
            return trusted[0]
        manifest = None
    # The identity differs (or no entry): every byte is hashed, beside the entry's load: xxhash
    # and polars release the GIL, so with a second core free the hash adds little to a hit.
    with ThreadPoolExecutor(max_workers=1) as pool:
        hashing = pool.submit(_content_hash, path)
        loaded = _load(entry, manifest, key, path) if manifest is not None else None
        try:
            content = hashing.result()
        except Exception:  # unreadable now (the reader names the problem); caching never raises
            return read_checked(path)
    if loaded is not None:
        trace, entry_content = loaded
        if entry_content == content:
            return trace
        _discard(entry)  # same path, size and mtime, other bytes: ``touch -r`` after an edit
    trace = read_checked(path)
    # A partial Trace served as a whole one would answer wrongly; and a file rewritten since it
    # was hashed may have been read half old, half new: store only what the hash describes.
    if not trace.is_partial:
        stored_identity = _unchanged(path, key, content)
        if stored_identity is not None:
            _store(root, entry, key, content, stored_identity, trace)
    return trace


def _place(path: Path, options: CacheOptions) -> tuple[Path, dict[str, Any], dict[str, int]] | None:
    """The cache directory, the key of ``path``'s entry and the file's identity; None when this
    read is not cached.

    Not cached: a small file, anything but a regular file (hashing a FIFO would block), a file
    that cannot be read (the reader names the problem), and any read when no cache directory
    can be named (no home directory, an unknown ``~user``): caching is best effort."""
    try:
        st = path.stat()
        if st.st_size < options.min_bytes or not stat.S_ISREG(st.st_mode):
            return None
        if options.beside_trace:
            root = path.parent / f"{path.name}.tracewhy-cache"
        else:
            root = options.directory or default_cache_dir()
        return root, _key(path, st), identity(st)
    except (OSError, RuntimeError, ValueError):  # RuntimeError: no home, or a symlink loop (3.10-3.12)
        return None


def _unchanged(path: Path, key: dict[str, Any], content: str) -> dict[str, Any] | None:
    """The file's identity, stamped with when it was taken, if the file still has the key's size
    and mtime and hashes to ``content``; None otherwise. Taken before the hash, so a write after
    it changes the hash or the ctime."""
    try:
        st = path.stat()
        recorded_at_ns = time.time_ns()
        if (st.st_size, st.st_mtime_ns) != (key["size"], key["mtime_ns"]) or _content_hash(path) != content:
            return None
        return {"identity": identity(st), "recorded_at_ns": recorded_at_ns}
    except OSError:
        return None


def _key(path: Path, st: os.stat_result) -> dict[str, Any]:
    return {
        "cache_format": CACHE_FORMAT,
        "path": str(path.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "tool_version": __version__,
        "code": _code_fingerprint(),
        "polars": pl.__version__,
    }


def _entry_name(key: dict[str, Any]) -> str:
    # The path's own hash first, so that storing a new entry can drop stale ones of the same file.
    full_hash = hashlib.sha256(msgspec.json.encode(key, order="sorted")).hexdigest()[:24]
    return f"{path_hash(key['path'])}-{full_hash}"


def _content_hash(path: Path) -> str:
    """xxh3-128 of every byte of the file, on every read: size and mtime alone cannot prove an
    entry fresh, since a same-size edit keeps the size and ``touch -r``, ``cp -p`` or an archive
    extraction put the old mtime back. xxh3 runs at memory speed, a small part of a
    cache hit (bench/results.md). Not mmap, though it hashed 1 GB twice as fast here (0.037 s):
    a file truncated while mapped kills the process with SIGBUS, where ``readinto`` just
    returns fewer bytes."""
    h = xxhash.xxh3_128()
    buf = bytearray(_HASH_CHUNK_BYTES)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


_fingerprint: str | None = None


def _code_fingerprint() -> str:
    """Sizes and mtimes of the reader and model sources: a development tree's edits count too."""
    global _fingerprint
    if _fingerprint is None:
        package = Path(__file__).resolve().parent.parent
        h = hashlib.sha256()
        for sub in _FINGERPRINTED:
            for f in sorted((package / sub).rglob("*.py")) if (package / sub).is_dir() else [package / sub]:
                st = f.stat()
                h.update(f"{f.relative_to(package)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        _fingerprint = h.hexdigest()[:16]
    return _fingerprint


def _table_names() -> list[str]:
    return [f.name for f in dataclasses.fields(Trace) if f.name != "meta"]


def _read_manifest(entry: Path) -> dict[str, Any] | None:
    """The entry's manifest, or None when there is no entry (a broken one is removed)."""
    try:
        return read_manifest(entry)
    except (OSError, ValueError):
        if os.path.lexists(entry):  # unlike Path.exists, never raises (an unsearchable directory)
            _discard(entry)  # a directory without a readable manifest is broken
        return None


def _load(entry: Path, manifest: dict[str, Any], key: dict[str, Any], path: Path) -> tuple[Trace, str] | None:
    """The entry's Trace and the content hash of the file it was read from, or None."""
    try:
        if manifest.get("key") != key:
            raise ValueError("key mismatch")
        tables = {name: load_table(entry, name, manifest["tables"][name]) for name in _table_names()}
        meta = msgspec.convert(manifest["meta"], TraceMeta)
        if meta.kinds_read is not None:
            raise ValueError("a partial Trace is never a cache entry")
        trace = Trace(meta=dataclasses.replace(meta, path=str(path)), **tables)
        # A valid seal says that this cache's store wrote exactly this manifest for a checked
        # Trace, and the manifest gives the bytes of every table (verified above): the check
        # would find what it found then. Any other entry is checked like a fresh read (0.03-0.07 s
        # on 1.9M slices), so one that breaks an invariant (written by hand, or by code that
        # recomputed the checksums) is rebuilt, not served (model/cache_seal.py).
        if not _sealed(entry, manifest):
            trace.check()
        return trace, str(manifest["content_xxh3_128"])
    except Exception:  # any damage at all: ignore the entry and rebuild it
        _discard(entry)
        return None


def _sealed(entry: Path, manifest: dict[str, Any]) -> bool:
    """The manifest the load used is the one the entry's valid seal covers."""
    manifest_bytes = sealed_manifest(entry)
    return manifest_bytes is not None and json.loads(manifest_bytes) == manifest


def _store(
    root: Path, entry: Path, key: dict[str, Any], content: str, stored_identity: dict[str, Any], trace: Trace
) -> None:
    """Write ``trace`` (checked by ``cached_read``) as a new entry, sealed as checked."""
    tmp: Path | None = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        tables: dict[str, dict[str, Any]] = {}
        for name in _table_names():
            tables[name] = write_table(trace.table(name), name, tmp)
        manifest = {
            "key": key, "content_xxh3_128": content, "identity": stored_identity, "tables": tables,
            "meta": trace.meta,
        }
        manifest_bytes = msgspec.json.encode(manifest)
        (tmp / META_FILE).write_bytes(manifest_bytes)
        write_seal(tmp, manifest_bytes)
        prefix = entry.name.split("-", 1)[0] + "-"
        try:
            os.rename(tmp, entry)  # atomic; fails if another run already put the entry there
            tmp = None
        except OSError:
            return
        for stale in root.glob(prefix + "*"):
            if stale != entry:
                _discard(stale)  # older versions of the same file
    except Exception:
        return  # a cache that cannot be written is no cache, not an error
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _discard(entry: Path) -> None:
    """Remove an entry without disturbing a concurrent run: rename it away first, then delete."""
    try:
        trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=entry.parent))
    except OSError:
        return
    with contextlib.suppress(OSError):
        os.rename(entry, trash / "entry")
    shutil.rmtree(trash, ignore_errors=True)
