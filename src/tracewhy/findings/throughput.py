"""Throughput in words: "24.5 FPS at the median step", "throughput 24.5 -> 9.6 FPS (-61%)", and
the rate ``check --min-throughput`` gates on (items over the median steady step time)."""

from __future__ import annotations

from tracewhy.analyses.throughput import Throughput


def rate_label(unit: str) -> str:
    """frames/s is FPS; every other unit reads ``<unit>/s``."""
    return "FPS" if unit == "frames" else f"{unit}/s"


def fmt_rate(per_s: float) -> str:
    """Three significant figures or whole numbers: 9.6, 24.5, 1,234."""
    if per_s >= 100:
        return f"{per_s:,.0f}"
    if per_s >= 1:
        return f"{per_s:.1f}"
    return f"{per_s:.2g}"


def gated_rate(t: Throughput) -> float:
    """What ``--min-throughput`` holds against its limit: the rate at the median step time."""
    return t.p50_per_s


def statement(t: Throughput) -> str:
    return f"throughput {describe(t)}"


def describe(t: Throughput) -> str:
    """The rates and what they rest on: "24.5 FPS at the median step (22.1 FPS at the p90 step, ...)"."""
    label = rate_label(t.unit)
    return (f"{fmt_rate(t.p50_per_s)} {label} at the median {t.per} "
            f"({fmt_rate(t.p90_per_s)} {label} at the p90 {t.per}, {fmt_rate(t.mean_per_s)} {label} mean; "
            f"{t.items_per_step:g} {t.unit} per {t.per}, {t.count} steady {t.per}s)")


def relative_change(a: Throughput, b: Throughput) -> float:
    """B's median-step rate against A's: -0.61 is 61% fewer items per second."""
    return b.p50_per_s / a.p50_per_s - 1.0


def change(a: Throughput, b: Throughput) -> str:
    return (f"throughput {fmt_rate(a.p50_per_s)} -> {fmt_rate(b.p50_per_s)} {rate_label(a.unit)} "
            f"({100 * relative_change(a, b):+.0f}%) at the median {a.per}")
