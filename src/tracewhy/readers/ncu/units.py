"""Numbers and units as Nsight Compute prints them, turned into base units.

ncu prints values auto-scaled by default (``--print-units auto``): the same metric arrives as
``usecond`` from one export and ``ns`` from another, ``Gbyte/second`` or ``Tbyte/s``, ``cycle/
nsecond`` (ncu <= 2022) or ``Ghz`` (ncu >= 2023). Values follow the host locale when printed
("134,221,568" in the 2026.2 CSVs here; "1.234,5" on a German host). Everything is converted
once, here, so no analysis ever sees a scaled value.
"""

from __future__ import annotations

import math
import re
from typing import Final

#: Dimensions a normalized value can have.
TIME: Final = "time"  # ns
FREQ: Final = "freq"  # Hz
BYTES: Final = "bytes"
RATE: Final = "rate"  # bytes per second
PCT: Final = "pct"
PER_CYCLE: Final = "per_cycle"  # anything per cycle (inst/cycle, byte/cycle, ...)
COUNT: Final = "count"  # cycles, instructions, sectors, blocks, warps, unitless
#: A unit this module does not know: fine for a count, never taken for a time, rate or size.
UNKNOWN: Final = "unknown"

# Prefixes are read as SI (1 Kbyte = 1000 byte), the convention of NVIDIA's bandwidth figures;
# the .ncu-rep files here store base units, so only auto-scaled CSVs depend on this choice.
# IEC forms (KiB, Mibyte) are accepted too.
_PREFIX: Final = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_IEC: Final = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
#: Time units (ncu <= 2022 spells "nsecond", later "ns") in nanoseconds.
_TIME_NS: Final = {
    "nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "µs": 1e3, "msecond": 1e6, "ms": 1e6,
    "second": 1e9, "s": 1e9, "sec": 1e9,
}
_BYTE_WORDS: Final = ("byte", "B")
_COUNT_WORDS: Final = (
    "cycle", "inst", "sector", "request", "warp", "thread", "block", "register", "branches",
    "pass", "SM", "sample", "cluster", "wavefront", "transaction", "instruction",
)


def _scaled(word: str, bases: tuple[str, ...]) -> float | None:
    """The scale of ``word`` if it is one of ``bases`` with an optional prefix, else None."""
    for base in bases:
        if word == base:
            return 1.0
        if word.endswith(base) and len(word) > len(base):
            prefix = word[: -len(base)]
            if prefix in _IEC:
                return _IEC[prefix]
            if prefix in _PREFIX:
                return _PREFIX[prefix]
            if prefix.endswith("i") and prefix[:-1] in _PREFIX:  # "KiB" written "Kibyte"
                return 2.0 ** (10 * (" KMGTP".index(prefix[0].upper())))
    return None


def normalize(value: float, unit: str) -> tuple[float, str]:
    """``value`` in ``unit`` as (value in base units, dimension).

    Unknown units keep their value with dimension UNKNOWN: a count with an odd unit name is
    still a count, but a duration in "fortnight" read as ns would be a silent lie.
    """
    u = unit.strip()
    if not u:
        return value, COUNT
    if u == "%":
        return value, PCT
    if u in _TIME_NS:
        return value * _TIME_NS[u], TIME
    low = u.lower()
    if low.endswith("hz"):
        scale = _PREFIX.get(u[: -2].upper() if u[:-2] else "", None)
        if scale is not None:
            return value * scale, FREQ
    if "/" in u:
        num, _, den = u.partition("/")
        num, den = num.strip(), den.strip()
        if den in _TIME_NS:
            per_s = 1e9 / _TIME_NS[den]  # "x per <den>" -> "x per second"
            byte_scale = _scaled(num, _BYTE_WORDS)
            if byte_scale is not None:
                return value * byte_scale * per_s, RATE
            cycle_scale = _scaled(num, ("cycle",))
            if cycle_scale is not None:
                return value * cycle_scale * per_s, FREQ
            return value * per_s, COUNT
        if den == "cycle":
            scale = _scaled(num, _BYTE_WORDS + _COUNT_WORDS)
            return value * (scale or 1.0), PER_CYCLE
        byte_scale = _scaled(num, _BYTE_WORDS)
        if byte_scale is not None:  # byte/block, byte/thread: a size
            return value * byte_scale, BYTES
        return value, COUNT
    byte_scale = _scaled(u, _BYTE_WORDS)
    if byte_scale is not None:
        return value * byte_scale, BYTES
    count_scale = _scaled(u, _COUNT_WORDS)
    if count_scale is not None:
        return value * count_scale, COUNT
    return value, UNKNOWN


_MISSING: Final = frozenset({"", "n/a", "na", "-", "--", "none", "null"})
_GROUPED_COMMA: Final = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")
_GROUPED_DOT: Final = re.compile(r"^[+-]?\d{1,3}(\.\d{3})+(,\d+)?$")


def parse_number(text: str) -> float | None:
    """A number as ncu printed it in some locale; None when it is not a number.

    "134,221,568" and "134.221.568" are grouped integers; "3,75" is a decimal comma; spaces,
    no-break and thin spaces and apostrophes are group separators (fr, ch locales). A trailing
    "%" is dropped. "nan", "-nan" (C's printf for a NaN with the sign bit set), "inf" come back
    as float NaN/inf: the caller says what it did with them.
    """
    s = text.strip().strip('"').strip()
    if s.lower() in _MISSING:
        return None
    s = s.rstrip("%").strip()
    for sep in (" ", "\u00a0", "\u202f", "\u2009", "'"):
        s = s.replace(sep, "")
    if "," in s and "." in s:
        # The separator that comes last is the decimal one: "1,234.5" / "1.234,5".
        s = s.replace(".", "").replace(",", ".") if s.rfind(",") > s.rfind(".") else s.replace(",", "")
    elif "," in s:
        s = s.replace(",", "") if _GROUPED_COMMA.match(s) else s.replace(",", ".")
    elif s.count(".") > 1 and _GROUPED_DOT.match(s):
        s = s.replace(".", "")
    try:
        return float(s)
    except ValueError:
        return None


INT64_MAX: Final = 2**63 - 1
_DIGITS: Final = re.compile(r"^[+-]?\d+$")


def parse_whole(text: str) -> tuple[int | None, str | None]:
    """A whole number for an int64 column (IDs, process, stream): (value, None), (None, None)
    when the cell is empty, or (None, problem) for "nan", "-nan", "inf", "1.5" or 20+ digits.

    Plain and grouped integers are parsed exactly (float rounds 2**63 + 1 down into range), so
    a value just past int64 is refused rather than wrapped or rounded.
    """
    s = text.strip().strip('"').strip()
    if s.lower() in _MISSING:
        return None, None
    number = parse_number(s)
    if number is None:
        return None, "not a number"
    if math.isnan(number) or math.isinf(number):
        return None, "nan or inf"
    if number != int(number):
        return None, "not a whole number"
    for sep in (" ", "\u00a0", "\u202f", "\u2009", "'"):
        s = s.replace(sep, "")
    if _GROUPED_COMMA.match(s) or _GROUPED_DOT.match(s):
        s = s.replace(",", "").replace(".", "")
    value = int(s) if _DIGITS.match(s) else int(number)
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        return None, "beyond int64"
    return value, None
