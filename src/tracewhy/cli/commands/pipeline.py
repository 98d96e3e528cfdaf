from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracewhy.analyses.pipeline import (
    DEFAULT_SPEC,
    DEFAULT_WARMUP,
    ChunkCol,
    PipelineResult,
    PipelineSpec,
    parse_stages,
    pipeline,
)
from tracewhy.analyses.throughput import Throughput, ThroughputOptions, throughput
from tracewhy.cli.base import Command, add_output_options, emit, positive_int, warn
from tracewhy.cli.throughput import add_throughput_options, throughput_options
from tracewhy.findings import thresholds as th
from tracewhy.findings.pipeline import FAIL, compare, judge
from tracewhy.readers.registry import read_stage_logs
from tracewhy.renderers.pipeline import (
    PipelinePayload,
    PipelineThroughputPayload,
    PipelineVsPayload,
    PipelineVsThroughputPayload,
    pipeline_payload,
    render_pipeline,
)
from tracewhy.renderers.throughput import with_throughput, with_throughput_change


class PipelineCommand(Command):
    """Pipeline stages from instrument logs: period, stage work, hidden time and OverlapScore per chunk.

    Reads rank logs written by tracewhy.instrument's StageClock (files or directories of
    *.jsonl). Every quantity is a difference of two marks on one rank's own clock. Exits 1 when
    the median OverlapScore after warm-up is under --min-overlap (a CI gate).
    """

    name = "pipeline"
    json_payloads = (PipelinePayload, PipelineVsPayload, PipelineThroughputPayload, PipelineVsThroughputPayload)
    takes_trace = False

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("paths", nargs="+", metavar="LOGS", help="rank logs (.jsonl) or directories of them")
        add_output_options(parser)
        parser.add_argument("--warmup", type=positive_int, default=DEFAULT_WARMUP, metavar="N",
                            help=f"chunks left out as warm-up (default {DEFAULT_WARMUP})")
        parser.add_argument("--min-overlap", type=_share, default=th.PIPELINE_MIN_OVERLAP, metavar="X",
                            help=f"gate: the median OverlapScore must reach X (default {th.PIPELINE_MIN_OVERLAP:g})")
        parser.add_argument("--stages", metavar="SPEC",
                            help="other mark names: 'prep=tA0:tA1+tDecode:tEmit,compute=tB0:tB1' (stage = sum of "
                                 "START:END intervals, all marks of a stage on one rank)")
        parser.add_argument("--period", metavar="MARK", default=None,
                            help=f"the mark whose spacing is the period (default {DEFAULT_SPEC.period_mark})")
        parser.add_argument("--vs", nargs="+", metavar="LOGS", help="a second configuration to compare (B vs A)")
        add_throughput_options(parser, per="chunk")

    def run(self, args: argparse.Namespace) -> int:
        spec = _spec(args)
        rate = throughput_options(args)
        log = read_stage_logs([Path(p) for p in args.paths])
        warn(log.source, log.warnings)
        r = pipeline(log, spec, args.warmup)
        v, findings = judge(r, args.min_overlap)
        vs = None
        if args.vs:
            log_b = read_stage_logs([Path(p) for p in args.vs])
            warn(log_b.source, log_b.warnings)
            rb = pipeline(log_b, spec, args.warmup)
            vb, _ = judge(rb, args.min_overlap)
            vs = (rb, vb, compare(r, rb))
        payload: Mapping[str, Any]
        payload, view = pipeline_payload(r, v, findings, vs), lambda: render_pipeline(r, v, findings, args.top, vs)
        if rate is not None and vs is not None:
            payload, view = with_throughput_change(payload, view, rate, _per_chunk(r, rate), _per_chunk(vs[0], rate),
                                                   after=f"B vs A: {vs[2].statement}")
        elif rate is not None:
            payload, view = with_throughput(payload, view, rate, _per_chunk(r, rate))
        emit(args, self.name, payload, view)
        return 1 if v.gate == FAIL else 0


def _per_chunk(r: PipelineResult, rate: ThroughputOptions) -> Throughput | None:
    """Items per second at the steady chunks' period (one chunk leaves the pipeline per period)."""
    p = r.summary[ChunkCol.PERIOD]
    return throughput(p.p50, p.p90, p.mean, p.count, rate, per="chunk")


def _share(text: str) -> float:
    """``0.3`` or ``30%``; a bare number over 1 is refused (``30`` would be a 3000% score)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share like 0.3 or 30%, got {text!r}") from None
    if not raw.endswith("%") and value > 1:
        raise argparse.ArgumentTypeError(f"{text} is read as a fraction (OverlapScore lies between 0 and 1); "
                                         f"write {text}%")
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must lie between 0 and 1 (0% and 100%), got {text!r}")
    return value


def _spec(args: argparse.Namespace) -> PipelineSpec:
    period = args.period or DEFAULT_SPEC.period_mark
    if args.stages:
        return parse_stages(args.stages, period)
    return PipelineSpec(stages=DEFAULT_SPEC.stages, period_mark=period)
