"""Getting a file's bytes safely (size-bounded gzip, refusing pipes and devices), and the small helpers
every format's sniff uses to tell a file by its content."""

from __future__ import annotations

import contextlib
import gzip
import os
import stat
import struct
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tracewhy.errors import TraceError
from tracewhy.input_size import GZIP_MAGIC as GZIP_MAGIC  # (the readers' names for them)
from tracewhy.input_size import content_size as content_size

_inflater: types.ModuleType
try:  # ISA-L inflates gzip twice as fast as zlib (33 ms against 70 ms for a 56 MB trace)
    from isal import isal_zlib as _inflater
except ImportError:  # pragma: no cover - a platform without its wheels: the standard library's zlib
    _inflater = zlib
_INFLATE_ERRORS: tuple[type[Exception], ...] = (zlib.error, getattr(_inflater, "error", zlib.error))

#: Refuse to inflate beyond this many bytes: a gzip bomb must not exhaust memory. A 1 GB
#: compressed Kineto trace inflates to ~20 GB at most (JSON compresses ~15-30x).
DEFAULT_MAX_INFLATED_BYTES = 64 * 1024**3
#: With the default limit, a gzip file is also refused once it inflates past this many times
#: its compressed size (and past ``_BOMB_FLOOR``): JSON traces reach ~30x (the real ones here
#: 5-30x); 2 GB of white space compresses 1000-fold, and the reader would hold runs of it.
_MAX_RATIO = 200
_BOMB_FLOOR = 256 * 1024**2
_CHUNK = 16 * 1024 * 1024
#: Compressed bytes read at a time: JSON inflates 10-30x, so 1 MB in is already a piece out.
_GZ_READ = 1024 * 1024


def os_error(path: Path, e: OSError) -> TraceError:
    """The one-line TraceError for a file that cannot be opened or read."""
    if isinstance(e, FileNotFoundError):
        return TraceError(path, "no such file")
    if isinstance(e, IsADirectoryError):
        return TraceError(path, "is a directory, expected a trace file")
    if isinstance(e, PermissionError):
        return TraceError(path, "permission denied")
    return TraceError(path, f"cannot read: {e.strerror or e}")


def refuse_special(path: Path) -> None:
    """A TraceError for a pipe, socket or device: reading one blocks until a writer comes (a
    FIFO hung every command) and it cannot be read twice, as sniffing and reading need. Paths
    that do not exist or are directories are left to the caller's own message."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise TraceError(path, "not a regular file (a pipe, socket or device): save the trace to a file first")


def read_bytes(path: Path, max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES) -> bytes | bytearray:
    """Return the file's content, inflated if it is gzip; the file is only ever read."""
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            head = f.read(2)
            if head != GZIP_MAGIC:
                # Read into a buffer of the final size: f.read() grows its buffer as it goes and
                # briefly holds a large file twice.
                f.seek(0)
                out = bytearray(size)
                got = f.readinto(out)
                del out[got:]
                return out
            return _inflate(f, path, size, max_inflated_bytes)
    except OSError as e:
        raise os_error(path, e) from None


def is_gzip(path: Path) -> bool:
    """Whether the file starts as gzip does (False when it cannot be read: the reader says why)."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == GZIP_MAGIC
    except OSError:
        return False


def _inflate(f: BinaryIO, path: Path, size: int, limit: int) -> bytearray:
    """Inflate a (possibly multi-member) gzip stream into one preallocated buffer.

    The gzip trailer's ISIZE (size mod 2**32) sizes the buffer so that a large trace is
    not held twice in memory while it is inflated.
    """
    hint = 0
    if size >= 18:
        f.seek(size - 4)
        (hint,) = struct.unpack("<I", f.read(4))
    f.seek(0)
    out = bytearray()
    if hint:
        # ISIZE wraps at 4 GiB; the true size is hint + k * 2**32 for the smallest k that fits
        # the compression ratios JSON reaches.
        guess = hint
        while guess < size:
            guess += 1 << 32
        # The trailer of a cut-off file is compressed data, not a size: never trust it past
        # what JSON's compression ratios allow (a 1.4 KB cut file once asked for 4 GB).
        out = bytearray(min(guess, limit, 64 * size + (1 << 20)))
    used = 0
    for piece in _inflated(f, path, limit):
        used = _append(out, used, piece, path, limit)
    del out[used:]
    return out


def _inflated(f: BinaryIO, path: Path, limit: int, out: int = _CHUNK,
              ended: list[bool] | None = None) -> Iterator[bytes]:
    """The inflated bytes of a (possibly multi-member) gzip stream, at most ``out`` bytes a
    piece; a stream cut short yields what it held (the JSON reader then decides), one over
    ``limit`` is refused. ``ended``, if given, is told whether the stream ended as a gzip
    stream must (False: cut off)."""
    decomp = _inflater.decompressobj(zlib.MAX_WBITS | 16)
    total = 0
    bomb = False
    if limit == DEFAULT_MAX_INFLATED_BYTES:
        with contextlib.suppress(OSError, ValueError):
            ratio_cap = max(_BOMB_FLOOR, _MAX_RATIO * os.fstat(f.fileno()).st_size)
            bomb, limit = ratio_cap < limit, min(limit, ratio_cap)
    try:
        while True:
            data = f.read(_GZ_READ)
            if not data:
                break
            while data:
                piece = decomp.decompress(data, max(1, min(out, limit - total + 1)))
                total += len(piece)
                if total > limit:
                    raise TraceError(path, f"inflates to more than {_MAX_RATIO} times its compressed size; refusing "
                                           "it as a likely gzip bomb (JSON traces inflate about 10-30 times)" if bomb
                                     else f"inflates to more than {limit} bytes; refusing (raise the limit if real)")
                if piece:
                    yield piece
                data = decomp.unconsumed_tail
                if decomp.eof:
                    rest = decomp.unused_data
                    if rest.strip(b"\x00"):
                        decomp = _inflater.decompressobj(zlib.MAX_WBITS | 16)
                        data = rest
                    else:
                        data = b""
        tail = decomp.flush()
        if ended is not None:
            ended.append(bool(decomp.eof))
    except _INFLATE_ERRORS as e:
        raise TraceError(path, f"corrupt gzip data ({e})") from None
    except EOFError:
        raise TraceError(path, "gzip stream ends early") from None
    if tail:
        if total + len(tail) > limit:
            raise TraceError(path, f"inflates to more than {limit} bytes; refusing (raise the limit if real)")
        yield tail


def gzip_complete(path: Path) -> bool:
    """Whether a gzip file's stream (every member) ends as a gzip stream must, rather than being
    cut off; inflated and thrown away (the error path of a cut-off or empty-looking trace)."""
    ended: list[bool] = []
    try:
        with open(path, "rb") as f:
            for _ in _inflated(f, path, DEFAULT_MAX_INFLATED_BYTES, 1 << 20, ended):
                pass
    except (OSError, TraceError):
        return False
    return ended == [True]


def iter_content(path: Path, chunk: int = _CHUNK,
                 max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES) -> Iterator[bytes]:
    """The file's content (inflated if it is gzip) in pieces of about ``chunk`` bytes, read as
    they are needed: a large file never has to be in memory whole."""
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == GZIP_MAGIC
            f.seek(0)
            if gz:
                yield from _inflated(f, path, max_inflated_bytes, chunk)
                return
            while data := f.read(chunk):
                yield data
    except OSError as e:
        raise os_error(path, e) from None


def _append(out: bytearray, used: int, piece: bytes, path: Path, limit: int) -> int:
    end = used + len(piece)
    if end > limit:
        raise TraceError(path, f"inflates to more than {limit} bytes; refusing (raise the limit if real)")
    if end > len(out):
        out.extend(b"\x00" * (end - len(out)))
    out[used:end] = piece
    return end


def content_head(path: Path, size: int) -> bytes | None:
    """The first ``size`` bytes of the file's content, inflated when it is gzip; None when it
    cannot be read or its gzip stream is corrupt or cut (a sniff then says "not this format" and
    the reader of the format tried names the problem)."""
    try:
        with open(path, "rb") as f:
            head = f.read(size)
        if not head.startswith(GZIP_MAGIC):
            return head
        with gzip.open(path, "rb") as g:
            return g.read(size)
    except (OSError, EOFError, zlib.error):  # zlib.error: a corrupt deflate stream
        return None


#: Leading white space (and a BOM) is read past up to this much when sniffing; beyond it, and
#: for a file of nothing else, the JSON reader decides (it says "empty", or refuses a bomb).
SNIFF_BLANK_MAX = 64 * 1024 * 1024
#: What may precede JSON's first byte: a UTF-8 BOM and white space.
JSON_BLANK = b"\xef\xbb\xbf \t\r\n"


def sniff_empty(path: Path) -> bool:
    """True when the file holds nothing but white space (the size alone misses "\\n")."""
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 16):
                if block.strip():
                    return False
                if f.tell() > SNIFF_BLANK_MAX:
                    return False  # the reader decides
            return True
    except OSError:
        return False
