"""``pipeline``: the stages of a pipeline from instrument logs (``tracewhy.instrument``'s
StageClock marks): period, stage work, hidden time and OverlapScore per chunk, the verdict and
the gate on the median OverlapScore; with ``--vs``, a second configuration compared; with
``--items-per-step``, the throughput at the steady chunks' period."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tracewhy.analyses.pipeline import (
    DEFAULT_SPEC,
    DEFAULT_WARMUP,
    ChunkCol,
    PipelineResult,
    PipelineSpec,
    parse_stages,
    pipeline,
    summarize_rejected,
)
from tracewhy.analyses.throughput import Throughput, ThroughputOptions, throughput
from tracewhy.findings import thresholds as th
from tracewhy.findings.model import Finding
from tracewhy.findings.pipeline import FAIL, NOT_MEASURED, PipelineComparison, PipelineVerdict, compare, judge
from tracewhy.readers.registry import read_stage_logs
from tracewhy.reports.inputs import PLAIN, Loader
from tracewhy.rows import Rows

#: Chunks left out as warm-up by default.
WARMUP_CHUNKS: Final = DEFAULT_WARMUP
#: The gate's default: the median OverlapScore after warm-up must reach it.
MIN_OVERLAP: Final = th.PIPELINE_MIN_OVERLAP
#: The mark whose spacing is the period by default.
PERIOD_MARK: Final = DEFAULT_SPEC.period_mark


def stage_spec(stages: str | None = None, period: str | None = None) -> PipelineSpec:
    """The stages and the period mark: ``stages`` like 'prep=tA0:tA1+tDecode:tEmit,compute=tB0:tB1'
    (a UsageError when malformed), else the StageClock's own."""
    period = period or PERIOD_MARK
    if stages:
        return parse_stages(stages, period)
    return PipelineSpec(stages=DEFAULT_SPEC.stages, period_mark=period)


@dataclass(frozen=True)
class PipelineReportOptions:
    spec: PipelineSpec = DEFAULT_SPEC
    warmup: int = WARMUP_CHUNKS
    min_overlap: float = MIN_OVERLAP
    #: The rank logs of a second configuration, compared as B against A.
    vs: tuple[Path, ...] = ()
    #: Items per chunk, to say the period as throughput.
    rate: ThroughputOptions | None = None
    #: A gate that cannot be measured passes instead of failing (as ``check --allow-unmeasured``).
    allow_unmeasured: bool = False


@dataclass(frozen=True)
class PipelineReport(Rows, rows="result.chunks"):
    """The chunks, the verdict and findings; ``vs``: B's chunks, verdict and the comparison; with
    ``rate``, A's (and B's) throughput at the steady period."""

    result: PipelineResult
    verdict: PipelineVerdict
    findings: list[Finding]
    vs: tuple[PipelineResult, PipelineVerdict, PipelineComparison] | None = None
    rate: ThroughputOptions | None = None
    throughput: Throughput | None = None
    throughput_vs: Throughput | None = None
    allow_unmeasured: bool = False

    @property
    def gate_failed(self) -> bool:
        """The median OverlapScore is under the gate's minimum, or cannot be measured and that is
        not allowed: a CI gate that measured nothing must not pass."""
        return self.verdict.gate == FAIL or (self.verdict.gate == NOT_MEASURED and not self.allow_unmeasured)


def pipeline_report(paths: list[Path], options: PipelineReportOptions | None = None,
                    loader: Loader = PLAIN) -> PipelineReport:
    """The pipeline of the rank logs ``paths`` (files or directories of *.jsonl)."""
    options = options or PipelineReportOptions()
    log = read_stage_logs(paths)
    loader.warn(log.source, log.warnings)
    r = pipeline(log, options.spec, options.warmup)
    loader.warn(log.source, _rejections(r))
    v, findings = judge(r, options.min_overlap)
    vs = None
    if options.vs:
        log_b = read_stage_logs(list(options.vs))
        loader.warn(log_b.source, log_b.warnings)
        rb = pipeline(log_b, options.spec, options.warmup)
        loader.warn(log_b.source, _rejections(rb))
        vb, _ = judge(rb, options.min_overlap)
        vs = (rb, vb, compare(r, rb))
    rate = options.rate
    if rate is None:
        return PipelineReport(r, v, findings, vs, allow_unmeasured=options.allow_unmeasured)
    return PipelineReport(r, v, findings, vs, rate, _per_chunk(r, rate),
                          _per_chunk(vs[0], rate) if vs is not None else None, options.allow_unmeasured)


def _rejections(r: PipelineResult) -> list[str]:
    return [summarize_rejected(r.rejected_chunks)] if r.rejected_chunks else []


def _per_chunk(r: PipelineResult, rate: ThroughputOptions) -> Throughput | None:
    """Items per second at the steady chunks' period (one chunk leaves the pipeline per period)."""
    p = r.summary[ChunkCol.PERIOD]
    return throughput(p.p50, p.p90, p.mean, p.count, rate, per="chunk")
