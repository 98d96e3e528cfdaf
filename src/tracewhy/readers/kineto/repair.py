"""Repair of Kineto JSON that a strict decode refuses, on the error path only.

A clean file never comes here: the reader decodes strictly first and calls ``repair_json`` only
on the bytes (a piece, or the whole file) that failed. What is repaired is counted under the
keys below, which the reader turns into one warning line each (``repair_warnings``).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Final

#: Keys of the counts of repairs, kept among the reader's problem counts (which count events;
#: these count repaired values, and are worded apart by ``repair_warnings``).
REPAIR_PREFIX: Final = "repair: "
BAD_UTF8: Final = REPAIR_PREFIX + "invalid UTF-8"
LONE_SURROGATE: Final = REPAIR_PREFIX + "lone surrogate"
NON_FINITE: Final = REPAIR_PREFIX + "non-finite"
DEVICE_RANGE: Final = REPAIR_PREFIX + "device value range"
_WARNINGS: Final = {
    BAD_UTF8: "invalid UTF-8 inside strings: {n} byte sequences replaced with U+FFFD",
    LONE_SURROGATE: "unpaired UTF-16 surrogate escapes (such as \\ud800): {n} replaced with U+FFFD",
    NON_FINITE: "bare NaN/Infinity (not JSON; PyTorch 1.8-era Kineto wrote them): {n} values read as non-finite",
    DEVICE_RANGE: "deviceProperties: {n} values beyond their column's integers (such as an id past int64) read as "
                  "unknown",
}

_BOM: Final = b"\xef\xbb\xbf"
_REPLACEMENT: Final = "\ufffd".encode()
#: An escaped backslash (skipped, so that ``\\ud800`` is not taken for an escape), a valid
#: surrogate pair (kept), or a lone surrogate escape (replaced).
_SURROGATE: Final = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})")
#: Bare non-finite numbers as writers spelled them: Kineto's C++ streams wrote ``inf``/``nan``
#: (pytorch/kineto#105: "memory bandwidth (GB/s)": inf for a zero-length Memcpy, PyTorch 1.8,
#: March 2021); Python's json module writes ``NaN``/``Infinity``. Found by their first three
#: letters (a plain search, 30 ms for 50 MB; a regular expression took seconds), then checked.
_NON_FINITE_STARTS: Final = (b"NaN", b"nan", b"Inf", b"inf")
_NON_FINITE: Final = re.compile(rb"(?:NaN|nan|Infinity|inf)(?![\w\"])")
_BEFORE_VALUE: Final = re.compile(rb"[:,\[]\s*-?\Z")
_AFTER_VALUE: Final = re.compile(rb"\s*[,\]}]")
#: An escaped character or a quote: the quotes not escaped tell whether a place is in a string.
_QUOTE_OR_ESCAPE: Final = re.compile(rb'\\.|"')
#: What a quoted non-finite value reads as; only these are retried with a non-strict decoder.
NON_FINITE_MARKS: Final = (b'"NaN"', b'"Infinity"', b'"-Infinity"')


@dataclass
class Repaired:
    """The repaired bytes and what was repaired (empty when nothing could be)."""

    data: bytes
    counts: dict[str, int] = field(default_factory=dict)


def repair_json(data: bytes | bytearray | memoryview) -> Repaired:
    """``data`` with what a strict JSON decode refuses but a Kineto file can hold made decodable:
    a leading UTF-8 BOM becomes white space (Windows tools write one; nothing is counted),
    invalid UTF-8 and lone surrogate escapes become U+FFFD, and bare NaN/Infinity/inf become
    the strings "NaN"/"Infinity"/"-Infinity", which a non-strict decoder reads as floats."""
    raw = bytes(data)
    counts: dict[str, int] = {}
    raw = _strip_bom(raw)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        before = raw.count(_REPLACEMENT)
        raw = raw.decode("utf-8", "replace").encode()
        counts[BAD_UTF8] = raw.count(_REPLACEMENT) - before
    if b"\\u" in raw and (b"\\ud" in raw or b"\\uD" in raw):
        lone = 0

        def _surrogate(m: re.Match[bytes]) -> bytes:
            nonlocal lone
            if m.group(1) is None:
                return m.group()
            lone += 1
            return b"\\ufffd"

        raw = _SURROGATE.sub(_surrogate, raw)
        if lone:
            counts[LONE_SURROGATE] = lone
    spans = non_finite_values(raw)
    if spans:
        parts, last = [], 0
        for start, end in spans:
            word = raw[start:end]
            parts += [raw[last:start], b'"NaN"' if word.lstrip(b"-").lower() == b"nan"
                      else b'"-Infinity"' if word[:1] == b"-" else b'"Infinity"']
            last = end
        raw = b"".join([*parts, raw[last:]])
        counts[NON_FINITE] = len(spans)
    return Repaired(raw, counts)


def non_finite_values(raw: bytes | bytearray) -> list[tuple[int, int]]:
    """Where bare non-finite numbers (``NaN``, ``-Infinity``, ``inf``...) stand as values: after
    ``:``, ``,`` or ``[``, before ``,``, ``]`` or ``}``, and not inside a string."""
    found: list[tuple[int, int]] = []
    for prefix in _NON_FINITE_STARTS:
        at = raw.find(prefix)
        while at >= 0:
            m = _NON_FINITE.match(raw, at)
            if m is not None and _AFTER_VALUE.match(raw, m.end()):
                before = _BEFORE_VALUE.search(raw, max(0, at - 64), at)
                if before is not None:
                    found.append((at - 1 if raw[at - 1 : at] == b"-" else at, m.end()))
            at = raw.find(prefix, at + 1)
    found.sort()
    # Outside a string, the quotes before a place that are not escaped are even in number. A
    # new line is never inside a string (JSON escapes it), so each is counted from the line's
    # start, or from the last place counted on the same line.
    outside: list[tuple[int, int]] = []
    mark, inside = 0, False
    for start, end in found:
        line = raw.rfind(b"\n", mark, start) + 1
        if line > 0:
            mark, inside = line, False
        quotes = _QUOTE_OR_ESCAPE.findall(raw, mark, start).count(b'"')
        mark, inside = start, inside != (quotes % 2 == 1)
        if not inside:
            outside.append((start, end))
    return outside


def _strip_bom(raw: bytes) -> bytes:
    """A BOM among the leading white space becomes three spaces (positions stay as they were)."""
    lead = len(raw) - len(raw.lstrip(b" \t\r\n\xef\xbb\xbf"))
    if _BOM not in raw[:lead] or raw[:lead].replace(_BOM, b"").strip(b" \t\r\n"):
        return raw
    return raw[:lead].replace(_BOM, b"   ") + raw[lead:]


def has_non_finite_mark(raw: bytes | bytearray | memoryview) -> bool:
    """Whether these bytes hold a value ``repair_json`` quoted (the only case in which a value
    that fails a strict decode is worth a non-strict one)."""
    data = bytes(raw)
    return any(mark in data for mark in NON_FINITE_MARKS)


def merge_counts(into: dict[str, int], counts: dict[str, int]) -> None:
    for key, n in counts.items():
        if n:
            into[key] = into.get(key, 0) + n


def repair_warnings(problems: dict[str, int]) -> list[str]:
    """One warning line per kind of repair among the reader's problem counts."""
    return [_WARNINGS[key].format(n=problems[key]) for key in _WARNINGS if problems.get(key)]


def too_deep() -> str:
    """The problem text for a file nested deeper than the decoder goes (msgspec recurses once
    per level, up to Python's recursion limit; Kineto itself nests fewer than ten levels)."""
    return (f"JSON nested deeper than the decoder allows (about {sys.getrecursionlimit()} levels; Kineto "
            "writes fewer than ten): not a trace this reader accepts")
