"""Terminal table and JSON payload of ``blocks`` on an instrument log (block timers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tracewhy.analyses.log_blocks import CAPTURE, GPU, LogBlocksCol, LogBlocksResult
from tracewhy.findings.model import Finding
from tracewhy.renderers.overlap import render_findings
from tracewhy.units import fmt_ns, fmt_pct, shorten

if TYPE_CHECKING:
    from rich.console import RenderableType


def log_blocks_payload(r: LogBlocksResult, findings: list[Finding]) -> dict[str, Any]:
    """``blocks[]``: per rank and name ``total_ns``, ``share``, ``p50_ns`` (p90, p99), ``sync_mode``
    and the rest of LogBlocksCol; ``unit`` (chunk, step or capture) and ``basis`` (gpu or host)
    say what a value is per and of."""
    return {
        "source": "instrument-log", "unit": r.unit, "basis": r.basis, "warmup": r.warmup,
        "steady_units": {str(k): v for k, v in sorted(r.steady_units.items())},
        "share_of": "the top-level blocks' total on the same rank",
        "sync": r.sync, "synced_instances": r.synced_instances, "instances": r.instances,
        "blocks": r.table, "findings": findings,
    }


def render_log_blocks(r: LogBlocksResult, findings: list[Finding], top: int) -> RenderableType:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    basis = "GPU time" if r.basis == GPU else "host time"
    window = "the whole log" if r.unit == CAPTURE else \
        f"steady {r.unit}s after {r.warmup} warm-up per rank: " + \
        ", ".join(f"rank {k} {n}" for k, n in sorted(r.steady_units.items()))
    t = Table(title=f"block timers, {basis} per {r.unit} ({window})")
    for col in ("rank", "block", "level", "calls", f"per {r.unit}", "share", "p50", "p90", "p99", "GPU total",
                "sync"):
        t.add_column(col, justify="left" if col == "block" else "right")
    for row in r.table.head(top).iter_rows(named=True):
        t.add_row(str(row[LogBlocksCol.RANK]), shorten(row[LogBlocksCol.NAME], 60), str(row[LogBlocksCol.LEVEL]),
                  str(row[LogBlocksCol.INSTANCES]), fmt_ns(row[LogBlocksCol.PER_UNIT]),
                  fmt_pct(row[LogBlocksCol.SHARE]), fmt_ns(row[LogBlocksCol.P50]), fmt_ns(row[LogBlocksCol.P90]),
                  fmt_ns(row[LogBlocksCol.P99]), fmt_ns(row[LogBlocksCol.GPU_TOTAL]), row[LogBlocksCol.SYNC_MODE])
    parts: list[RenderableType] = [t, Text("share: of the top-level blocks' time on the same rank; p50/p90/p99: "
                                           f"of a block's time per {r.unit}, over the {r.unit}s it ran in",
                                           style="dim")]
    if not r.table.height:
        parts.append(Text("no block records (after the warm-up and --names): nothing to attribute", style="yellow"))
    if findings:
        parts.append(render_findings(findings))
    return Group(*parts)
