"""How large a command's input files are, told before the command imports anything heavy: a
file's content size (a gzip file's from its trailer), and whether every file a command line
names is small (``small_inputs``), so that the command line can size polars' thread pool
before polars starts it (``cli.as_command``).

Standard library only, and outside ``tracewhy.readers`` (whose package imports polars), as
``read_helpers`` is.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Sequence
from typing import Final

#: The first two bytes of a gzip file (RFC 1952), the one copy the package tests files against.
GZIP_MAGIC: Final = b"\x1f\x8b"
#: Up to this many bytes of input in all (gzip counted inflated), a command runs its polars
#: queries on one thread (``POLARS_MAX_THREADS=1``). Such a trace is a few tens of thousands of
#: slices, and a command on it is ~1,000 short queries (~0.1 ms each), each of which wakes the
#: pool's threads for work too small to share: on the 1 MB BERT trace and the 2.3 MB nsys export
#: diagnose, report, export and diff spent 0.04-0.08 s less CPU on one thread, and wall time
#: went down with it; on a 17 MB and a 56 MB Kineto trace diagnose took as long either way.
#: The same bound as ``reports.ranks.IN_PROCESS_MAX_BYTES``: below it a process per file does
#: not pay either.
SMALL_INPUTS_MAX_BYTES: Final = 16 * 10**6


def content_size(path: str | os.PathLike[str]) -> int:
    """The file's size after inflating, from the gzip trailer (mod 4 GiB, so a lower bound) for
    a gzip file; 0 when it cannot be told. Cheap: two small reads, never the content."""
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            if f.read(2) != GZIP_MAGIC:
                return size
            if size < 18:
                return 0
            f.seek(size - 4)
            (hint,) = struct.unpack("<I", f.read(4))
    except OSError:
        return 0
    return max(int(hint), size)


def small_inputs(args: Sequence[str], max_bytes: int = SMALL_INPUTS_MAX_BYTES) -> bool:
    """Whether the words of a command line that name existing paths name at least one regular
    file, only regular files, and at most ``max_bytes`` of content in all. A directory (``ranks
    DIR``, ``--logs DIR``), a pipe or a device makes it False: their size is not told by a stat.
    An existing output file (``-o``) counts as an input: a guess made before the command line
    is parsed, which at worst keeps polars' default pool."""
    files = total = 0
    for arg in args:
        if arg.startswith("-"):
            continue
        try:
            mode = os.stat(arg).st_mode
        except (OSError, ValueError):  # not a path (a SQL query, a step name), or one that is not there
            continue
        if not stat.S_ISREG(mode):
            return False
        files += 1
        total += content_size(arg)
        if total > max_bytes:
            return False
    return files > 0
