"""Across ranks: which collective calls are the same call, how much of each is transfer and how
much is waiting, which rank arrives last, and whether the ranks even issued the same calls.

Ranks have separate clocks, so no timestamp is compared across ranks. Calls are matched by
step number, process group, op and order within them; counts, sizes and (where the process
group is recorded) the order of ops within a group are then checked, since every rank of a
group must issue the group's collectives alike or the job hangs. A collective ends on every rank
at about the same moment, when the last rank has arrived and the data has moved, so the rank
that arrived last spent the least time in it: per matched call the shortest duration across
ranks is the transfer, and each rank's excess over it is time it waited for the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses.ranks import RankSummary

#: Ops whose message size differs between ranks by design (uneven all-to-all splits,
#: point-to-point): their sizes are not compared.
_SIZE_VARIES: Final = frozenset({"all_to_all", "send_recv", "send", "recv", "gather", "scatter"})
_TIMED: Final = ("device", "host")


@dataclass(frozen=True)
class RanksResult:
    """``ranks``: one row per rank: rank, source, rank_from, steps, step_p50_ns, step_p90_ns,
    compute_ns_per_step, comm_ns_per_step, comm_exposed_ns_per_step, idle_ns_per_step,
    input_ns_per_step, calls, wait_ns_per_step (its waits in matched calls), last_count (calls
    it arrived last at), late_ns_per_step (what the others waited for it: per call it was last
    at, the median of the others' waits, summed per step).
    ``matched``: one row per call matched on two or more ranks with timing: step,
    process_group, ordinal (within step, group and op), op, ranks, transfer_ns, max_wait_ns, last_rank, late_ns.
    ``lateness``: rank, step, late_ns, wait_ns. ``mismatches``: step, process_group, op,
    kind ("count", "size" or "order"), detail, cut_explains (the ranks short of calls have
    incomplete files).
    """

    ranks: pl.DataFrame
    matched: pl.DataFrame
    lateness: pl.DataFrame
    mismatches: pl.DataFrame
    straggler: int | None
    straggler_last_share: float | None
    steps_compared: int
    summaries: tuple[RankSummary, ...]
    notes: tuple[str, ...]


def compare_ranks(summaries: Sequence[RankSummary]) -> RanksResult:
    notes: list[str] = []
    by_steps = all(s.steps for s in summaries)
    common = set.intersection(*(set(_steady_steps(s)) for s in summaries)) if by_steps and summaries else set()
    if summaries and not by_steps:
        notes.append("not every rank has steps: calls are matched by order over the whole capture")
    elif summaries and not common:
        notes.append("the ranks' steady steps have no step number in common: nothing to match")
    for s in summaries:
        if s.missing_events:
            last = f" (its last step, {max(s.steady_step_numbers)}, is left out of the matching)" \
                if by_steps and s.steady_step_numbers else ""
            notes.append(f"rank {s.rank}'s trace is incomplete: {'; '.join(s.missing_events)}{last}")
    world = {s.world_size for s in summaries if s.world_size is not None}
    if world and max(world) > len(summaries):
        notes.append(f"{len(summaries)} of {max(world)} ranks: transfer and waits are relative to these ranks only")
    calls = _calls(summaries, by_steps, common)
    matched = _match(calls)
    mismatches = _mismatches(calls, {s.rank for s in summaries if s.missing_events})
    lateness = _lateness(matched, calls)
    n_steps = max(len(common), 1) if by_steps else 1
    table = _rank_table(summaries, calls, matched, lateness, n_steps)
    straggler, share = _straggler(matched)
    return RanksResult(
        ranks=table, matched=matched, lateness=lateness, mismatches=mismatches, straggler=straggler,
        straggler_last_share=share, steps_compared=len(common), summaries=tuple(summaries),
        notes=tuple(notes),
    )


def _steady_steps(s: RankSummary) -> list[int]:
    """The steps to match on this rank. A rank whose file lacks events (cut, say) loses its
    last step too: the cut fell in it, so its collectives there stop early."""
    numbers = sorted(s.steady_step_numbers)
    return numbers[:-1] if s.missing_events else numbers


def _calls(summaries: Sequence[RankSummary], by_steps: bool, common: set[int]) -> pl.DataFrame:
    frames = []
    for s in summaries:
        c = s.collectives
        if by_steps:
            c = c.filter(pl.col("step").is_in(sorted(common)))
        else:
            c = c.with_columns(pl.lit(-1, dtype=pl.Int64).alias("step"))
        frames.append(c.with_columns(pl.lit(s.rank, dtype=pl.Int64).alias("rank")).with_row_index("_order"))
    schema = {"rank": pl.Int64, "step": pl.Int64, "process_group": pl.String, "ordinal": pl.Int64, "op": pl.String,
              "size": pl.Int64, "timing": pl.String, "dur_ns": pl.Int64}
    if not frames:
        return pl.DataFrame(schema=schema)
    return (
        pl.concat(frames)
        .sort("rank", "_order")
        .with_columns(
            pl.int_range(pl.len()).over("rank", "step", "process_group", "op").cast(pl.Int64).alias("ordinal")
        )
        .select(*schema)
    )


def _match(calls: pl.DataFrame) -> pl.DataFrame:
    schema = {"step": pl.Int64, "process_group": pl.String, "ordinal": pl.Int64, "op": pl.String, "ranks": pl.Int64,
              "transfer_ns": pl.Int64, "max_wait_ns": pl.Int64, "last_rank": pl.Int64, "late_ns": pl.Float64}
    timed = calls.filter(pl.col("timing").is_in(_TIMED) & pl.col("dur_ns").is_not_null())
    rows = []
    for key, g in timed.group_by("step", "process_group", "op", "ordinal", maintain_order=True):
        if g.height < 2:
            continue
        ranks = g.get_column("rank").to_numpy()
        dur = g.get_column("dur_ns").to_numpy()
        transfer = int(dur.min())
        wait = dur - transfer
        shortest = np.flatnonzero(dur == transfer)
        last = int(ranks[shortest[0]]) if shortest.size == 1 else None
        others = np.delete(wait, shortest[0])
        rows.append({
            "step": key[0], "process_group": key[1], "ordinal": key[3], "op": key[2],
            "ranks": g.height, "transfer_ns": transfer, "max_wait_ns": int(wait.max()), "last_rank": last,
            "late_ns": float(np.median(others)) if last is not None else 0.0,
        })
    return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)


def _mismatches(calls: pl.DataFrame, incomplete: set[int]) -> pl.DataFrame:
    """Ranks of one process group that issued different calls in the same step. ``cut_explains``:
    every rank short of calls has an incomplete file, which explains the difference."""
    schema = {"step": pl.Int64, "process_group": pl.String, "op": pl.String, "kind": pl.String, "detail": pl.String,
              "cut_explains": pl.Boolean}
    rows: list[dict[str, object]] = []
    members = calls.group_by("process_group").agg(pl.col("rank").unique().sort())
    member_of = {pg: r for pg, r in members.iter_rows()}
    counts = calls.group_by("step", "process_group", "op", "rank").len("n")
    for (step, pg, op), g in counts.group_by("step", "process_group", "op", maintain_order=True):
        per = dict(zip(g.get_column("rank").to_list(), g.get_column("n").to_list(), strict=True))
        full = {r: per.get(r, 0) for r in member_of[pg]}
        if len(set(full.values())) > 1:
            detail = ", ".join(f"rank {r}: {n}" for r, n in sorted(full.items()))
            short = {r for r, n in full.items() if n < max(full.values())}
            rows.append({"step": step, "process_group": pg, "op": op, "kind": "count", "detail": detail,
                         "cut_explains": short <= incomplete})
    known = calls.filter(pl.col("process_group") != "")  # "": the trace does not record the group
    sizes = known.filter(~pl.col("op").is_in(list(_SIZE_VARIES))).group_by(
        "step", "process_group", "op", "ordinal", maintain_order=True
    ).agg(pl.col("size").drop_nulls().unique().sort())
    for step, pg, op, ordinal, values in sizes.iter_rows():
        if len(values) > 1:
            rows.append({"step": step, "process_group": pg, "op": op, "kind": "size",
                         "detail": f"call {ordinal} of this op has sizes {values} elements on different ranks",
                         "cut_explains": False})
    orders = known.sort("rank", "ordinal").group_by("step", "process_group", "rank", maintain_order=True).agg(
        pl.col("op").str.join(",").alias("_seq")
    )
    counted = {(x["step"], x["process_group"]) for x in rows}  # a count mismatch already says it
    for (step, pg), g in orders.group_by("step", "process_group", maintain_order=True):
        if (step, pg) not in counted and g.get_column("_seq").n_unique() > 1:
            detail = "; ".join(f"rank {r}: {s}" for r, s in sorted(zip(g.get_column("rank").to_list(),
                                                                        g.get_column("_seq").to_list(), strict=True)))
            rows.append({"step": step, "process_group": pg, "op": None, "kind": "order", "detail": detail,
                         "cut_explains": False})
    out = pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
    return out.sort("step", "process_group", "op", "kind", nulls_last=True)


def _lateness(matched: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    late = matched.filter(pl.col("last_rank").is_not_null()).group_by(pl.col("last_rank").alias("rank"), "step").agg(
        pl.col("late_ns").sum()
    )
    waits = (
        calls.filter(pl.col("timing").is_in(_TIMED))
        .join(matched.select("step", "process_group", "op", "ordinal", "transfer_ns"),
              on=["step", "process_group", "op", "ordinal"], nulls_equal=True)
        .group_by("rank", "step").agg((pl.col("dur_ns") - pl.col("transfer_ns")).sum().alias("wait_ns"))
    )
    return (
        waits.join(late, on=["rank", "step"], how="full", coalesce=True, nulls_equal=True)
        .with_columns(pl.col("late_ns").fill_null(0.0), pl.col("wait_ns").fill_null(0))
        .select("rank", "step", "late_ns", "wait_ns")
        .sort("rank", "step")
    )


def _rank_table(summaries: Sequence[RankSummary], calls: pl.DataFrame, matched: pl.DataFrame,
                lateness: pl.DataFrame, n_steps: int) -> pl.DataFrame:
    rows = []
    for s in summaries:
        mine = lateness.filter(pl.col("rank") == s.rank)
        rows.append({
            "rank": s.rank, "source": s.source, "rank_from": s.rank_from, "steps": s.steps,
            "step_p50_ns": s.step_p50_ns, "step_p90_ns": s.step_p90_ns, "compute_ns_per_step": s.compute_ns_per_step,
            "comm_ns_per_step": s.comm_ns_per_step, "comm_exposed_ns_per_step": s.comm_exposed_ns_per_step,
            "idle_ns_per_step": s.idle_ns_per_step, "input_ns_per_step": s.input_ns_per_step,
            "calls": calls.filter(pl.col("rank") == s.rank).height,
            "wait_ns_per_step": float(mine.get_column("wait_ns").sum()) / n_steps,
            "last_count": matched.filter(pl.col("last_rank") == s.rank).height,
            "late_ns_per_step": float(mine.get_column("late_ns").sum()) / n_steps,
            "incomplete": "; ".join(s.missing_events) or None,
        })
    schema = {"rank": pl.Int64, "source": pl.String, "rank_from": pl.String, "steps": pl.Int64,
              "step_p50_ns": pl.Float64, "step_p90_ns": pl.Float64, "compute_ns_per_step": pl.Float64,
              "comm_ns_per_step": pl.Float64, "comm_exposed_ns_per_step": pl.Float64, "idle_ns_per_step": pl.Float64,
              "input_ns_per_step": pl.Float64, "calls": pl.Int64, "wait_ns_per_step": pl.Float64,
              "last_count": pl.Int64, "late_ns_per_step": pl.Float64, "incomplete": pl.String}
    return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)


def _straggler(matched: pl.DataFrame) -> tuple[int | None, float | None]:
    """The rank that arrived last most often (ties: the one the others waited longer for)."""
    last = matched.filter(pl.col("last_rank").is_not_null())
    if last.height == 0:
        return None, None
    per = last.group_by("last_rank").agg(pl.len().alias("n"), pl.col("late_ns").sum()).sort(
        ["n", "late_ns", "last_rank"], descending=[True, True, False]
    )
    top = per.row(0, named=True)
    return int(top["last_rank"]), top["n"] / last.height
