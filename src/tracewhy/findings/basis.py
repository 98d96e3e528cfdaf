"""The per-step basis every time finding is normalized by: steady steps when the trace has
step markers, else the whole trace as one window, the span ``info`` reports (and the
statements say so)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracewhy.analyses.gaps import CLASSES, GapCol, class_col
from tracewhy.analyses.stats import nearest_ns, sum_of
from tracewhy.analyses.steps import WindowCol, step_windows
from tracewhy.analyses.utilization import busy_split, trace_span
from tracewhy.findings.context import Context
from tracewhy.units import fmt_pct


@dataclass(frozen=True)
class Basis:
    """Idle time per class per step on the primary device (the one with most busy time). The
    times are means over the steady steps (or the whole trace's totals), each rounded to the
    nearest nanosecond."""

    device: int | None
    steps: int  # steps averaged over (1 for a trace without markers)
    per_steps: bool  # False: the whole trace is one window
    window_ns: int  # mean window per step
    busy_ns: int
    idle_ns: int
    class_ns: dict[str, int]
    #: Idle in gaps shorter than the minimum gap (not classified one by one), and their number
    #: (a mean per step); with class_ns it adds up to idle_ns (give or take the rounding).
    short_ns: int = 0
    short_gaps: float = 0.0
    #: Without steps: idle before the device's first activity and after its last, inside the
    #: trace's span (no gap between two activities holds it); with class_ns and short_ns it adds
    #: up to idle_ns. 0 with steps (each step's window is cut at its own edges).
    outside_ns: int = 0

    @property
    def active_share(self) -> float:
        return self.busy_ns / self.window_ns if self.window_ns else 0.0

    def share(self, ns: float) -> float:
        return ns / self.window_ns if self.window_ns else 0.0

    @property
    def unit(self) -> str:
        """What the figures are, in statements: a mean over the steady steps, or the whole trace."""
        return "mean per step" if self.per_steps else "over the trace (no step markers)"

    def of_window(self, ns: float) -> str:
        """``ns`` as a share of what it was measured over: "12.5% of the step" (or "of the trace")."""
        return f"{fmt_pct(self.share(ns))} of the {'step' if self.per_steps else 'trace'}"


def basis(ctx: Context) -> Basis:
    return ctx.cached("basis", lambda: _basis(ctx))


def _basis(ctx: Context) -> Basis:
    g = ctx.gaps()
    busy = g.busy
    if not busy:
        return Basis(None, 0, False, 0, 0, 0, {c: 0 for c in CLASSES})
    device = max(busy, key=lambda d: int((busy[d].ends - busy[d].starts).sum()))
    steady = g.per_step.filter(pl.col(GapCol.STEADY) & (pl.col(GapCol.DEVICE) == device))
    if steady.height:
        n = steady.height
        return Basis(
            device=device, steps=n, per_steps=True,
            window_ns=nearest_ns(sum_of(steady.get_column(GapCol.WINDOW)) / n),
            busy_ns=nearest_ns(sum_of(steady.get_column(GapCol.BUSY)) / n),
            idle_ns=nearest_ns(sum_of(steady.get_column(GapCol.IDLE)) / n),
            class_ns={c: nearest_ns(sum_of(steady.get_column(class_col(c))) / n) for c in CLASSES},
            short_ns=nearest_ns(sum_of(steady.get_column(GapCol.SHORT)) / n),
            short_gaps=sum_of(steady.get_column(GapCol.SHORT_GAPS)) / n,
        )
    b = busy[device]
    lo, hi = trace_span(ctx.trace) or (0, 0)
    window = hi - lo if b.starts.size else 0
    rows = g.gaps.filter(pl.col(GapCol.DEVICE) == device)
    busy_ns = int((b.ends - b.starts).sum())
    short = g.short.filter(pl.col(GapCol.DEVICE) == device) if g.short.height else g.short
    return Basis(
        device=device, steps=1, per_steps=False, window_ns=window, busy_ns=busy_ns, idle_ns=window - busy_ns,
        outside_ns=window - int(b.ends[-1] - b.starts[0]) if b.starts.size else 0,
        class_ns={c: int(sum_of(rows.get_column(class_col(c)))) for c in CLASSES},
        short_ns=int(sum_of(short.get_column(GapCol.SHORT))) if short.height else 0,
        short_gaps=sum_of(short.get_column(GapCol.SHORT_GAPS)) if short.height else 0.0,
    )


def busy_parts(ctx: Context) -> dict[str, int]:
    """The basis device's time in kernels, copies and memsets, each apart (``busy_split``), on the
    basis' footing: means over the steady steps, or over the trace; empty without a GPU."""
    def compute() -> dict[str, int]:
        b = basis(ctx)
        if b.device is None:
            return {}
        if b.per_steps:
            steady = step_windows(ctx.trace, ctx.steps()).filter(pl.col(WindowCol.STEADY))
            windows = [(int(a), int(z)) for a, z in steady.select(WindowCol.WINDOW_START,
                                                                   WindowCol.WINDOW_END).iter_rows()]
        else:
            span = trace_span(ctx.trace)
            windows = [span] if span is not None else []
        return busy_split(ctx.trace, b.device, windows)
    return ctx.cached("busy_parts", compute)


def busy_phrase(b: Basis, parts: dict[str, int]) -> str:
    """'kernels 2.3%, copies 97.0%, memsets 0.0%' of the basis window (they may overlap)."""
    return ", ".join(f"{name} {fmt_pct(b.share(ns))}" for name, ns in parts.items())
