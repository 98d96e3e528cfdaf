"""The helper processes that decode a large Kineto file on a second core
(``readers/kineto/parallel``): how many processes a file gets (``worker_count``), how a helper
is started (``spawn``), and a helper started before the command's own imports (``start_early``).

Standard library only, and outside ``tracewhy.readers`` (whose package imports polars), so that
the command line can call ``start_early`` first thing. A helper is a fresh interpreter that
spends 0.3-0.4 s of CPU on its imports before it can decode; the command spends about as long on
its own imports before it reads. Started early, the helper imports on the second core while the
command imports on the first, and is ready when the first batch is. The reader takes it
(``spawn``); one that no read takes is stopped when the command ends.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import stat
import sys
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from tracewhy.cache_place import trusted_entry_exists
from tracewhy.input_size import GZIP_MAGIC

if TYPE_CHECKING:
    import subprocess

#: Below this many (uncompressed) bytes a helper's start-up (an interpreter and its imports,
#: about 0.4 s of CPU) costs more than it saves.
PARALLEL_MIN_BYTES: Final = 256 * 1024 * 1024
#: ``TRACEWHY_READ_WORKERS=N``: N processes decode (1: no helpers), whatever the file's size.
ENV_WORKERS: Final = "TRACEWHY_READ_WORKERS"
#: Set in a helper's environment: a helper never starts helpers of its own, and a process pool
#: worker (``tracewhy ranks``) can set it to keep to one core per file.
ENV_IN_HELPER: Final = "TRACEWHY_READ_HELPER"
#: Default ceiling on processes: each helper holds about 200 MB, and the memory target is twice
#: the file in all.
DEFAULT_MAX_WORKERS: Final = 2
#: What a helper runs. Not ``-m`` the parallel module: the package imports it before ``-m``
#: would run it, and it would then be loaded twice.
_SERVE: Final = "from tracewhy.readers.kineto.parallel import serve; serve()"

#: The helper started early, until a read takes it.
_early: list[subprocess.Popen[bytes]] = []


def worker_count(nbytes: int, requested: int | None = None) -> int:
    """How many processes should decode a file of ``nbytes`` (1 means this one alone).

    ``requested`` (or ``$TRACEWHY_READ_WORKERS``) wins; otherwise two for a large file when two
    CPUs are ours to use and this process is not itself a helper.
    """
    if requested is None:
        env = os.environ.get(ENV_WORKERS, "").strip()
        if env.isdigit():
            requested = int(env)
    if requested is not None:
        return max(1, requested)
    if nbytes < PARALLEL_MIN_BYTES or os.environ.get(ENV_IN_HELPER):
        return 1
    # A pool worker (``tracewhy ranks`` reads a file per process): its cores are spoken for. Such a
    # process has imported multiprocessing; looked up, not imported, to keep the command's start light.
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.parent_process() is not None:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, DEFAULT_MAX_WORKERS))


def spawn() -> subprocess.Popen[bytes]:
    """A helper process: the one started early if it is still waiting, else a new one. Raises
    OSError when no process can be started."""
    while _early:
        proc = _early.pop()
        if proc.poll() is None:
            return proc
    return _new()


def _new() -> subprocess.Popen[bytes]:
    import subprocess  # (only where a helper is started: not part of every command's start)

    return subprocess.Popen(
        [sys.executable, "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=dict(os.environ, **{ENV_IN_HELPER: "1"}),
    )


def start_early(args: Sequence[str]) -> None:
    """Start a helper now if one of ``args`` (a command line) names a JSON file, plain or gzip,
    large enough that reading it will want one (``worker_count``), unless the parse cache holds
    an entry the file's identity vouches for (``cache_place.trusted_entry_exists``) and the
    command line does not turn the cache off. Only a guess made before the command is known: a
    helper that no read takes costs the second core its imports (0.3 CPU s beside a 1 GB
    trace's cache hit, which takes about 0.7 CPU s in all)."""
    if _early:
        return
    for arg in args:
        size = _json_content_size(arg)
        if size is not None and size >= PARALLEL_MIN_BYTES and worker_count(size) > 1:
            if "--no-cache" not in args and trusted_entry_exists(arg):
                return  # most likely served from the parse cache: no decoding for a helper to share
            with contextlib.suppress(OSError):  # cannot start processes here: the reader says so later
                _early.append(_new())
                atexit.register(_stop_early)
            return


def _json_content_size(arg: str) -> int | None:
    """The content size of the regular file ``arg`` names if its content starts as a JSON object
    (after white space or a BOM); a gzip file's as its trailer gives it (modulo 4 GiB)."""
    try:
        if arg.startswith("-") or not stat.S_ISREG(os.stat(arg).st_mode):
            return None
        with open(arg, "rb") as f:
            head = f.read(4096)
            if head[:2] != GZIP_MAGIC:
                return _if_object(head, os.fstat(f.fileno()).st_size)
            f.seek(-4, os.SEEK_END)
            size = int.from_bytes(f.read(4), "little")
        return _if_object(zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 64), size)
    except (OSError, ValueError, zlib.error):
        return None


def _if_object(head: bytes, size: int) -> int | None:
    return size if head.lstrip(b" \t\r\n").removeprefix(b"\xef\xbb\xbf").lstrip()[:1] == b"{" else None


def _stop_early() -> None:
    """Stop a helper started early that no read took (it is still importing, or waiting for work)."""
    while _early:
        end(_early.pop())


def end(proc: subprocess.Popen[bytes]) -> None:
    """End a helper process, of this module or another: its pipes closed (a helper ends when its
    input does) and, if it is still at work on something nobody will read, killed."""
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    if proc.poll() is None:
        proc.kill()
    proc.wait()
