"""Human formatting of durations, sizes and shares: for statements (findings) and tables (renderers)."""

from __future__ import annotations

import re

from rich.markup import escape


def fmt_ns(ns: float | int | None) -> str:
    if ns is None:
        return "-"
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if a >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def fmt_pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """A trace string made safe for a terminal: control characters (ESC sequences, bidi
    overrides, newlines) shown as escapes instead of being acted on."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def shorten(name: str, width: int = 80) -> str:
    """A trace string for a rich table cell: printable, markup-escaped, and cut to ``width``
    so that a long templated kernel name stays readable."""
    name = printable(name)
    name = name if len(name) <= width else name[: width - 1] + "…"
    return escape(name)
