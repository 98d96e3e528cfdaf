"""Collectives whose bus bandwidth is far below the link they cross, for messages large enough that
bandwidth, not latency, sets their time. Judged from ``overlap``'s bandwidth rows (the calls of
the steady steps per device, op, process group and message size, ``analyses.collective_bandwidth``)."""

from __future__ import annotations

import polars as pl

from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.findings.overlap import overlap_result
from tracewhy.units import fmt_bytes

_TIMED_BY = {True: " over their transfer time (the shortest across ranks, with no waiting in it)", False: ""}
_SEPARATE = ("Tell waiting from transfer across the ranks: tracewhy ranks DIR (per matched call, the shortest time "
             "across ranks is the transfer, its bus bandwidth is in the matched calls). ")
_CHECK_TRANSPORT = ("If the transfer itself is slow, check the transport NCCL chose (NCCL_DEBUG=INFO: P2P/NVLink "
                    "expected, not SHM or NET/Socket) and measure the link with nccl-tests at this size (e.g. "
                    "all_reduce_perf -b 8M -e 256M).")


def findings(ctx: Context) -> list[Finding]:
    r = overlap_result(ctx)
    return slow_bus_findings(r.bandwidth, r.steady_steps if r.steady.height else 0)


def slow_transfer_findings(matched: pl.DataFrame, steps: int) -> list[Finding]:
    """``slow_bus_findings`` over calls matched across ranks (``RanksResult.matched``), each timed
    by its transfer alone: the shortest duration across ranks, in which no rank waited."""
    rows = matched.filter(pl.col("busbw_bytes_per_s").is_not_null()).select(
        pl.lit(None, dtype=pl.Int32).alias("device"), "op", "process_group", "group_size", "msg_bytes",
        pl.lit(1, dtype=pl.Int64).alias("calls"), pl.col("transfer_ns").alias("time_ns"), "busbw_bytes_per_s", "link",
        "link_bytes_per_s",
    )
    return slow_bus_findings(rows, steps, transfer_only=True)


def slow_bus_findings(bandwidth: pl.DataFrame, steps: int, *, transfer_only: bool = False) -> list[Finding]:
    """One finding per device, op, process group and link whose large calls
    (``COLL_LARGE_MESSAGE_BYTES`` and up) together ran at under ``COLL_SLOW_BUS_SHARE`` of the
    link's peak: bus bytes over their summed time. ``bandwidth``: rows of
    ``collective_bandwidth.BANDWIDTH_SCHEMA`` (device, op, process_group, group_size, msg_bytes,
    calls, time_ns, busbw_bytes_per_s, link, link_bytes_per_s); ``steps``: the steady steps they
    cover (0: the whole trace); ``transfer_only``: their times hold no waiting for other ranks."""
    large = bandwidth.filter(
        (pl.col("msg_bytes") >= th.COLL_LARGE_MESSAGE_BYTES) & pl.col("busbw_bytes_per_s").is_not_null()
        & pl.col("link_bytes_per_s").is_not_null()
    ).with_columns((pl.col("busbw_bytes_per_s") * pl.col("time_ns") / 1e9).alias("_bus_bytes"))
    out: list[Finding] = []
    groups = large.group_by("device", "op", "process_group", "link", "link_bytes_per_s", "group_size").agg(
        pl.col("calls").sum(), pl.col("_bus_bytes").sum(), pl.col("time_ns").sum().alias("dur_ns"),
        pl.col("msg_bytes").min().alias("min_bytes"), pl.col("msg_bytes").max().alias("max_bytes"),
    ).sort("dur_ns", "device", "op", descending=[True, False, False])
    for g in groups.iter_rows(named=True):
        busbw = g["_bus_bytes"] / g["dur_ns"] * 1e9
        share = busbw / g["link_bytes_per_s"]
        if share >= th.COLL_SLOW_BUS_SHARE:
            continue
        per_step = g["dur_ns"] / steps if steps else g["dur_ns"]
        unit = "per step" if steps else "over the trace"
        sizes = (fmt_bytes(g["min_bytes"]) if g["min_bytes"] == g["max_bytes"]
                 else f"{fmt_bytes(g['min_bytes'])} to {fmt_bytes(g['max_bytes'])}")
        over = f" over {steps} steady steps" if steps else ""
        group = f" on process group {g['process_group']}" if g["process_group"] else ""
        where = f"{g['group_size']} ranks" + (f", GPU {g['device']}" if g["device"] is not None else "")
        out.append(Finding(
            code=Code.COLLECTIVE_SLOW_BUS,
            severity=Severity.MEDIUM if per_step >= th.EXPOSED_COMM_MIN_NS else Severity.LOW,
            statement=(
                f"{g['op']}{group} ({where}): {g['calls']} calls of {sizes}{over} ran at {busbw / 1e9:.1f} GB/s bus "
                f"bandwidth{_TIMED_BY[transfer_only]}, {100 * share:.1f}% of {g['link']}'s "
                f"{g['link_bytes_per_s'] / 1e9:.0f} GB/s per direction, taking {per_step / 1e6:.2f} ms {unit}."
                + ("" if transfer_only else " A call's kernel time includes waiting for the ranks that reach it "
                   "later, which one rank's trace cannot tell from the transfer.")
            ),
            next_step=("" if transfer_only else _SEPARATE) + _CHECK_TRANSPORT,
            evidence={
                "op": g["op"], "process_group": g["process_group"] or None, "group_size": g["group_size"],
                "device": g["device"], "calls": g["calls"], "min_msg_bytes": g["min_bytes"],
                "max_msg_bytes": g["max_bytes"], "busbw_bytes_per_s": round(busbw),
                "link": g["link"], "link_bytes_per_s": g["link_bytes_per_s"], "link_share": round(share, 4),
                "time_ns": g["dur_ns"], "steps": steps, "transfer_only": transfer_only,
            },
        ))
    return out

