"""Judging a pipeline: overlapped or serialized, which stage sets the period, the OverlapScore gate,
period spikes, and a comparison of two configurations (``--vs``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracewhy.analyses.pipeline import ChunkCol, PipelineResult
from tracewhy.analyses.shift import Shift, hodges_lehmann
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.model import Finding, Severity
from tracewhy.units import fmt_ns

OVERLAPPED = "overlapped"
SERIALIZED = "serialized"
NOT_MEASURED = "not measured"
PASS, FAIL = "pass", "fail"


@dataclass(frozen=True)
class PipelineVerdict:
    """``verdict``: which of max(stages) (overlapped) or sum(stages) (serialized) the median period
    is closer to; ``critical_stage``: the stage with the largest median work, which sets the period
    when the stages overlap; ``gate``: the median OverlapScore against ``min_overlap``."""

    verdict: str
    critical_stage: str | None
    gate: str
    min_overlap: float
    median_overlap_score: float | None
    statement: str


@dataclass(frozen=True)
class PipelineComparison:
    """B against A (``--vs``): the change in period and in OverlapScore per chunk."""

    period: Shift | None
    overlap_score: Shift | None
    statement: str


def judge(r: PipelineResult, min_overlap: float = th.PIPELINE_MIN_OVERLAP) -> tuple[PipelineVerdict, list[Finding]]:
    period = r.summary[ChunkCol.PERIOD].p50
    stage_p50 = {s.name: r.summary[ChunkCol.stage(s.name)].p50 for s in r.spec.stages}
    score = r.summary[ChunkCol.SCORE].p50
    known = {k: v for k, v in stage_p50.items() if v is not None}
    if period is None or len(known) != len(stage_p50) or score is None:
        why = f"fewer than one steady chunk with every mark (warm-up {r.warmup} chunks)"
        return PipelineVerdict(NOT_MEASURED, None, NOT_MEASURED, min_overlap, None, why), []
    critical = max(known, key=lambda k: known[k])
    longest, total = known[critical], sum(known.values())
    verdict = OVERLAPPED if abs(period - longest) <= abs(period - total) else SERIALIZED
    gate = PASS if score >= min_overlap else FAIL
    stages = " + ".join(f"{name} {fmt_ns(v)}" for name, v in known.items())
    longest_text = f"the longest stage ({critical} {fmt_ns(longest)})"
    sum_text = f"the sum of the stages ({stages} = {fmt_ns(total)})"
    near, far = (longest_text, sum_text) if verdict == OVERLAPPED else (sum_text, longest_text)
    statement = (
        f"median period {fmt_ns(period)} is closer to {near} than to {far}: {verdict}; median OverlapScore "
        f"{score:.2f} ({'>=' if gate == PASS else '<'} {min_overlap:.2f}: {gate})"
    )
    v = PipelineVerdict(verdict, critical, gate, min_overlap, score, statement)
    return v, _findings(r, v, period, longest, total)


def _findings(r: PipelineResult, v: PipelineVerdict, period: float, longest: float, total: float) -> list[Finding]:
    out: list[Finding] = []
    steady = r.summary[ChunkCol.PERIOD].count
    evidence = {"period_p50_ns": period, "longest_stage_ns": longest, "stages_sum_ns": total,
                "critical_stage": v.critical_stage, "overlap_score_p50": v.median_overlap_score,
                "steady_chunks": steady, "warmup_chunks": r.warmup, "stage_ranks": r.stage_ranks}
    if v.gate == FAIL:
        recoverable = max(0.0, period - longest)
        out.append(Finding(
            code=Code.PIPELINE_SERIALIZED if v.verdict == SERIALIZED else Code.PIPELINE_OVERLAP_LOW,
            severity=Severity.HIGH if recoverable >= th.HIGH_SEVERITY_SHARE * period else Severity.MEDIUM,
            statement=(f"The pipeline stages {_how(v.verdict)}: {v.statement}. "
                       f"Overlapped, the period would be about {fmt_ns(longest)} "
                       f"({fmt_ns(recoverable)} less per chunk)."),
            next_step=("Keep more chunks in flight (a deeper queue between stages, D=2 or more) and make the hand-off "
                       "asynchronous (isend/irecv, non-blocking copies), so stage 0 works on chunk k+1 while the next "
                       "stage computes chunk k; then rerun `tracewhy pipeline LOGS --vs NEW_LOGS`."),
            recoverable_ns_per_step=round(recoverable),
            evidence=evidence,
        ))
    p = r.summary[ChunkCol.PERIOD]
    if p.p50 and p.p99 is not None and p.p99 > th.PIPELINE_SPIKE_RATIO * p.p50 and steady >= th.MIN_STEADY_STEPS:
        spikes = r.chunks.filter(r.chunks.get_column(ChunkCol.STEADY)
                                 & (r.chunks.get_column(ChunkCol.PERIOD) > th.PIPELINE_SPIKE_RATIO * p.p50))
        out.append(Finding(
            code=Code.PIPELINE_PERIOD_SPIKES,
            severity=Severity.LOW,
            statement=(f"{spikes.height} of {steady} steady chunks took over {th.PIPELINE_SPIKE_RATIO:g}x the median "
                       f"period (p99 {fmt_ns(p.p99)} vs p50 {fmt_ns(p.p50)}): chunks "
                       f"{', '.join(str(c) for c in spikes.get_column(ChunkCol.CHUNK).to_list()[:10])}."),
            next_step=("Look at those chunks' blocks (`tracewhy blocks LOGS`) and at a profiler trace of the same "
                       "chunks for allocator calls, GC or a synchronize."),
            recoverable_ns_per_step=0,
            evidence={"period_p99_ns": p.p99, "period_p50_ns": p.p50,
                      "chunks": spikes.get_column(ChunkCol.CHUNK).to_list()},
        ))
    return out


def _how(verdict: str) -> str:
    return "run one after the other" if verdict == SERIALIZED else "barely overlap"


def compare(a: PipelineResult, b: PipelineResult) -> PipelineComparison:
    """B against A per steady chunk, with ``diff``'s Hodges-Lehmann shift and interval."""
    def values(r: PipelineResult, col: str) -> np.ndarray:
        s = r.chunks.filter(r.chunks.get_column(ChunkCol.STEADY)).get_column(col).drop_nulls()
        return s.to_numpy().astype(np.float64)

    period_a, period_b = values(a, ChunkCol.PERIOD), values(b, ChunkCol.PERIOD)
    score_a, score_b = values(a, ChunkCol.SCORE), values(b, ChunkCol.SCORE)
    period = hodges_lehmann(period_a, period_b, th.DIFF_CONFIDENCE) if period_a.size and period_b.size else None
    score = hodges_lehmann(score_a, score_b, th.DIFF_CONFIDENCE) if score_a.size and score_b.size else None
    if period is None or score is None:
        return PipelineComparison(period, score, "not measured: a side has no steady chunk with every mark")
    parts = [_say("period", period, fmt_ns), _say("OverlapScore", score, lambda x: f"{x:.2f}")]
    return PipelineComparison(period, score, "; ".join(parts))


def _say(what: str, s: Shift, fmt: object) -> str:
    show = fmt if callable(fmt) else str
    change = f"{what} {show(s.a_median_ns)} -> {show(s.b_median_ns)}"
    if s.ci_low_ns is None or s.ci_high_ns is None:
        return f"{change} (too few chunks for a {s.requested_confidence:.0%} interval)"
    excludes = s.ci_low_ns > 0 or s.ci_high_ns < 0
    return (f"{change}, shift {show(s.hl_shift_ns)}, {s.confidence:.1%} CI [{show(s.ci_low_ns)}, "
            f"{show(s.ci_high_ns)}]: {'a real change' if excludes else 'within noise'}")
