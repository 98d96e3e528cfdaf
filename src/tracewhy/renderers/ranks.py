"""``ranks``: per-rank step time, compute, exposed communication, idle and input, the straggler,
what the late ranks were doing and the collectives that did not match, as terminal tables and as
JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final, TypedDict

import polars as pl

from tracewhy.analyses.rank_compare import (
    DOING_SCHEMA,
    LATENESS_SCHEMA,
    MATCHED_SCHEMA,
    MISMATCHES_SCHEMA,
    RANKS_SCHEMA,
    RanksResult,
)
from tracewhy.findings.model import Finding
from tracewhy.renderers.findings import render_findings
from tracewhy.renderers.layout import Layout, label, name, number, text
from tracewhy.units import fmt_bytes, fmt_ns, fmt_pct

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tracewhy.renderers.json_schema import rows


class RanksPayload(TypedDict):
    """``ranks``: per rank step time, compute, exposed communication, idle and input; the straggler
    and what it was doing while the others waited; collectives the ranks did not issue alike."""

    #: Where the per-rank work ran (this process, a pool of N workers, a Dask scheduler).
    executor: str
    #: The rank the others waited for longest; null when none did.
    straggler: int | None
    straggler_last_share: float | None
    straggler_wait_share: float | None
    straggler_doing: Annotated[pl.DataFrame, rows(DOING_SCHEMA, "what the straggler's step thread was doing while "
                                                                "the others waited")]
    straggler_doing_window_ns_per_step: float
    #: Steps matched across ranks (0: compared per capture).
    steps_compared: int
    notes: list[str]
    ranks: Annotated[pl.DataFrame, rows(RANKS_SCHEMA, "one row per rank")]
    matched: Annotated[pl.DataFrame, rows(MATCHED_SCHEMA, "one row per collective call matched across ranks")]
    lateness: Annotated[pl.DataFrame, rows(LATENESS_SCHEMA, "per rank and step: what it waited, and what the "
                                                            "others waited for it")]
    mismatches: Annotated[pl.DataFrame, rows(MISMATCHES_SCHEMA, "collectives the ranks did not issue alike")]
    findings: list[Finding]


def ranks_payload(r: RanksResult, findings: list[Finding], executor: str) -> RanksPayload:
    return {
        "executor": executor, "straggler": r.straggler, "straggler_last_share": r.straggler_last_share,
        "straggler_wait_share": r.straggler_wait_share, "straggler_doing": r.doing,
        "straggler_doing_window_ns_per_step": r.doing_window_ns_per_step, "steps_compared": r.steps_compared,
        "notes": list(r.notes), "ranks": r.ranks, "matched": r.matched,
        "lateness": r.lateness, "mismatches": r.mismatches, "findings": findings,
    }


#: ``ranks``: the step time, the exposed communication and who waited for whom stay; the call
#: count and the spread leave first.
RANKS_TABLE: Final = Layout(
    (label("rank", "right"), number("step p50"), number("step p90"), number("compute"), number("exposed comm"),
     number("idle"), number("input"), number("calls"), number("waited"), number("last at"),
     number("others waited for it")),
    drop=("calls", "last at", "input", "step p90", "idle", "compute"))
DOING_TABLE: Final = Layout((label("kind"), name("innermost open"), number("time"), number("share")))
#: Matched calls by the waiting they caused: skew and waits stay; bandwidth and the call's key leave first.
SKEW_TABLE: Final = Layout(
    (label("step"), label("group"), name("op"), number("#"), number("message"), number("transfer"),
     number("bus GB/s"), number("of link peak"), number("arrival skew"), label("last rank", "right"),
     number("early ranks waited")),
    drop=("#", "of link peak", "group", "bus GB/s", "transfer", "message"))
MISMATCHES_TABLE: Final = Layout((label("step"), label("group"), name("op"), label("kind"), text("detail")))


def render_ranks(r: RanksResult, findings: list[Finding], top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    per = (f"per steady step ({r.steps_compared} steps matched)" if r.steps_compared
           else "per capture (no common steps)")
    t = RANKS_TABLE.table(f"{r.ranks.height} ranks; {per}")
    for row in r.ranks.iter_rows(named=True):
        rank = f"{row['rank']} (incomplete)" if row["incomplete"] else str(row["rank"])
        t.add_row(
            rank, fmt_ns(row["step_p50_ns"]), fmt_ns(row["step_p90_ns"]),
            fmt_ns(row["compute_ns_per_step"]), fmt_ns(row["comm_exposed_ns_per_step"]),
            fmt_ns(row["idle_ns_per_step"]),
            fmt_ns(row["input_ns_per_step"]), str(row["calls"]), fmt_ns(row["wait_ns_per_step"]),
            str(row["last_count"]), fmt_ns(row["late_ns_per_step"]),
        )
    parts: list[RenderableType] = [t]
    if r.straggler is not None and r.straggler_wait_share is not None:
        parts.append(Text(f"straggler (the others waited longest for it): rank {r.straggler}, "
                          f"{fmt_pct(r.straggler_wait_share)} of all waiting; last at "
                          f"{fmt_pct(r.straggler_last_share)} of matched collectives"))
    if r.doing.height:
        d = DOING_TABLE.table(f"what rank {r.straggler}'s step thread was doing while the others waited "
                              f"({fmt_ns(r.doing_window_ns_per_step)} per step)")
        for (kind,), g in r.doing.group_by("kind", maintain_order=True):
            for row in g.head(3).iter_rows(named=True):
                d.add_row(str(kind), row["name"], fmt_ns(row["ns_per_step"]), fmt_pct(row["share"]))
        parts.append(d)
    if r.matched.height:
        parts.append(_skew_table(r, top))
    if r.mismatches.height:
        m = MISMATCHES_TABLE.table("collectives the ranks did not issue alike")
        for row in r.mismatches.head(top).iter_rows(named=True):
            m.add_row(str(row["step"]), row["process_group"] or "-", row["op"] or "-", row["kind"], row["detail"])
        parts.append(m)
    for note in r.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    if findings:
        parts.append(render_findings(findings))
    return Group(*parts)


def _skew_table(r: RanksResult, top: int) -> RenderableType:
    """The matched calls that made the early ranks wait longest, with their arrival skew (first
    arrival to last) and their bandwidth over the transfer alone."""
    t = SKEW_TABLE.table("matched collectives, most waiting first (transfer: the shortest time across ranks; "
                         "bus bandwidth over it)")
    for row in r.matched.sort(["wait_ns", "step"], descending=[True, False], nulls_last=True).head(top).iter_rows(
            named=True):
        bus = row["busbw_bytes_per_s"]
        t.add_row("-" if row["step"] is None or row["step"] < 0 else str(row["step"]), row["process_group"] or "-",
                  row["op"], str(row["ordinal"]), fmt_bytes(row["msg_bytes"]), fmt_ns(row["transfer_ns"]),
                  "-" if bus is None else f"{bus / 1e9:.1f}", fmt_pct(row["link_share"]), fmt_ns(row["max_wait_ns"]),
                  "-" if row["last_rank"] is None else str(row["last_rank"]), fmt_ns(row["wait_ns"]))
    return t
