"""Limits every reader applies the same way before it builds anything: integers within int64,
JSON nesting within a depth, objects within a budget set by the file's size, and files opened
as regular files only (a pipe, device or socket is refused after opening, without blocking).

Readers adopt these so that a hostile input gets the same one-line TraceError, or the same
clamp-with-a-warning, whichever reader meets it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, BinaryIO, Final, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from tracewhy.errors import TraceError

INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1
#: A msgspec field type for an integer the tables hold as int64: a value outside is a
#: DecodeError naming the field (msgspec otherwise decodes any size into a Python int, and
#: polars or numpy then fail with an OverflowError far from the file).
Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
#: The same, for a count, a time since the epoch or an index that cannot be negative.
NonNegativeInt64 = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]


def fits_int64(value: int) -> bool:
    """Whether ``value`` is a whole number an int64 column can hold."""
    return INT64_MIN <= value <= INT64_MAX


def refuse_outside_int64(path: str | Path, what: str, value: int) -> int:
    """``value`` unchanged, or a TraceError naming the file and the field when int64 cannot hold it."""
    if not fits_int64(value):
        raise TraceError(path, f"{what} {value} is outside the 64-bit integers a trace can hold")
    return value


def clamp_to_int64(value: int, what: str, warnings: list[str]) -> int:
    """``value`` clamped to int64, appending one warning to ``warnings`` when it had to be."""
    if fits_int64(value):
        return value
    clamped = INT64_MAX if value > 0 else INT64_MIN
    warnings.append(f"{what} {value} is outside the 64-bit integers and was read as {clamped}")
    return clamped


class Int64Overflow(ValueError):
    """A sum, product or running total that int64 arithmetic would wrap."""


def checked_cumsum(values: npt.NDArray[np.int64], axis: int = 0) -> npt.NDArray[np.int64]:
    """``np.cumsum`` that raises Int64Overflow instead of wrapping silently.

    Exact: when the largest magnitude times the count might pass int64, the running totals are
    recomputed with Python integers and compared."""
    total = np.cumsum(values, axis=axis, dtype=np.int64)
    if values.size and _might_overflow(values, values.shape[axis]):
        exact = np.cumsum(values.astype(object), axis=axis)
        if any(not fits_int64(int(v)) for v in exact.flat):
            raise Int64Overflow("a running total passes the 64-bit integers")
    return total


def checked_sum(values: npt.NDArray[np.int64], axis: int | None = None) -> npt.NDArray[np.int64]:
    """``np.sum`` that raises Int64Overflow instead of wrapping silently."""
    total = np.sum(values, axis=axis, dtype=np.int64)
    count = values.size if axis is None else values.shape[axis]
    if values.size and _might_overflow(values, count):
        exact = np.sum(values.astype(object), axis=axis)
        if any(not fits_int64(int(v)) for v in np.atleast_1d(exact).flat):
            raise Int64Overflow("a sum passes the 64-bit integers")
    return np.asarray(total, dtype=np.int64)


def checked_multiply(values: npt.NDArray[np.int64], factor: int) -> npt.NDArray[np.int64]:
    """``values * factor`` that raises Int64Overflow instead of wrapping (a unit conversion)."""
    if values.size and factor:
        limit = INT64_MAX // abs(factor)
        if int(values.max()) > limit or int(values.min()) < -limit:
            raise Int64Overflow(f"multiplying by {factor} passes the 64-bit integers")
    product: npt.NDArray[np.int64] = values * np.int64(factor)
    return product


def _might_overflow(values: npt.NDArray[np.int64], count: int) -> bool:
    biggest = max(abs(int(values.max())), abs(int(values.min())))
    return biggest * max(count, 1) > INT64_MAX


#: JSON nested deeper than this is refused: no format tracewhy reads nests past a dozen levels,
#: and msgspec's decoders recurse once a level (a RecursionError, not a DecodeError, past ~1000).
MAX_JSON_DEPTH: Final = 64


_Decoded = TypeVar("_Decoded")


def bad_utf8(e: BaseException) -> bool:
    """Whether a decode failed on bytes that are not UTF-8: Python's UnicodeDecodeError, which
    msgspec let through before 0.23, or msgspec's own DecodeError saying so (0.23 and later; a
    ValidationError, its subclass, is never this)."""
    return isinstance(e, UnicodeDecodeError) or (type(e) is msgspec.DecodeError and "UTF-8" in str(e))


def decode_json_bounded(decoder: msgspec.json.Decoder[_Decoded], buf: bytes | bytearray | memoryview,
                        path: str | Path) -> _Decoded:
    """``decoder.decode(buf)`` with nesting past Python's recursion limit and invalid UTF-8 as a
    one-line TraceError; a msgspec DecodeError is left to the caller (it knows the format)."""
    try:
        return decoder.decode(buf)
    except RecursionError:
        raise TraceError(path, "JSON nested too deeply to be a trace (thousands of brackets)") from None
    except UnicodeDecodeError as e:
        raise TraceError(path, f"not UTF-8 text (byte {e.start})") from None
    except msgspec.DecodeError as e:
        if bad_utf8(e):
            raise TraceError(path, "not UTF-8 text") from None
        raise


def object_budget(size_bytes: int, min_bytes_per_object: int) -> int:
    """The most objects a file of ``size_bytes`` can honestly describe when each takes at least
    ``min_bytes_per_object`` bytes: what a reader may build before it refuses the file."""
    return size_bytes // max(1, min_bytes_per_object) + 1


def refuse_over_budget(path: str | Path, count: int, budget: int, what: str) -> None:
    """A TraceError when ``count`` objects exceed ``budget`` (see ``object_budget``)."""
    if count > budget:
        raise TraceError(path, f"{count} {what} is more than a file of this size can hold ({budget}): refusing")


@contextmanager
def open_regular(path: str | Path) -> Iterator[tuple[BinaryIO, int]]:
    """Open ``path`` for reading and yield the file and its size, read from the open file.

    Opened without blocking (a FIFO would otherwise wait for a writer forever) and refused unless
    it is a regular file: a device such as /dev/zero reports size 0 and never ends. A symlink is
    followed; what it points to is what is checked."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TraceError(path, "not a regular file (a pipe, socket or device): save it to a file first")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f, info.st_size


def read_regular_bytes(path: str | Path, max_bytes: int) -> bytes:
    """The whole content of the regular file ``path``, refused past ``max_bytes`` (checked on the
    size read after opening, and again on what is read, for a file that grows meanwhile)."""
    with open_regular(path) as (f, size):
        if size > max_bytes:
            raise TraceError(path, f"{size} bytes is over the {max_bytes} this input may be")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TraceError(path, f"grew past the {max_bytes} bytes this input may be while it was read")
    return data
