"""Throughput beside a command's own output: a ``throughput`` entry in its JSON payload and one
line in its terminal view, added to what the command's renderer built (``steps``, ``diagnose``,
``diff``, ``pipeline``). Views are functions that build the table when it is printed (a
``--json`` run never calls them, and never imports rich)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from tracewhy.analyses.throughput import Throughput, ThroughputOptions
from tracewhy.findings.throughput import change, rate_label, relative_change, statement
from tracewhy.renderers import View

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rich.console import RenderableType
    from rich.text import Text


class ThroughputJson(TypedDict):
    """Items per second at the steady step (or chunk) times, given the items one step handles."""

    unit: str
    #: How the rate reads: FPS for frames, else UNIT/s.
    rate_unit: str
    #: "step" or "chunk".
    per: str
    items_per_step: float
    #: Steady steps (chunks) the times come from.
    count: int
    p50_per_s: float
    p90_per_s: float
    mean_per_s: float
    p50_step_ns: int
    p90_step_ns: int
    mean_step_ns: int


class ThroughputChangeJson(TypedDict):
    """Run A's and run B's throughput (null where a run has no steady steps), and B's change."""

    a: ThroughputJson | None
    b: ThroughputJson | None
    #: B over A at the median step, minus 1.
    relative_change: float | None
    statement: str


def _json(t: Throughput | None) -> ThroughputJson | None:
    if t is None:
        return None
    return {"unit": t.unit, "rate_unit": rate_label(t.unit), "per": t.per, "items_per_step": t.items_per_step,
            "count": t.count, "p50_per_s": t.p50_per_s, "p90_per_s": t.p90_per_s, "mean_per_s": t.mean_per_s,
            "p50_step_ns": t.p50_step_ns, "p90_step_ns": t.p90_step_ns, "mean_step_ns": t.mean_step_ns}


def with_throughput(payload: Mapping[str, Any], view: View, options: ThroughputOptions | None,
                    t: Throughput | None) -> tuple[dict[str, Any], View]:
    """``payload`` with ``throughput`` and ``view`` with its line; unchanged without ``options``."""
    if options is None:
        return dict(payload), view
    line = statement(t) if t is not None else "throughput: not measured (no steady step times)"

    def with_line() -> RenderableType:
        from rich.console import Group
        from rich.text import Text

        return Group(view(), Text(line, style="bold"))

    return {**payload, "throughput": _json(t)}, with_line


def with_throughput_change(payload: Mapping[str, Any], view: View, options: ThroughputOptions | None,
                           a: Throughput | None, b: Throughput | None,
                           after: str | None = None) -> tuple[dict[str, Any], View]:
    """A and B's throughput and the change (``diff``, ``pipeline --vs``); the line goes right after
    the view's line reading ``after`` (the verdict), else at the end."""
    if options is None:
        return dict(payload), view
    if a is None or b is None:
        line, rel = "throughput: not measured (a run has no steady steps)", None
    else:
        line, rel = change(a, b), relative_change(a, b)
    doc: ThroughputChangeJson = {"a": _json(a), "b": _json(b), "relative_change": rel, "statement": line}

    def with_line() -> RenderableType:
        from rich.text import Text

        return _insert_after(view(), after, Text(line, style="bold"))

    return {**payload, "throughput": doc}, with_line


def _insert_after(view: RenderableType, after: str | None, line: Text) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    if isinstance(view, Group) and after is not None:
        parts = list(view.renderables)
        for i, part in enumerate(parts):
            if isinstance(part, Text) and part.plain == after:
                return Group(*parts[:i + 1], line, *parts[i + 1:])
    return Group(view, line)
