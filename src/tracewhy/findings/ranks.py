"""Many ranks: the straggler (with what it did while the others waited), compute imbalance, and
collectives the ranks did not issue alike (a hang risk). Judged from a ``RanksResult``."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import polars as pl

from tracewhy.analyses.rank_compare import RanksResult
from tracewhy.analyses.ranks import RankSummary
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.collective_bandwidth import slow_transfer_findings
from tracewhy.findings.model import Finding, Severity, rank

#: Mismatches named in the statement; the evidence keeps them all.
_NAMED: int = 3


def rank_findings(r: RanksResult) -> list[Finding]:
    """Findings of a ``ranks`` run, ranked; only ``ranks-not-one-job`` when the files are not one
    job's ranks (their per-rank numbers are nothing to compare)."""
    if r.not_one_job:
        return [_not_one_job(r)]
    out = [f for f in (_straggler(r), _imbalance(r)) if f is not None]
    out += _mismatches(r)
    out += slow_transfer_findings(r.matched, r.steps_compared)
    return rank(out)


def _not_one_job(r: RanksResult) -> Finding:
    return Finding(
        code=Code.RANKS_NOT_ONE_JOB, severity=Severity.TRUST,
        statement=(f"These files do not look like the ranks of one job: {'; '.join(r.not_one_job)}. No straggler, "
                   "imbalance or collective mismatch is judged across them."),
        next_step="Give tracewhy ranks the traces of one run, one file per rank (tracewhy info shows each file's "
                  "rank, world size and GPUs); to compare two runs, use tracewhy diff A B.",
        evidence={"differences": list(r.not_one_job), "ranks": r.ranks.get_column("rank").to_list()},
    )


@dataclass(frozen=True)
class Instead:
    """Where a rank spent more time per step than the median of the other ranks."""

    what: str
    excess_ns: float
    own_ns: float
    others_ns: float


def what_instead(me: RankSummary, others: list[RankSummary]) -> Instead | None:
    """The block, host gap, GPU compute or input time in which this rank exceeds the others most."""
    cands: list[Instead] = []

    def add(what: str, own: float | None, theirs: list[float | None]) -> None:
        vals = [v for v in theirs if v is not None]
        if own is None or not vals:
            return
        med = statistics.median(vals)
        cands.append(Instead(what, own - med, own, med))

    def table(s: RankSummary, kind: str) -> dict[str, float]:
        if kind == "block":
            return dict(zip(s.blocks.get_column("name").to_list(), s.blocks.get_column("ns_per_step").to_list(),
                            strict=True))
        return {f"an unrecorded gap between {a!r} and {b!r}": v
                for a, b, v in s.gaps.select("after", "before", "ns_per_step").iter_rows()}

    for kind in ("block", "gap"):
        mine = table(me, kind)
        theirs = [table(o, kind) for o in others]
        for key, own in mine.items():
            add(f"{key!r}" if kind == "block" else key, own, [t.get(key, 0.0) for t in theirs])
    add("GPU compute", me.compute_ns_per_step, [o.compute_ns_per_step for o in others])
    add("input loading (DataLoader)", me.input_ns_per_step, [o.input_ns_per_step for o in others])
    best = max(cands, key=lambda c: c.excess_ns, default=None)
    return best if best is not None and best.excess_ns > 0 else None


def _straggler(r: RanksResult) -> Finding | None:
    """The rank the others waited for longest, whenever that waiting is a material share of the
    step; how often it arrived last is context, not the criterion."""
    if r.straggler is None or r.straggler_wait_share is None or r.straggler_last_share is None:
        return None
    row = r.ranks.filter(pl.col("rank") == r.straggler).row(0, named=True)
    matched = r.matched.filter(pl.col("last_rank").is_not_null()).height
    # late_ns_per_step is a mean over the steps, so it is a share of the mean step.
    steps = [s for s in r.ranks.get_column("step_mean_ns").to_list() if s is not None]
    step_ns = statistics.median(steps) if steps else None
    late = row["late_ns_per_step"]
    if step_ns and late < th.STRAGGLER_MIN_LATE_SHARE * step_ns:
        return None
    me = next(s for s in r.summaries if s.rank == r.straggler)
    others = [s for s in r.summaries if s.rank != r.straggler]
    instead = what_instead(me, others)
    unit = "ms/step" if r.steps_compared else "ms over the trace"
    of_step = f" ({100 * late / step_ns:.0f}% of the {step_ns / 1e6:.2f} ms mean step)" if step_ns else ""
    while_ = _while_waited(r, unit)
    doing = ""
    # The whole-step comparison is named only when its excess could account for a material part
    # of the wait (a 0.01 ms difference in some block explains nothing of a 20 ms wait).
    if instead is not None and instead.excess_ns >= th.STRAGGLER_DOING_MIN_SHARE * late:
        doing = (f" Over the whole step rank {r.straggler} spent {instead.own_ns / 1e6:.2f} {unit} in {instead.what} "
                 f"(other ranks: {instead.others_ns / 1e6:.2f}).")
    per_step = r.lateness.filter(pl.col("rank") == r.straggler).select("step", "late_ns").to_dicts()
    return Finding(
        code=Code.RANK_STRAGGLER,
        severity=Severity.HIGH if step_ns and late >= th.EXPOSED_COMM_HIGH_SHARE * step_ns else Severity.MEDIUM,
        statement=(
            f"rank {r.straggler} is the straggler: the other ranks waited {late / 1e6:.2f} {unit} for it{of_step}, "
            f"{100 * r.straggler_wait_share:.0f}% of all waiting at matched collectives; it arrived last at "
            f"{row['last_count']} of {matched} of them ({100 * r.straggler_last_share:.0f}%).{while_}{doing}"
        ),
        next_step=(
            f"Look at rank {r.straggler} alone: tracewhy gaps and tracewhy blocks on {me.source}; compare its "
            "host (data loading, Python, logging, checkpointing)"
            # GPU clocks are worth checking only on ranks whose traces hold GPU work.
            + (" and GPU (clocks, thermal)" if me.compute_ns_per_step is not None else "") + " with a fast rank."
        ),
        recoverable_ns_per_step=int(late),
        evidence={"rank": r.straggler, "last_count": row["last_count"], "matched": matched,
                  "late_ns_per_step": late, "wait_share": r.straggler_wait_share,
                  "step_ns": step_ns, "late_share_of_step": late / step_ns if step_ns else None,
                  "late_ns_by_step": per_step, "while_waited": _top_doing(r),
                  "while_waited_window_ns_per_step": r.doing_window_ns_per_step,
                  "instead": None if instead is None else instead.__dict__},
    )


#: How ``doing`` kinds read in a statement, in the order named.
_KIND_WORDS = (("annotation", "annotation"), ("op", "op"), ("python", "Python frame"),
               ("unrecorded", "nothing the profiler recorded"))


def _top_doing(r: RanksResult) -> dict[str, dict[str, str | float]]:
    """Per kind, the slice that was open longest while the others waited for the straggler
    (name, ns_per_step, share of the window), where that is a material share."""
    out: dict[str, dict[str, str | float]] = {}
    for kind, _ in _KIND_WORDS:
        k = r.doing.filter(pl.col("kind") == kind)
        if k.height:
            _, name, ns, share = k.row(0)
            if share >= th.STRAGGLER_DOING_MIN_SHARE:
                out[kind] = {"name": name, "ns_per_step": ns, "share": share}
    return out


def _while_waited(r: RanksResult, unit: str) -> str:
    top = _top_doing(r)
    if not top:
        return ""
    def said(kind: str, word: str) -> str:
        what = word if kind == "unrecorded" else f"{word} {top[kind]['name']!r}"
        return f"{what} {float(top[kind]['ns_per_step']) / 1e6:.2f} {unit} ({100 * float(top[kind]['share']):.0f}%)"

    named = "; ".join(said(k, word) for k, word in _KIND_WORDS if k in top)
    return (f" While they waited ({r.doing_window_ns_per_step / 1e6:.2f} {unit} on its own clock, before it "
            f"reached those calls), rank {r.straggler}'s step thread was in: {named}.")


def _imbalance(r: RanksResult) -> Finding | None:
    c = r.ranks.filter(pl.col("compute_ns_per_step").is_not_null())
    if c.height < 2:
        return None
    values = c.get_column("compute_ns_per_step").to_list()
    med = statistics.median(values)
    top = c.sort(["compute_ns_per_step", "rank"], descending=[True, False]).row(0, named=True)
    excess = top["compute_ns_per_step"] - med
    if med <= 0 or excess / med < th.RANK_IMBALANCE_MIN_SHARE:
        return None
    low = min(values)
    return Finding(
        code=Code.RANK_IMBALANCE, severity=Severity.MEDIUM,
        statement=(
            f"GPU compute per step differs across ranks: rank {top['rank']} computes "
            f"{top['compute_ns_per_step'] / 1e6:.2f} ms/step, {100 * excess / med:.0f}% above the median "
            f"{med / 1e6:.2f} ms (lowest {low / 1e6:.2f} ms); every collective waits for the slowest."
        ),
        next_step="Balance the work per rank: uneven sharding, variable sequence lengths or batch sizes per rank; "
                  "compare tracewhy kernels on the slowest and the fastest rank.",
        recoverable_ns_per_step=int(excess),
        evidence={"compute_ns_per_step": dict(zip(c.get_column("rank").to_list(), values, strict=True)),
                  "median_ns": med},
    )


def _mismatches(r: RanksResult) -> list[Finding]:
    explained = r.mismatches.filter(pl.col("cut_explains"))
    m = r.mismatches.filter(~pl.col("cut_explains"))
    out: list[Finding] = []
    if explained.height:
        cut = sorted(r.ranks.filter(pl.col("incomplete").is_not_null()).get_column("rank").to_list())
        out.append(Finding(
            code=Code.RANK_TRACE_INCOMPLETE, severity=Severity.TRUST,
            statement=(f"Rank(s) {', '.join(map(str, cut))} have incomplete traces, which explains "
                       f"{explained.height} collective(s) the other ranks issued and they did not: these are "
                       "missing from the file, not a sign that the ranks diverged."),
            next_step="Let every rank's profiler finish before the job ends, then compare again; tracewhy info on the "
                      "cut file says what is missing.",
            evidence={"ranks": cut, "mismatches": explained.to_dicts()},
        ))
    if m.height == 0:
        return out
    named = "; ".join(
        f"step {x['step']}, group {x['process_group'] or '(not recorded)'}, {x['op'] or 'order'}: {x['detail']}"
        for x in m.head(_NAMED).iter_rows(named=True)
    )
    kinds = sorted(set(m.get_column("kind").to_list()))
    return [*out, Finding(
        code=Code.RANK_COLLECTIVE_MISMATCH, severity=Severity.HIGH,
        statement=(f"The ranks did not issue the same collectives ({m.height} mismatches: {', '.join(kinds)}): "
                   f"{named}. Mismatched collectives hang the job or corrupt results."),
        next_step="Find the rank-dependent branch around these calls; run with TORCH_DISTRIBUTED_DEBUG=DETAIL "
                  # NCCL's own desync check, only where the ranks run NCCL.
                  + ("(and TORCH_NCCL_DESYNC_DEBUG=1) " if any("nccl" in (s.backend or "") for s in r.summaries)
                     else "") + "to have PyTorch check collective order at runtime.",
        evidence={"mismatches": m.to_dicts()},
    )]
