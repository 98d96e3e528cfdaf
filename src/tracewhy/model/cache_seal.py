"""The seal of a parse-cache entry: the store's statement that it wrote the entry's manifest, for
a Trace that had passed ``Trace.check()``, so that a hit on it need not check the Trace again.

A seal is an xxh3-128 of the manifest's exact bytes, in a file of its own. The manifest holds
every table's size and xxh3-64, which every hit verifies, so a valid seal vouches for each byte
the hit loads. A manifest written by anything but the store (a hand edit, another tool, code
that recomputed the tables' checksums) leaves the seal stale, and its entry is checked like a
fresh read. The seal tells the store's own entries from other writers'; like the checksums it
is no defence against someone who forges entries on purpose, who could as well write a Trace
that keeps every invariant and is wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import xxhash

from tracewhy.cache_place import META_FILE, open_regular

SEAL_FILE: Final = "seal"
#: Says what was sealed: a hash of the manifest alone is not a seal.
_DOMAIN: Final = b"tracewhy: the store wrote this manifest for a checked Trace\0"


def seal(manifest_bytes: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(_DOMAIN + manifest_bytes)


def write_seal(entry_dir: Path, manifest_bytes: bytes) -> None:
    """Seal the manifest being stored in ``entry_dir`` (not yet renamed into place)."""
    (entry_dir / SEAL_FILE).write_text(seal(manifest_bytes))


def sealed_manifest(entry: Path) -> bytes | None:
    """The exact bytes of the entry's manifest if its seal is valid, else None (no seal, or a
    manifest the store did not write). Never raises."""
    try:
        with open_regular(entry / META_FILE) as f:
            manifest_bytes = f.read()
        with open_regular(entry / SEAL_FILE) as f:
            stored = f.read(64).decode("ascii")
    except (OSError, UnicodeDecodeError):
        return None
    return manifest_bytes if stored == seal(manifest_bytes) else None
