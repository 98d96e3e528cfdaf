"""Terminal and JSON forms of a run comparison (``tracewhy diff``). Takes a finished Comparison."""

from __future__ import annotations

from typing import Any

import polars as pl
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tracewhy.findings.compare import FASTER, SLOWER, Comparison
from tracewhy.units import fmt_ns, shorten

_STYLE = {SLOWER: "bold red", FASTER: "bold green"}


def comparison_payload(c: Comparison) -> dict[str, Any]:
    """The ``--json`` document of ``diff`` (all rows; the terminal shows the top ones)."""
    d = c.diff
    return {
        "verdict": c.verdict,
        "statement": c.statement,
        "relative_change": c.relative_change,
        "comparable": c.comparable,
        "not_comparable_because": c.not_comparable_because,
        "caveats": c.caveats,
        "a": d.a,
        "b": d.b,
        "steps": d.steps,
        "a_step_durations_ns": d.a_step_durations_ns,
        "b_step_durations_ns": d.b_step_durations_ns,
        "differences": d.differences,
        "ops": d.ops,
        "annotations": d.annotations,
        "kernels": d.kernels,
        "findings": {
            "compared": c.findings_compared,
            "appeared": c.findings_appeared,
            "disappeared": c.findings_disappeared,
        },
    }


def render_comparison(c: Comparison, top: int) -> RenderableType:
    d = c.diff
    parts: list[RenderableType] = [
        Text(f"A: {d.a.path}\nB: {d.b.path}"),
        Text(c.statement, style=_STYLE.get(c.verdict, "bold")),
    ]
    if not c.comparable:
        parts.append(Text("not comparable: " + "; ".join(c.not_comparable_because), style="yellow"))
    for caveat in c.caveats:
        parts.append(Text(f"note: {caveat}", style="dim"))
    for title, table, gpu in (("operators (CPU self time)", d.ops, True),
                              ("annotated blocks", d.annotations, False),
                              ("kernels", d.kernels, False)):
        if table.height:
            has_gpu = gpu and bool(table.select(pl.col("a_gpu_ns_per_step").abs().sum()
                                                + pl.col("b_gpu_ns_per_step").abs().sum()).item())
            parts.append(_delta_table(title, table, top, has_gpu))
    if c.findings_compared:
        for label, found in (("appeared", c.findings_appeared), ("disappeared", c.findings_disappeared)):
            for f in found:
                parts.append(Text(f"finding {label}: [{f.code}] {f.statement}"))
        if not (c.findings_appeared or c.findings_disappeared):
            parts.append(Text("findings: the same codes in both runs"))
    return Group(*parts)


def _delta_table(title: str, table: pl.DataFrame, top: int, gpu: bool) -> Table:
    t = Table(title=f"{title}: per steady step, largest change first")
    t.add_column("name")
    for col in ("calls A", "calls B", "A", "B", "B - A", *(("GPU A", "GPU B", "GPU B - A") if gpu else ())):
        t.add_column(col, justify="right")
    for row in table.head(top).iter_rows(named=True):
        cells = [shorten(row["name"], 60), f"{row['a_calls_per_step']:g}", f"{row['b_calls_per_step']:g}",
                 fmt_ns(row["a_ns_per_step"]), fmt_ns(row["b_ns_per_step"]), _signed(row["delta_ns_per_step"])]
        if gpu:
            cells += [fmt_ns(row["a_gpu_ns_per_step"]), fmt_ns(row["b_gpu_ns_per_step"]),
                      _signed(row["delta_gpu_ns_per_step"])]
        t.add_row(*cells)
    return t


def _signed(ns: float) -> str:
    return ("+" if ns > 0 else "-" if ns < 0 else "") + fmt_ns(abs(ns))
