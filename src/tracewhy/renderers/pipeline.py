"""``pipeline``: the chunks, the summary and the verdict of a pipeline's stages, as terminal tables
and as JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final, TypedDict

from tracewhy.analyses.pipeline import ChunkCol, Percentiles, PipelineResult
from tracewhy.findings.model import Finding
from tracewhy.findings.pipeline import PipelineComparison, PipelineVerdict
from tracewhy.renderers import View
from tracewhy.renderers.findings import render_findings
from tracewhy.renderers.layout import FitTable, Layout, label, number
from tracewhy.units import fmt_ns

if TYPE_CHECKING:
    from collections.abc import Mapping

    import polars as pl
    from rich.console import RenderableType

    from tracewhy.analyses.pipeline import CHUNKS_SCHEMA
    from tracewhy.renderers.json_schema import rows, times_under_ns_keys
    from tracewhy.renderers.throughput import ThroughputChangeJson, ThroughputJson
    from tracewhy.reports.pipeline import PipelineReport


#: Said in every output: the reason the metrics are differences of one rank's marks.
CLOCKS_NOTE = ("each quantity is a difference of two marks on one rank's own clock; "
               "timestamps of different ranks are never compared (their clocks are not aligned)")


class PercentilesJson(TypedDict):
    """A metric over the steady chunks (whole nanoseconds for a ``*_ns`` metric)."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    count: int


class PipelineStageJson(TypedDict):
    name: str
    #: (start mark, end mark) pairs whose durations add up to the stage's work.
    intervals: list[list[str]]
    #: The rank whose clock the stage is read on.
    rank: int


class _PipelineRun(TypedDict):
    chunks: Annotated[pl.DataFrame, rows(CHUNKS_SCHEMA, "one row per chunk with every mark",
                                         patterns={"_ns$": pl.Int64()})]
    #: p50/p90/p99 of each metric (period_ns, <stage>_ns, hidden_ns, overlap_score) over the steady chunks.
    summary: Annotated[dict[str, PercentilesJson], times_under_ns_keys(PercentilesJson)]
    #: "overlapped", "serialized", ... (findings.pipeline).
    verdict: str
    critical_stage: str | None
    #: The median OverlapScore against min_overlap: "pass" or "fail".
    gate: str
    overlap_score_p50: float | None


class PipelineVs(_PipelineRun):
    """``--vs``: configuration B, and B against A."""

    comparison: str


class PipelinePayload(_PipelineRun):
    """``pipeline``: per chunk the period, each stage's work, the hidden time and the OverlapScore,
    their percentiles over the steady chunks, and the verdict."""

    stages: list[PipelineStageJson]
    period_mark: str
    period_rank: int
    warmup_chunks: int
    #: Chunks missing a mark, left out.
    incomplete_chunks: list[int]
    #: (rank, chunk, name) recorded more than once: the first was used.
    duplicate_marks: int
    #: Chunk (as a string) -> why its marks are impossible (a stage going backwards, a mark recorded
    #: twice at different times, sums past int64): left out.
    rejected_chunks: dict[str, str]
    clocks: str
    min_overlap: float
    statement: str
    findings: list[Finding]


class PipelineVsPayload(PipelinePayload):
    """``pipeline --vs LOGS``: the same, with configuration B and the comparison."""

    vs: PipelineVs


class PipelineThroughputPayload(PipelinePayload):
    """``pipeline --items-per-step N``: with the throughput per chunk."""

    throughput: ThroughputJson | None


class PipelineVsThroughputPayload(PipelineVsPayload):
    """``pipeline --vs LOGS --items-per-step N``: A's and B's throughput and the change."""

    throughput: ThroughputChangeJson


def _pct(p: Percentiles) -> PercentilesJson:
    return {"p50": p.p50, "p90": p.p90, "p99": p.p99, "mean": p.mean, "count": p.count}


def pipeline_payload(r: PipelineResult, v: PipelineVerdict, findings: list[Finding],
                     vs: tuple[PipelineResult, PipelineVerdict, PipelineComparison] | None = None
                     ) -> PipelinePayload | PipelineVsPayload:
    """The JSON of ``pipeline``: ``chunks[]``, ``summary`` (p50/p90/p99 of each metric over the
    steady chunks), ``verdict``, ``critical_stage``, ``gate``; with ``--vs``, the same for B and the
    comparison."""
    out: PipelinePayload = {
        "stages": [{"name": s.name, "intervals": [list(i) for i in s.intervals], "rank": r.stage_ranks[s.name]}
                   for s in r.spec.stages],
        "period_mark": r.spec.period_mark, "period_rank": r.stage_ranks["period"],
        "warmup_chunks": r.warmup, "incomplete_chunks": r.incomplete_chunks,
        "duplicate_marks": r.duplicate_marks, "clocks": CLOCKS_NOTE,
        "rejected_chunks": {str(c): why for c, why in sorted(r.rejected_chunks.items())},
        "chunks": r.chunks, "summary": {k: _pct(p) for k, p in r.summary.items()},
        "verdict": v.verdict, "critical_stage": v.critical_stage, "gate": v.gate, "min_overlap": v.min_overlap,
        "overlap_score_p50": v.median_overlap_score, "statement": v.statement, "findings": findings,
    }
    if vs is None:
        return out
    rb, vb, c = vs
    return {**out, "vs": {
        "chunks": rb.chunks, "summary": {k: _pct(p) for k, p in rb.summary.items()}, "verdict": vb.verdict,
        "critical_stage": vb.critical_stage, "gate": vb.gate, "overlap_score_p50": vb.median_overlap_score,
        "comparison": c.statement,
    }}


def render_pipeline(r: PipelineResult, v: PipelineVerdict, findings: list[Finding], top: int,
                    vs: tuple[PipelineResult, PipelineVerdict, PipelineComparison] | None = None) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = [Text(f"{v.verdict}: {v.statement}", style="bold"), _summary(r, "A" if vs else "")]
    if vs is not None:
        rb, vb, c = vs
        parts += [Text(f"B {vb.verdict}: {vb.statement}", style="bold"), _summary(rb, "B"),
                  Text(f"B vs A: {c.statement}", style="bold")]
    chunks = _chunks_layout(r).table(f"chunks (first {top}; warm-up chunks marked)")
    stage_cols = [ChunkCol.stage(s.name) for s in r.spec.stages]
    for row in r.chunks.head(top).iter_rows(named=True):
        score = row[ChunkCol.SCORE]
        chunks.add_row(
            f"{row[ChunkCol.CHUNK]}{'' if row[ChunkCol.STEADY] else ' (warm-up)'}", _ns(row[ChunkCol.PERIOD]),
            *[_ns(row[c]) for c in stage_cols], _ns(row[ChunkCol.HIDDEN]), "-" if score is None else f"{score:.2f}")
    parts += [chunks, Text(CLOCKS_NOTE, style="dim")]
    if r.incomplete_chunks:
        parts.append(Text(f"{len(r.incomplete_chunks)} chunks lack a mark and are left out: "
                          f"{', '.join(map(str, r.incomplete_chunks[:10]))}", style="yellow"))
    if findings:
        parts.append(render_findings(findings))
    return Group(*parts)


def _chunks_layout(r: PipelineResult) -> Layout:
    """``pipeline`` chunks: the period, what is hidden and the score stay; the stages (in the
    summary above) leave a narrow terminal first, the last stage first."""
    stages = [s.name for s in r.spec.stages]
    return Layout((label("chunk", "right"), number("period"), *(number(s) for s in stages), number("hidden"),
                   number("OverlapScore")),
                  drop=tuple(reversed(stages)))


#: ``pipeline`` summary: the percentiles stay; the chunk count and which rank's clock leave first.
SUMMARY_TABLE: Final = Layout(
    (label("metric"), number("p50"), number("p90"), number("p99"), number("chunks"), number("rank's clock")),
    drop=("rank's clock", "chunks", "p99"))


def _summary(r: PipelineResult, side: str) -> FitTable:
    t = SUMMARY_TABLE.table(f"{side + ': ' if side else ''}steady chunks (after {r.warmup} warm-up): p50 / p90 / p99")
    for key, p in r.summary.items():
        score = key == ChunkCol.SCORE
        name = key.removesuffix("_ns")
        rank = r.stage_ranks.get(name, r.stage_ranks["period"] if name in ("period", "hidden") else None)
        t.add_row(name if not score else "OverlapScore",
                  *[(f"{x:.2f}" if x is not None else "-") if score else _ns(x) for x in (p.p50, p.p90, p.p99)],
                  str(p.count), "-" if score or name == "hidden" else str(rank))
    return t


def _ns(x: float | None) -> str:
    return "-" if x is None else fmt_ns(x)


def pipeline_output(r: PipelineReport, top: int) -> tuple[Mapping[str, Any], View]:
    """The payload and the view of ``pipeline``, with the throughput (A's, or A's and B's and the
    change, after the comparison) when it was asked for."""
    from tracewhy.renderers.throughput import with_throughput, with_throughput_change

    payload: Mapping[str, Any]
    payload, view = (pipeline_payload(r.result, r.verdict, r.findings, r.vs),
                     lambda: render_pipeline(r.result, r.verdict, r.findings, top, r.vs))
    if r.rate is not None and r.vs is not None:
        return with_throughput_change(payload, view, r.rate, r.throughput, r.throughput_vs,
                                      after=f"B vs A: {r.vs[2].statement}")
    if r.rate is not None:
        return with_throughput(payload, view, r.rate, r.throughput)
    return payload, view
