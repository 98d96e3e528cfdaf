"""Turn finished results into text: terminal tables, the one JSON envelope, the HTML report and the
Perfetto export (annotated traces).

rich is imported inside the functions that build tables, never at a module's top: the JSON
payload functions live beside them, and a ``--json`` run would otherwise pay for rich's import
(about 25 ms) without printing a table."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import RenderableType

#: A command's terminal view, built only when it is printed (``cli.base.emit``).
View = Callable[[], "RenderableType"]
