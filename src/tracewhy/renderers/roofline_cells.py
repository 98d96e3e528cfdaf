"""How roofline figures read in a table cell (``roofline`` on ncu reports and on shapes, and
``kernels --ncu``): rates with their SI prefix, percentages and shares, the bound coloured, and
names stripped of control characters (kernel names come from files made by others)."""

from __future__ import annotations

import math
import unicodedata
from typing import TYPE_CHECKING

from tracewhy.findings.roofline import COMPUTE_BOUND, LATENCY_BOUND, MEMORY_BOUND, UNKNOWN
from tracewhy.units import fmt_pct

if TYPE_CHECKING:
    from rich.text import Text


#: The colour of each bound in tables.
BOUND_STYLE = {MEMORY_BOUND: "cyan", COMPUTE_BOUND: "magenta", LATENCY_BOUND: "yellow", UNKNOWN: "dim"}


def rate_cell(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def pct_cell(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.0f}%"


def share_cell(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else fmt_pct(value)


def plain(value: object) -> str:
    """Text from a report or trace with control and bidi-format characters removed: a kernel name
    must never move the cursor, recolour the terminal or reverse the line (files come from others)."""
    text = str(value)
    return "".join(" " if ch in "\n\r\t" else ch for ch in text
                   if ch in "\n\r\t" or unicodedata.category(ch) not in ("Cc", "Cf"))


def scaled_cell(value: float | None, unit: float) -> str:
    if value is None or math.isnan(value):
        return "-"
    v = value / unit
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def bound_cell(value: str | None) -> Text:
    """The bound without its "-bound" suffix, coloured: tables stay inside 80 columns."""
    from rich.text import Text

    return Text((value or "-").removesuffix("-bound"), style=BOUND_STYLE.get(value or "", ""))
