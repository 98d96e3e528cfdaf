"""Human formatting of durations, sizes and shares, for statements (findings) and tables
(renderers); trace strings made safe for a terminal; and whether the command being run prints
names whole.

rich is imported only where something is drawn: findings format their statements here in
``--json`` runs too, which print no table."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.padding import Padding
    from rich.text import Text


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


#: Tables are printed whole (``--wide``, or stdout is not a terminal): set by the CLI per command.
_WHOLE_NAMES: ContextVar[bool] = ContextVar("tracewhy_whole_names", default=False)


@contextmanager
def whole_names(enabled: bool = True) -> Iterator[None]:
    """While inside, tables are printed whole (every column, names uncut): ``--wide``, and piped
    output, where a script reading the table needs the full kernel name."""
    token = _WHOLE_NAMES.set(enabled)
    try:
        yield
    finally:
        _WHOLE_NAMES.reset(token)


def names_whole() -> bool:
    """Whether names are printed whole for the command being run."""
    return _WHOLE_NAMES.get()


def indented(text: Text, indent: int) -> Padding:
    """``text`` with its wrapped lines kept under its first, ``indent`` columns in: a finding's
    statement stays one block under its heading, however narrow the terminal."""
    from rich.padding import Padding

    return Padding(text, (0, 0, 0, indent), expand=False)
