"""Human formatting of durations, sizes and shares: for statements (findings) and tables (renderers)."""

from __future__ import annotations


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


def shorten(name: str, width: int = 80) -> str:
    """Keep a long (templated) kernel name readable in a table."""
    return name if len(name) <= width else name[: width - 1] + "…"
