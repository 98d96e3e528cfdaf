"""Free text wrapped for a terminal: table cells of free text, titles, captions and paragraphs
break at spaces, but never between a number and its unit (``12.3 ms``), and a word longer than a
line is folded, never inside a number."""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING, Final

from tracewhy.units import printable

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.measure import Measurement
    from rich.text import Text


def printable_lines(text: str) -> str:
    """``text`` made printable, line by line (its own newlines kept)."""
    return "\n".join(printable(line) for line in text.split("\n"))


#: The space between a number and its unit, which a wrap never breaks (``12.3 ms``, ``4 GiB``).
_GLUED: Final = re.compile(r"(?<=\d) (?=(?:[nµm]?s|[KMGT]i?B|B|%|[kMGTP]?(?:FLOP|B)/[sB]|x)(?!\w))")


def line_breaks(text: str, width: int) -> list[int]:
    """Where the lines of ``text`` (one line, no newline) start when it is wrapped at ``width``:
    at the start of a word, never between a number and its unit; a word longer than a line is
    folded, never inside a number."""
    glued = _GLUED.sub("\x00", text)
    breaks: list[int] = []
    line_start = 0
    for word in re.finditer(r"\S+", glued):
        start, end = word.span()
        if end - line_start <= width:
            continue
        if start > line_start:
            breaks.append(start)
            line_start = start
        while end - line_start > width:
            line_start += _fold_at(glued[line_start:end], width)
            breaks.append(line_start)
    return breaks


def wrap_text(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters (``line_breaks``), its own newlines kept."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        bounds = [0, *line_breaks(paragraph, max(width, 1)), len(paragraph)]
        lines += [paragraph[a:b].rstrip() for a, b in itertools.pairwise(bounds)]
    return lines


def _fold_at(word: str, width: int) -> int:
    """Where to fold a word too long for a line: not between two digits, after a separator if
    one is near the end of the line."""
    cut = min(width, len(word) - 1)
    while cut > 1 and word[cut - 1].isdigit() and word[cut].isdigit():
        cut -= 1
    for i in range(cut, max(cut - 12, 1), -1):
        if word[i - 1] in "/_-.:,=":
            return i
    return cut if cut > 1 else max(width, 1)


class Paragraph:
    """A paragraph (rich ``Text``) wrapped as table text is (``line_breaks``): a number never
    ends one line while its unit starts the next. ``print_tables`` prints every paragraph so."""

    def __init__(self, text: Text) -> None:
        self.text = text

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        from rich.measure import Measurement

        return Measurement.get(console, options, self.text)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width, 1)
        for line in self.text.split("\n", allow_blank=True):
            for piece in line.divide(line_breaks(line.plain, width)):
                piece.rstrip()
                piece.end = "\n"
                yield piece
