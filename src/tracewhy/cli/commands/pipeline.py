from __future__ import annotations

import argparse
from pathlib import Path

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.cli.throughput import add_throughput_options, throughput_options
from tracewhy.renderers.pipeline import (
    PipelinePayload,
    PipelineThroughputPayload,
    PipelineVsPayload,
    PipelineVsThroughputPayload,
    pipeline_output,
)
from tracewhy.reports.pipeline import (
    MIN_OVERLAP,
    PERIOD_MARK,
    WARMUP_CHUNKS,
    PipelineReportOptions,
    pipeline_report,
    stage_spec,
)


class PipelineCommand(Command):
    """Pipeline stages from instrument logs: period, stage work, hidden time and OverlapScore per chunk.

    Reads rank logs written by tracewhy.instrument's StageClock (files or directories of
    *.jsonl). Every quantity is a difference of two marks on one rank's own clock. Exits 1 when
    the median OverlapScore after warm-up is under --min-overlap, or cannot be measured (unless
    --allow-unmeasured) (a CI gate); 3 when no chunk's marks are possible.
    """

    name = "pipeline"
    json_payloads = (PipelinePayload, PipelineVsPayload, PipelineThroughputPayload, PipelineVsThroughputPayload)
    takes_trace = False

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("paths", nargs="+", metavar="LOGS", help="rank logs (.jsonl) or directories of them")
        add_output_options(parser)
        parser.add_argument("--warmup", type=positive_int, default=WARMUP_CHUNKS, metavar="N",
                            help=f"chunks left out as warm-up (default {WARMUP_CHUNKS})")
        parser.add_argument("--min-overlap", type=_share, default=MIN_OVERLAP, metavar="X",
                            help=f"gate: the median OverlapScore must reach X (default {MIN_OVERLAP:g})")
        parser.add_argument("--stages", metavar="SPEC",
                            help="other mark names: 'prep=tA0:tA1+tDecode:tEmit,compute=tB0:tB1' (stage = sum of "
                                 "START:END intervals, all marks of a stage on one rank)")
        parser.add_argument("--period", metavar="MARK", default=None,
                            help=f"the mark whose spacing is the period (default {PERIOD_MARK})")
        parser.add_argument("--allow-unmeasured", action="store_true",
                            help="pass the gate when it cannot be measured (no steady chunk with every mark); "
                                 "by default that fails, as in `check`")
        parser.add_argument("--vs", nargs="+", metavar="LOGS", help="a second configuration to compare (B vs A)")
        add_throughput_options(parser, per="chunk")

    def run(self, args: argparse.Namespace) -> int:
        spec = stage_spec(args.stages, args.period)  # (a malformed --stages is said before anything is read)
        options = PipelineReportOptions(spec=spec, warmup=args.warmup, min_overlap=args.min_overlap,
                                        vs=tuple(Path(p) for p in args.vs or ()), rate=throughput_options(args),
                                        allow_unmeasured=args.allow_unmeasured)
        r = pipeline_report([Path(p) for p in args.paths], options, loader())
        emit(args, self.name, *pipeline_output(r, args.top))
        return 1 if r.gate_failed else 0


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
