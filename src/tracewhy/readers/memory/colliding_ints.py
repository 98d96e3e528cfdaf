"""Refuses a pickle that spells many integers past int64 sharing one hash, before it is unpickled.

CPython hashes an int to ``n mod (2**61 - 1)`` with no secret key, so 100,000 multiples of
``2**61 - 1`` put into one dict or set make every insertion compare with all before it: the
C unpickler builds that dict (quadratic, minutes) before tracewhy sees any data. Within int64 at
most 9 ints share a hash, so such keys must be spelled with the opcodes that carry integers past
int64: LONG1 or LONG4 with a payload of 9+ bytes, INT or LONG in text of 18+ characters
(``0x8000000000000000``). A torch snapshot holds none: its integers are sizes, addresses, counts
and times.

Every place in the bytes that could start such an opcode is found at C speed (numpy), its
would-be value decoded and hashed. The places include every real opcode (and bytes inside other
payloads that happen to look like one, whose values are random), so when no hash is shared by
more than ``MAX_BIG_INTS_SHARING_A_HASH`` of them, no dict or set in the pickle holds more
colliding big integers.
"""

from __future__ import annotations

import mmap
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import IO, Final

import numpy as np
import numpy.typing as npt

from tracewhy.errors import TraceError
from tracewhy.readers.limits import fits_int64

#: Big integers one hash may be shared by: 1,000 colliding keys (plus the 9 int64 ints and the
#: ~200 floats that can share any one hash) cost under a million comparisons, milliseconds.
MAX_BIG_INTS_SHARING_A_HASH: Final = 1_000
#: Candidates longer than this are not decoded (a LONG4 length read from random payload bytes
#: can name most of the file); more of them than the bound above is refused as well.
MAX_DECODED_BYTES: Final = 4096
#: Bytes compared at a time: the boolean masks of a 100 MB file stay 16 MiB each.
_CHUNK: Final = 16 << 20
_LONG1, _LONG4, _NEWLINE, _LONG_SUFFIX = 0x8A, 0x8B, 0x0A, ord("L")
#: The shortest text of an int past int64 that ``int(text, 0)`` reads: ``0x8000000000000000``.
_MIN_TEXT_CHARS: Final = 18
#: Characters ``int(text, 0)`` accepts in the argument of INT and LONG: digits of bases 2-16,
#: base prefixes, sign, underscores and surrounding whitespace.
_TEXT_INT_CHARS: Final = np.zeros(256, dtype=bool)
_TEXT_INT_CHARS[list(b"0123456789abcdefABCDEFxXoO_+- \t\r\x0b\x0c")] = True


def refuse_colliding_big_ints(path: Path, stream: IO[bytes]) -> None:
    """A TraceError when more than ``MAX_BIG_INTS_SHARING_A_HASH`` integers past int64 in the
    pickle ``stream`` (a file or a BytesIO, left at its position) could share one hash."""
    with _bytes_of(stream) as data:
        values, undecoded = _big_ints(data)
    most = max(_distinct_per_hash(values), default=0)
    if most > MAX_BIG_INTS_SHARING_A_HASH or undecoded > MAX_BIG_INTS_SHARING_A_HASH:
        raise TraceError(path, f"refused as a memory snapshot: {max(most, undecoded)} integers past 64 bits "
                               "could share one hash, and a dict or set of them takes quadratic time to build "
                               "(a torch snapshot holds none)")


@contextmanager
def _bytes_of(stream: IO[bytes]) -> Iterator[bytes | mmap.mmap | memoryview]:
    """The whole pickle without a copy: the BytesIO's bytes (``getvalue`` shares the bytes it
    was made from; ``getbuffer`` would copy them into an exported bytearray), or the file mapped
    read-only."""
    getvalue = getattr(stream, "getvalue", None)
    if getvalue is not None:
        yield getvalue()  # the bytes it was made from, shared while nothing writes to it
        return
    try:
        mapped = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:  # an empty file cannot be mapped
        yield b""
        return
    with mapped:
        yield mapped


def _distinct_per_hash(values: list[int]) -> Iterator[int]:
    """How many distinct values share each hash that more than the bound share. One value
    written many times is one key and costs no collisions; distinct ones are counted by sorting,
    never by putting them into a set, which would be the quadratic build itself."""
    by_hash = Counter(map(hash, values))  # (keys are hashes: ints below 2**61, each its own hash)
    for shared, count in by_hash.items():
        if count > MAX_BIG_INTS_SHARING_A_HASH:
            same = sorted(v for v in values if hash(v) == shared)
            yield 1 + sum(a != b for a, b in pairwise(same))


def _big_ints(data: bytes | mmap.mmap | memoryview) -> tuple[list[int], int]:
    """Every integer past int64 that a LONG1, LONG4, INT or LONG opcode could start at some byte
    of ``data``, and how many candidates were too long to decode."""
    arr = np.frombuffer(data, dtype=np.uint8)
    values: list[int] = []
    undecoded = 0
    for p, length in _long1_candidates(arr) + _long4_candidates(arr):
        if length > MAX_DECODED_BYTES:
            undecoded += 1
            continue
        value = int.from_bytes(data[p:p + length], "little", signed=True)
        if not fits_int64(value):
            values.append(value)
    for start, end in _text_candidates(arr):
        try:
            value = int(bytes(data[start:end]).decode("ascii"), 0)
        except ValueError:
            continue
        if not fits_int64(value):
            values.append(value)
    del arr  # (the mapping is closed next: no array may still point into it)
    return values, undecoded


def _positions(arr: npt.NDArray[np.uint8], byte: int) -> npt.NDArray[np.int64]:
    return np.concatenate([np.flatnonzero(arr[i:i + _CHUNK] == byte) + i for i in range(0, arr.size, _CHUNK)]
                          or [np.zeros(0, dtype=np.int64)]).astype(np.int64)


def _long1_candidates(arr: npt.NDArray[np.uint8]) -> list[tuple[int, int]]:
    """(payload start, length) of each LONG1 a byte could start with a 9+ byte payload."""
    at = _positions(arr, _LONG1)
    at = at[at + 1 < arr.size]
    length = arr[at + 1].astype(np.int64)
    keep = (length >= 9) & (at + 2 + length <= arr.size)
    return list(zip((at[keep] + 2).tolist(), length[keep].tolist(), strict=True))


def _long4_candidates(arr: npt.NDArray[np.uint8]) -> list[tuple[int, int]]:
    """(payload start, length) of each LONG4 a byte could start with a 9+ byte payload that the
    file holds (the length is a signed 32-bit count)."""
    at = _positions(arr, _LONG4)
    at = at[at + 5 <= arr.size]
    length = sum(arr[at + 1 + i].astype(np.int64) << (8 * i) for i in range(4))
    keep = (length >= 9) & (length < 2**31) & (at + 5 + length <= arr.size)
    return list(zip((at[keep] + 5).tolist(), np.asarray(length)[keep].tolist(), strict=True))


def _text_candidates(arr: npt.NDArray[np.uint8]) -> list[tuple[int, int]]:
    """(start, end) of the argument of each INT or LONG in text a newline could end whose text is
    long enough for an int past int64. An argument runs back from its newline (past a LONG's
    trailing ``L``) over characters ``int`` accepts; its opcode byte (``I`` or ``L``) is not one
    of them, so the run stops there."""
    allowed = _TEXT_INT_CHARS.copy()
    allowed[_LONG_SUFFIX] = True
    ends = _positions(arr, _NEWLINE)
    ends = ends[ends >= _MIN_TEXT_CHARS]
    window = arr[ends[:, None] - np.arange(1, _MIN_TEXT_CHARS + 1)]
    ends = ends[allowed[window].all(axis=1)].tolist()
    out: list[tuple[int, int]] = []
    for end in ends:
        stop = end - 1 if arr[end - 1] == _LONG_SUFFIX else end
        start = stop
        while start > 0 and _TEXT_INT_CHARS[arr[start - 1]]:
            start -= 1
        out.append((start, stop))
    return out
