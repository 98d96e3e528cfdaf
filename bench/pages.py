"""Result pages shared by the benchmarks: a block of lines written between two markers of a page."""

from __future__ import annotations

from pathlib import Path


def write_between_markers(page: Path, markers: tuple[str, str], lines: list[str]) -> None:
    """Replace what lies between ``markers`` on ``page`` by ``lines``, the rest kept byte for byte."""
    text = page.read_text(encoding="utf-8")
    head, rest = text.split(markers[0], 1)
    _, tail = rest.split(markers[1], 1)
    page.write_text("\n".join([head + markers[0], *lines, markers[1]]) + tail, encoding="utf-8")
