"""Human formatting of durations, sizes and shares: for statements (findings) and tables (renderers).

rich is imported only where a cell or table is drawn: findings format their statements here in
``--json`` runs too, which print no table."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
    from rich.measure import Measurement
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


#: Names are printed whole (``--wide``, or stdout is not a terminal): set by the CLI per command.
_WHOLE_NAMES: ContextVar[bool] = ContextVar("tracewhy_whole_names", default=False)

#: The narrowest a name column is squeezed to before the other columns give way.
NAME_MIN_WIDTH: Final = 24


@contextmanager
def whole_names(enabled: bool = True) -> Iterator[None]:
    """While inside, ``shorten`` and ``name_cells`` keep every name whole: ``--wide``, and piped
    output, where a script reading the table needs the full kernel name."""
    token = _WHOLE_NAMES.set(enabled)
    try:
        yield
    finally:
        _WHOLE_NAMES.reset(token)


def names_whole() -> bool:
    """Whether names are printed whole for the command being run."""
    return _WHOLE_NAMES.get()


def shorten(name: str, width: int = 80) -> str:
    """A trace string for a rich table cell or a line: printable, markup-escaped, and cut in the
    middle to ``width`` (the end of a kernel name, its arguments, often tells it apart); whole
    under ``whole_names``."""
    from rich.markup import escape

    name = printable(name)
    return escape(name if names_whole() else cut_middle(name, width))


def cut_middle(text: str, width: int, keep_from: int = 0) -> str:
    """``text`` in at most ``width`` characters: its head, ``…``, and its tail, never its end cut
    off. ``keep_from``: the index where it starts to differ from its neighbours in a table; when
    the head cannot reach it, a window around it is kept between two ellipses."""
    if len(text) <= width:
        return text
    if width < 12:
        return text[: max(width - 1, 0)] + "…"
    tail = width // 4
    head = width - tail - 1
    if keep_from + _CONTEXT <= head:
        return text[:head] + "…" + text[-tail:]
    head = width // 4
    window = width - head - tail - 2
    start = max(_token_start(text, keep_from, keep_from - window // 2), head)
    if start + window >= len(text) - tail:  # the window runs into the tail: one cut is enough
        return text[:head] + "…" + text[-(width - head - 1):]
    return text[:head] + "…" + text[start:start + window] + "…" + text[-tail:]


#: Characters after the point where names differ that a cut keeps, so the difference is readable.
_CONTEXT: Final = 12
_TOKEN_BREAKS: Final = frozenset("<>(), :")


def _token_start(text: str, at: int, floor: int) -> int:
    """The start of the identifier holding ``text[at]``, not before ``floor``: a window opens on
    a whole word (``MulFunctor<float>``), not mid-name."""
    i = min(at, len(text) - 1)
    while i > max(floor, 0) and text[i - 1] not in _TOKEN_BREAKS:
        i -= 1
    return i


def elide_templates(name: str) -> str:
    """``name`` with the arguments of each outermost template shown as ``<…>``; unchanged when
    its angle brackets do not balance (``operator<``, ``->``)."""
    out: list[str] = []
    depth = 0
    for ch in name:
        if ch == "<":
            if depth == 0:
                out.append("<…")
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
            if depth == 0:
                out.append(">")
        elif ch == ">" and not depth:
            return name
        elif depth == 0:
            out.append(ch)
    return name if depth else "".join(out)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _differs_at(names: Sequence[str]) -> list[int]:
    """Per name, where it first differs from the most similar other name (0 when alone)."""
    order = sorted(range(len(names)), key=lambda i: names[i])
    at = [0] * len(names)
    for a, b in itertools.pairwise(order):
        if names[a] == names[b]:
            continue
        p = _common_prefix(names[a], names[b])
        at[a], at[b] = max(at[a], p), max(at[b], p)
    return at


def indented(text: Text, indent: int) -> Padding:
    """``text`` with its wrapped lines kept under its first, ``indent`` columns in: a finding's
    statement stays one block under its heading, however narrow the terminal."""
    from rich.padding import Padding

    return Padding(text, (0, 0, 0, indent), expand=False)


class NameCell:
    """A name in a table cell that is cut in the middle to the width the table gives it, at
    render time, keeping the part that tells it apart from the other rows (``name_cells``)."""

    def __init__(self, text: str, differs_at: int, min_width: int) -> None:
        self.text = text
        self.differs_at = differs_at
        self.min_width = min(min_width, len(text)) if not names_whole() else len(text)

    def __str__(self) -> str:
        return self.text

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        from rich.measure import Measurement

        return Measurement(min(self.min_width, options.max_width), len(self.text))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.text import Text

        # Squeezed below its minimum (a narrow terminal), a name takes a second line rather
        # than losing what tells it apart.
        width = max(options.max_width, 1)
        lines = 1 if width >= self.min_width else 2
        shown = cut_middle(self.text, width * lines, self.differs_at)
        yield Text("\n".join(shown[i:i + width] for i in range(0, len(shown), width)), no_wrap=True,
                   overflow="crop", end="")


class Fit:
    """A table built for the width it is given (``build(width)``), so that in a narrow terminal
    the columns that matter least leave first instead of the name column shrinking to nothing."""

    def __init__(self, build: Callable[[int], RenderableType]) -> None:
        self.build = build

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        from rich.measure import Measurement

        return Measurement.get(console, options, self.build(options.max_width))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.build(options.max_width)


def name_cells(names: Sequence[str | None], min_width: int = NAME_MIN_WIDTH) -> list[NameCell]:
    """Cells for one table's column of names (the rows shown). Template arguments are elided as
    ``<…>`` in a name only when that still tells it apart from every other row; the cut, if the
    table is narrow, keeps where each name starts to differ from its neighbours."""
    shown = [printable(n or "-") for n in names]
    if not names_whole():
        elided = [elide_templates(n) for n in shown]
        owners: dict[str, set[str]] = {}
        for full, short in zip(shown, elided, strict=True):
            owners.setdefault(short, set()).add(full)
        shown = [short if len(owners[short]) == 1 else full for full, short in zip(shown, elided, strict=True)]
    return [NameCell(text, at, min_width) for text, at in zip(shown, _differs_at(shown), strict=True)]
