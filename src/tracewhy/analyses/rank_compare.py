"""Across ranks: which collective calls are the same call, how much of each is transfer and how
much is waiting, which rank arrives last, and whether the ranks even issued the same calls.

Ranks have separate clocks, so no timestamp is compared across ranks. Calls are matched by
step number, process group, op and order within them; counts, sizes and (where the process
group is recorded) the order of ops within a group are then checked, since every rank of a
group must issue the group's collectives alike or the job hangs. A collective ends on every rank
at about the same moment, when the last rank has arrived and the data has moved, so the rank
that arrived last spent the least time in it: per matched call the shortest duration across
ranks is the transfer, and each rank's excess over it is time it waited for the others.

A rank waits at the start of a call (from its arrival until the last rank's), so its waits are
intervals on its own clock: per step, a rank's waiting is the union of those intervals (calls
in flight at once, like DDP's gradient buckets on gloo's two threads, are not counted twice).
The straggler is the rank the others waited for longest per step, summed over the calls it
arrived last at: the time it cost them, not how often it was last (a rank a few µs last at many
tiny broadcasts is not the one a 20 ms late all-reduce waits for). What it was doing meanwhile
is read off its own clock too: the others waited ``late_ns`` at a call, so on the straggler
that is the ``late_ns`` before it arrived, and its step thread's timeline says what was open.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses.collective_bandwidth import TRANSFER_BANDWIDTH_SCHEMA, transfer_bandwidth
from tracewhy.analyses.intervals import covered_ns, union
from tracewhy.analyses.ranks import RankSummary
from tracewhy.analyses.stats import nearest_ns
from tracewhy.rows import Rows

#: Ops whose message size differs between ranks by design (uneven all-to-all splits,
#: point-to-point): their sizes are not compared.
_SIZE_VARIES: Final = frozenset({"all_to_all", "send_recv", "send", "recv", "gather", "scatter"})
_TIMED: Final = ("device", "host")
#: The ``doing`` row for time in the window when nothing was open on the step thread.
UNRECORDED: Final = ("unrecorded", "(no annotation, op or Python frame open)")


#: ``RanksResult.ranks``: one row per rank (see RanksResult).
RANKS_SCHEMA: Final = pl.Schema({
    "rank": pl.Int64(), "source": pl.String(), "rank_from": pl.String(), "steps": pl.Int64(),
    "step_p50_ns": pl.Int64(), "step_p90_ns": pl.Int64(), "step_mean_ns": pl.Int64(),
    "compute_ns_per_step": pl.Float64(), "comm_ns_per_step": pl.Float64(), "comm_exposed_ns_per_step": pl.Float64(),
    "idle_ns_per_step": pl.Float64(), "input_ns_per_step": pl.Float64(), "calls": pl.Int64(),
    "wait_ns_per_step": pl.Float64(), "last_count": pl.Int64(), "late_ns_per_step": pl.Float64(),
    "incomplete": pl.String(),
})
#: ``RanksResult.matched``: one row per call matched on two or more ranks. ``late_ns``, the median
#: of the other ranks' waits, is rounded to the nearest nanosecond. ``max_wait_ns`` is the call's
#: arrival skew (first arrival to last); ``wait_ns`` the waits it caused on the early ranks, summed.
MATCHED_SCHEMA: Final = pl.Schema({
    "step": pl.Int64(), "process_group": pl.String(), "ordinal": pl.Int64(), "op": pl.String(), "ranks": pl.Int64(),
    "transfer_ns": pl.Int64(), "max_wait_ns": pl.Int64(), "last_rank": pl.Int64(), "late_ns": pl.Int64(),
    "wait_ns": pl.Int64(), **TRANSFER_BANDWIDTH_SCHEMA,
})
#: A matched call's row before ``transfer_bandwidth`` adds its bandwidth.
_MATCH_ROWS: Final = pl.Schema({k: v for k, v in MATCHED_SCHEMA.items()
                                if k not in ("busbw_bytes_per_s", "link_share")})
#: ``RanksResult.lateness``: per rank and step (``late_ns`` rounded as in MATCHED_SCHEMA).
LATENESS_SCHEMA: Final = pl.Schema({"rank": pl.Int64(), "step": pl.Int64(), "late_ns": pl.Int64(),
                                    "wait_ns": pl.Int64()})
#: ``RanksResult.mismatches``: collectives the ranks of a group did not issue alike.
MISMATCHES_SCHEMA: Final = pl.Schema({"step": pl.Int64(), "process_group": pl.String(), "op": pl.String(),
                                      "kind": pl.String(), "detail": pl.String(), "cut_explains": pl.Boolean()})
#: ``RanksResult.doing``: what the straggler's step thread was doing while the others waited.
DOING_SCHEMA: Final = pl.Schema({"kind": pl.String(), "name": pl.String(), "ns_per_step": pl.Float64(),
                                 "share": pl.Float64()})


@dataclass(frozen=True)
class RanksResult(Rows, rows="ranks"):
    """``ranks``: one row per rank: rank, source, rank_from, steps, step_p50_ns, step_p90_ns, step_mean_ns,
    compute_ns_per_step, comm_ns_per_step, comm_exposed_ns_per_step, idle_ns_per_step,
    input_ns_per_step, calls, wait_ns_per_step (its waits in matched calls), last_count (calls
    it arrived last at), late_ns_per_step (what the others waited for it: per step, each other
    rank's waits at the calls it was last at, as a union on that rank's clock; the median over
    the other ranks).
    ``matched``: one row per call matched on two or more ranks with timing: step,
    process_group, ordinal (within step, group and op), op, ranks, transfer_ns, max_wait_ns (the
    arrival skew), last_rank, late_ns, wait_ns (the early ranks' waits, summed), and the call's
    bandwidth over its transfer time (``collective_bandwidth.transfer_bandwidth``).
    ``lateness``: rank, step, late_ns, wait_ns. ``doing``: what the straggler's step thread
    was doing while the others waited for it (host-timed calls; see ``straggler_doing``): kind,
    name, ns_per_step, share (of the window). ``straggler``: the rank with the most
    late_ns; ``straggler_last_share``: share of the matched calls it arrived last at;
    ``straggler_wait_share``: share of all late_ns it caused. ``mismatches``: step, process_group, op,
    kind ("count", "size" or "order"), detail, cut_explains (the ranks short of calls have
    incomplete files).
    """

    ranks: pl.DataFrame
    matched: pl.DataFrame
    lateness: pl.DataFrame
    mismatches: pl.DataFrame
    straggler: int | None
    straggler_last_share: float | None
    straggler_wait_share: float | None
    doing: pl.DataFrame
    #: Per step, how long the window the others waited for the straggler was (host-timed calls).
    doing_window_ns_per_step: float
    steps_compared: int
    summaries: tuple[RankSummary, ...]
    notes: tuple[str, ...]
    #: Why the files do not look like the ranks of one job (empty when they do): then no call is
    #: matched across them, so no wait, straggler or mismatch is measured.
    not_one_job: tuple[str, ...] = ()


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
    differ = job_differences(summaries)
    if differ:
        notes.append(f"these files do not look like the ranks of one job ({'; '.join(differ)}): "
                     "nothing is compared across them")
        common = set()
    elif world and max(world) > len(summaries):
        notes.append(f"{len(summaries)} of {max(world)} ranks: transfer and waits are relative to these ranks only")
    calls = _calls(summaries, by_steps, common)
    matched = _match(calls)
    mismatches = _mismatches(calls, {s.rank for s in summaries if s.missing_events})
    lateness = _lateness(matched, calls)
    n_steps = max(len(common), 1) if by_steps else 1
    table = _rank_table(summaries, calls, matched, lateness, n_steps)
    straggler, last_share, wait_share = _straggler(matched, lateness)
    doing, window = (_doing(next(s for s in summaries if s.rank == straggler), calls, matched, n_steps)
                     if straggler is not None else (_doing_empty(), 0.0))
    return RanksResult(
        ranks=table, matched=matched, lateness=lateness, mismatches=mismatches, straggler=straggler,
        straggler_last_share=last_share, straggler_wait_share=wait_share, doing=doing,
        doing_window_ns_per_step=window, steps_compared=len(common), summaries=tuple(summaries),
        notes=tuple(notes), not_one_job=differ,
    )


def job_differences(summaries: Sequence[RankSummary]) -> tuple[str, ...]:
    """What the files' own records say sets them apart as different jobs: world size, backend or
    GPU model (where every file records one), process groups (where every file records some
    and they share none) or numbered steady steps (where every file has some and they share
    none). Ranks of one job agree on all of these; a file name says nothing here."""
    out: list[str] = []

    def differ(what: str, values: dict[int, str]) -> None:
        if len(values) == len(summaries) and len(set(values.values())) > 1:
            out.append(f"{what} differ ({', '.join(f'rank {r}: {v}' for r, v in sorted(values.items()))})")

    differ("world sizes", {s.rank: str(s.world_size) for s in summaries if s.world_size is not None})
    differ("backends", {s.rank: s.backend for s in summaries if s.backend})
    differ("devices", {s.rank: ", ".join(s.device_names) for s in summaries if s.device_names})
    groups = {s.rank: set(s.collectives.get_column("process_group").to_list()) - {""} for s in summaries}
    if len(summaries) > 1 and all(groups.values()) and not set.intersection(*groups.values()):
        out.append("no process group in common ("
                   + ", ".join(f"rank {r}: {' '.join(sorted(g))}" for r, g in sorted(groups.items())) + ")")
    numbers = [set(s.steady_step_numbers) for s in summaries]
    if len(summaries) > 1 and all(numbers) and not set.intersection(*numbers):
        out.append("no step number in common")
    return tuple(out)


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
              "size": pl.Int64, "timing": pl.String, "dur_ns": pl.Int64, "arrive_ns": pl.Int64,
              "msg_bytes": pl.Int64, "group_size": pl.Int64, "link": pl.String, "link_bytes_per_s": pl.Float64}
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
    schema = MATCHED_SCHEMA
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
            "late_ns": nearest_ns(float(np.median(others))) if last is not None else 0, "wait_ns": int(wait.sum()),
            **{c: g.get_column(c).max() for c in ("msg_bytes", "group_size", "link", "link_bytes_per_s")},
        })
    table = pl.DataFrame(rows, schema=_MATCH_ROWS) if rows else pl.DataFrame(schema=_MATCH_ROWS)
    return transfer_bandwidth(table).select(*schema)


def _mismatches(calls: pl.DataFrame, incomplete: set[int]) -> pl.DataFrame:
    """Ranks of one process group that issued different calls in the same step. ``cut_explains``:
    every rank short of calls has an incomplete file, which explains the difference."""
    schema = MISMATCHES_SCHEMA
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
    """Per rank and step: wait_ns, the union of its wait intervals; late_ns, the median over the
    other ranks of the union of their wait intervals at the calls this rank arrived last at."""
    schema = LATENESS_SCHEMA
    waits = _waits(matched, calls)
    rows: list[dict[str, object]] = []
    for (rank, step), g in waits.group_by("rank", "step", maintain_order=True):
        rows.append({"rank": rank, "step": step, "late_ns": 0, "wait_ns": _union_ns(g)})
    late: dict[tuple[int, int], list[int]] = {}
    others = waits.filter(pl.col("last_rank").is_not_null() & (pl.col("rank") != pl.col("last_rank")))
    for (last, step, _), g in others.group_by("last_rank", "step", "rank", maintain_order=True):
        late.setdefault((last, step), []).append(_union_ns(g))
    index = {(r["rank"], r["step"]): r for r in rows}
    for key, values in late.items():
        row = index.get(key)
        if row is None:
            row = {"rank": key[0], "step": key[1], "late_ns": 0, "wait_ns": 0}
            rows.append(row)
        row["late_ns"] = nearest_ns(float(np.median(values)))
    out = pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
    return out.sort("rank", "step")


def _waits(matched: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """Each rank's part in each matched call: rank, step, last_rank, arrive_ns, wait_ns."""
    return (
        calls.filter(pl.col("timing").is_in(_TIMED) & pl.col("dur_ns").is_not_null())
        .join(matched.select("step", "process_group", "op", "ordinal", "transfer_ns", "last_rank"),
              on=["step", "process_group", "op", "ordinal"], nulls_equal=True)
        .select("rank", "step", "last_rank", "arrive_ns", (pl.col("dur_ns") - pl.col("transfer_ns")).alias("wait_ns"))
    )


def _union_ns(waits: pl.DataFrame) -> int:
    """Length of the union of [arrive, arrive + wait) over the rows; a row without an arrival
    time counts in full (nothing to overlap it with)."""
    known = waits.filter(pl.col("arrive_ns").is_not_null())
    loose = int(waits.filter(pl.col("arrive_ns").is_null()).get_column("wait_ns").sum())
    s = known.get_column("arrive_ns").to_numpy()
    return covered_ns(s, s + known.get_column("wait_ns").to_numpy()) + loose


def _rank_table(summaries: Sequence[RankSummary], calls: pl.DataFrame, matched: pl.DataFrame,
                lateness: pl.DataFrame, n_steps: int) -> pl.DataFrame:
    rows = []
    for s in summaries:
        mine = lateness.filter(pl.col("rank") == s.rank)
        rows.append({
            "rank": s.rank, "source": s.source, "rank_from": s.rank_from, "steps": s.steps,
            "step_p50_ns": s.step_p50_ns, "step_p90_ns": s.step_p90_ns, "step_mean_ns": s.step_mean_ns,
            "compute_ns_per_step": s.compute_ns_per_step,
            "comm_ns_per_step": s.comm_ns_per_step, "comm_exposed_ns_per_step": s.comm_exposed_ns_per_step,
            "idle_ns_per_step": s.idle_ns_per_step, "input_ns_per_step": s.input_ns_per_step,
            "calls": calls.filter(pl.col("rank") == s.rank).height,
            "wait_ns_per_step": float(mine.get_column("wait_ns").sum()) / n_steps,
            "last_count": matched.filter(pl.col("last_rank") == s.rank).height,
            "late_ns_per_step": float(mine.get_column("late_ns").sum()) / n_steps,
            "incomplete": "; ".join(s.missing_events) or None,
        })
    return pl.DataFrame(rows, schema=RANKS_SCHEMA) if rows else pl.DataFrame(schema=RANKS_SCHEMA)


def _straggler(matched: pl.DataFrame, lateness: pl.DataFrame) -> tuple[int | None, float | None, float | None]:
    """The rank the others waited for longest (ties: the lower rank), the share of matched calls
    it arrived last at, and its share of all the waiting that ranks caused."""
    per = lateness.group_by("rank").agg(pl.col("late_ns").sum()).sort(["late_ns", "rank"], descending=[True, False])
    total = float(per.get_column("late_ns").sum())
    if per.height == 0 or total <= 0:
        return None, None, None
    rank, late = per.row(0)
    last = matched.filter(pl.col("last_rank").is_not_null())
    return int(rank), last.filter(pl.col("last_rank") == rank).height / last.height, late / total


def _doing_empty() -> pl.DataFrame:
    return pl.DataFrame(schema=DOING_SCHEMA)


def _doing(me: RankSummary, calls: pl.DataFrame, matched: pl.DataFrame, n_steps: int) -> tuple[pl.DataFrame, float]:
    """What ``me``'s step thread was doing while the others waited for it: at each host-timed call
    it arrived last at, the others waited ``late_ns``, which on its clock is the ``late_ns``
    before its arrival. Per kind, the time each innermost slice was open in the union of those
    windows, per step, with its share of the window; kind "unrecorded" is the time nothing was
    open. (Device-timed calls are left out: there the
    wait is on the GPU stream, which ran ahead of or behind the host.)"""
    mine = calls.filter((pl.col("rank") == me.rank) & (pl.col("timing") == "host") & pl.col("arrive_ns").is_not_null())
    late = mine.join(matched.filter(pl.col("last_rank") == me.rank).select("step", "process_group", "op", "ordinal",
                                                                            "late_ns"),
                     on=["step", "process_group", "op", "ordinal"], nulls_equal=True).filter(pl.col("late_ns") > 0)
    if late.height == 0 or me.activity.height == 0:
        return _doing_empty(), 0.0
    totals: dict[tuple[str, str], int] = {}
    window_ns = 0
    for (step,), g in late.group_by("step", maintain_order=True):
        end = g.get_column("arrive_ns").to_numpy()
        lo, hi = union(end - g.get_column("late_ns").to_numpy().astype(np.int64), end)
        window_ns += int((hi - lo).sum())
        act = me.activity.filter(pl.col("step") == step)
        for kind, name, a, b in act.select("kind", "name", "start_ns", "end_ns").iter_rows():
            overlap = int(np.clip(np.minimum(hi, b) - np.maximum(lo, a), 0, None).sum())
            if overlap:
                totals[(kind, name)] = totals.get((kind, name), 0) + overlap
        # Time with nothing of any kind open: the profiler saw no annotation, op or Python frame.
        a_s, a_e = union(act.get_column("start_ns").to_numpy(), act.get_column("end_ns").to_numpy())
        seen = sum(int(np.clip(np.minimum(hi, b) - np.maximum(lo, a), 0, None).sum())
                   for a, b in zip(a_s, a_e, strict=True))
        totals[UNRECORDED] = totals.get(UNRECORDED, 0) + int((hi - lo).sum()) - seen
    if window_ns == 0:
        return _doing_empty(), 0.0
    rows = [{"kind": k, "name": n, "ns_per_step": v / n_steps, "share": v / window_ns} for (k, n), v in totals.items()
            if v > 0]
    out = pl.DataFrame(rows, schema=_doing_empty().schema) if rows else _doing_empty()
    return out.sort(["kind", "ns_per_step", "name"], descending=[False, True, False]), window_ns / n_steps
