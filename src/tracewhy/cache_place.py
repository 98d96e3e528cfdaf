"""Where the parsed-trace cache lives, what names a file's entries and when an entry's stored
identity vouches for the file unread. Standard library only, so that the command line can ask,
before its own imports, whether a read will be served from the cache: a helper process started
early for a read that never happens costs the second core its imports (``read_helpers``). The
cache itself (entries, keys, loading and storing) is ``model/cache.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, BinaryIO, Final

ENV_DIR: Final = "TRACEWHY_CACHE_DIR"
ENV_DISABLE: Final = "TRACEWHY_NO_CACHE"
META_FILE: Final = "meta.json"
#: A stored identity is trusted only if taken this long after the file's last change (its ctime):
#: file times tick coarsely (2 s on FAT), so a write just after the identity was taken could
#: leave it unchanged. A trace is rarely read within 2 s of being written; such an entry is hashed.
RACY_WINDOW_NS: Final = 2_000_000_000


def default_cache_dir() -> Path:
    """``$TRACEWHY_CACHE_DIR``, else the platform's per-user cache directory plus ``tracewhy``.

    Raises RuntimeError when there is no home directory to put it in (a uid without a passwd
    entry and no ``$HOME``) or ``~user`` in ``$TRACEWHY_CACHE_DIR`` names no user."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "tracewhy"
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA")
        return (Path(base) if base else home / "AppData" / "Local") / "tracewhy" / "Cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else home / ".cache") / "tracewhy"


def path_hash(resolved: str) -> str:
    """What every entry of the file at this absolute path starts its name with."""
    return hashlib.sha256(resolved.encode()).hexdigest()[:16]


def identity(st: os.stat_result) -> dict[str, int]:
    """What the kernel says about the file without reading it; ``ctime_ns`` changes on every
    write and metadata change, and unlike mtime no system call can put an old value back."""
    return {
        "dev": st.st_dev, "ino": st.st_ino, "size": st.st_size,
        "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
    }


def identity_trusted(manifest: dict[str, Any], current: dict[str, int], racy_window_ns: int | None = None) -> bool:
    """The file is the one whose bytes the entry's hash describes, without reading it: the same
    identity, recorded long enough after the file's last change. File times come from a coarse
    clock (a few ms on Linux before 6.13, 2 s on FAT), so a write landing just after the
    identity was taken can leave every time unchanged; such "racy" entries (git's word for its
    index) are always hashed. ``racy_window_ns``: RACY_WINDOW_NS unless given."""
    window = RACY_WINDOW_NS if racy_window_ns is None else racy_window_ns
    stored = manifest.get("identity")
    if not isinstance(stored, dict) or stored.get("identity") != current:
        return False
    recorded_at_ns = stored.get("recorded_at_ns")
    return isinstance(recorded_at_ns, int) and recorded_at_ns - current["ctime_ns"] > window


def open_regular(file: Path) -> BinaryIO:
    """``file`` opened for reading if it is a regular file; OSError otherwise. Opened without
    blocking and checked on the open descriptor: a FIFO or device planted in the cache (under
    the entry's name, or a link to one) would block or never end a plain read."""
    fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{file.name}: not a regular file")
    return os.fdopen(fd, "rb")


def read_manifest(entry: Path) -> dict[str, Any]:
    """An entry's manifest (its key, content hash, identity, tables and metadata); OSError or
    ValueError when the entry has no readable one."""
    with open_regular(entry / META_FILE) as f:
        manifest = json.loads(f.read())
    if not isinstance(manifest, dict):
        raise ValueError("manifest is not an object")
    return manifest


def trusted_entry_exists(path: str) -> bool:
    """Whether the default cache directory holds an entry of the file ``path`` names whose
    stored identity the file still has: a read of it will most likely be served from there. Not
    a promise (the entry may be of other code, or damaged): the reader decides; a wrong yes only
    means that a helper is started later, by the read. Never raises."""
    try:
        if os.environ.get(ENV_DISABLE):
            return False
        file = Path(path)
        current = identity(file.stat())
        root = default_cache_dir()
        for entry in root.glob(path_hash(str(file.resolve())) + "-*"):
            if identity_trusted(read_manifest(entry), current):
                return True
    except (OSError, RuntimeError, ValueError):  # no cache here, or an entry that is not one
        return False
    return False
