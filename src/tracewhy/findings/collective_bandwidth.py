"""Collectives whose bus bandwidth is far below the link they cross, for messages large enough that
bandwidth, not latency, sets their time. Judged from ``analyses.collectives``' per-call message
size, bus bandwidth (NCCL's formula) and GPU-to-GPU link, over the steady steps."""

from __future__ import annotations

import polars as pl

from tracewhy.analyses.collectives import CollectivesResult, collectives
from tracewhy.analyses.steps import steady_span, step_windows
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity


def collectives_of(ctx: Context) -> CollectivesResult:
    """The collective calls of this diagnosis, computed once (overlap reads them too)."""
    return ctx.cached("collectives", lambda: collectives(ctx.trace))


def findings(ctx: Context) -> list[Finding]:
    table = collectives_of(ctx).table
    windows = step_windows(ctx.trace, ctx.steps())
    span = steady_span(windows)
    steps = int(windows.get_column("steady").sum()) if span is not None else 0
    if span is not None:
        table = table.filter(pl.col("host_ts_ns").is_between(span[0], span[1], closed="left"))
    return slow_bus_findings(table, steps)


def slow_bus_findings(table: pl.DataFrame, steps: int) -> list[Finding]:
    """One finding per op, process group and link whose large calls (``COLL_LARGE_MESSAGE_BYTES``
    and up) together ran at under ``COLL_SLOW_BUS_SHARE`` of the link's peak: bus bytes over
    their summed time. ``steps``: the steady steps ``table`` covers (0: the whole trace)."""
    large = table.filter(
        (pl.col("msg_bytes") >= th.COLL_LARGE_MESSAGE_BYTES) & pl.col("busbw_bytes_per_s").is_not_null()
        & pl.col("link_bytes_per_s").is_not_null() & (pl.col("dur_ns") > 0)
    ).with_columns((pl.col("busbw_bytes_per_s") * pl.col("dur_ns") / 1e9).alias("_bus_bytes"))
    out: list[Finding] = []
    groups = large.group_by("op", pl.col("process_group").fill_null(""), "link", "link_bytes_per_s",
                            "group_size").agg(
        pl.len().alias("calls"), pl.col("_bus_bytes").sum(), pl.col("dur_ns").sum(),
        pl.col("msg_bytes").min().alias("min_bytes"), pl.col("msg_bytes").max().alias("max_bytes"),
        pl.col("msg_bytes").median().alias("median_bytes"), pl.col("device").first(),
    ).sort("dur_ns", "op", descending=[True, False])
    for g in groups.iter_rows(named=True):
        busbw = g["_bus_bytes"] / g["dur_ns"] * 1e9
        share = busbw / g["link_bytes_per_s"]
        if share >= th.COLL_SLOW_BUS_SHARE:
            continue
        per_step = g["dur_ns"] / steps if steps else g["dur_ns"]
        unit = "per step" if steps else "over the trace"
        sizes = (_mb(g["min_bytes"]) if g["min_bytes"] == g["max_bytes"]
                 else f"{_mb(g['min_bytes'])} to {_mb(g['max_bytes'])} (median {_mb(g['median_bytes'])})")
        group = f" on process group {g['process_group']}" if g["process_group"] else ""
        out.append(Finding(
            code=Code.COLLECTIVE_SLOW_BUS,
            severity=Severity.MEDIUM if per_step >= th.EXPOSED_COMM_MIN_NS else Severity.LOW,
            statement=(
                f"{g['op']}{group} ({g['group_size']} ranks): {g['calls']} calls of {sizes} ran at "
                f"{busbw / 1e9:.1f} GB/s bus bandwidth, {100 * share:.1f}% of {g['link']}'s "
                f"{g['link_bytes_per_s'] / 1e9:.0f} GB/s per direction, taking {per_step / 1e6:.2f} ms {unit}. "
                "A call's kernel time includes waiting for the ranks that reach it later, which one rank's "
                "trace cannot tell from the transfer."
            ),
            next_step=(
                "Tell waiting from transfer across the ranks: tracewhy ranks DIR (per matched call, the shortest "
                "time across ranks is the transfer, its bus bandwidth is in the matched calls). If the transfer "
                "itself is slow, check the transport NCCL chose (NCCL_DEBUG=INFO: P2P/NVLink expected, not SHM or "
                "NET/Socket) and measure the link with nccl-tests at this size (e.g. all_reduce_perf -b 8M -e 256M)."
            ),
            evidence={
                "op": g["op"], "process_group": g["process_group"] or None, "group_size": g["group_size"],
                "device": g["device"], "calls": g["calls"], "min_msg_bytes": g["min_bytes"],
                "max_msg_bytes": g["max_bytes"], "busbw_bytes_per_s": round(busbw),
                "link": g["link"], "link_bytes_per_s": g["link_bytes_per_s"], "link_share": round(share, 4),
                "time_ns": g["dur_ns"], "steps": steps,
            },
        ))
    return out


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB"
