"""The commands that take several inputs, inputs other than a timeline trace, or none, as
functions: ``diff`` and ``check`` (two runs), ``ranks`` (a trace per rank), ``pipeline``
(instrument logs), ``roofline`` (an Nsight Compute report or a shapes trace), ``which`` and
``schema``. Each calls its command's report with the command's defaults. Tables keep the
clock of each input where a result holds several (``ranks`` compares ranks by durations only;
``diff``'s tables hold no time points)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from tracewhy.analyses.throughput import items_and_unit, requested
from tracewhy.api.results import Diff, extended
from tracewhy.api.tables import Reads, Sources, TraceLike, handed_out, handed_out_one_or_several
from tracewhy.findings.roofline_ops import OpRooflineResult
from tracewhy.reports.check import CheckReport, CheckReportOptions, check_report, check_several
from tracewhy.reports.check_metrics import METRICS
from tracewhy.reports.diff import DiffReportOptions, diff_report
from tracewhy.reports.pipeline import (
    MIN_OVERLAP,
    WARMUP_CHUNKS,
    PipelineReport,
    PipelineReportOptions,
    pipeline_report,
    stage_spec,
)
from tracewhy.reports.ranks import RanksReport, RanksReportOptions, ranks_report, trace_files
from tracewhy.reports.roofline import NcuRooflineReport, NcuRunsReport, RooflineReportOptions, roofline_report
from tracewhy.reports.schema import FOLDER, shipped_path, shipped_text
from tracewhy.reports.several import SeveralReport
from tracewhy.reports.which import WhichReport, which_report

#: One path, or several (a list or tuple of them).
Paths = str | Path | Sequence[str | Path]


def diff(a: TraceLike, b: TraceLike, *, step: str | None = None, warmup: int | None = None,
         items_per_step: float | None = None, unit: str | None = None, tokens_per_step: float | None = None,
         top: int | None = None) -> Diff:
    """Run B against baseline A: faster, slower or within noise, and what changed (``tracewhy
    diff``); its rows are the operators' changes per step, largest first."""
    options = DiffReportOptions(step_marker=step, warmup=warmup,
                                rate=requested(items_per_step, unit, tokens_per_step))

    def make(reads: Reads) -> Diff:
        r = diff_report(a, b, options, reads.loader)
        return extended(Diff, r.comparison, throughput_a=r.throughput_a, throughput_b=r.throughput_b)

    return handed_out(None, make, top)


def check(trace: Sources, *, baseline: TraceLike | None = None, config: str | Path | None = None,
          step: str | None = None, warmup: int | None = None, allow_unmeasured: bool = False,
          allow_partial: bool = False, items_per_step: float | None = None, unit: str | None = None,
          tokens_per_step: float | None = None,
          **limits: str | float) -> CheckReport | SeveralReport[CheckReport]:
    """The CI gate (``tracewhy check``): ``max_gpu_idle="20%"``, ``max_step_p50="120ms"``, ... are
    the command's ``--max-gpu-idle 20%``, ``--max-step-p50 120ms``; ``report.passed`` is its exit
    status. ``config``: a pyproject.toml whose ``[tool.tracewhy.check]`` holds limits and
    settings (the keywords win); unlike the command, no pyproject.toml is looked for unasked.
    Results come in the command's order (that of its ``--help``), whatever the keywords' order.
    Several traces (a list, or a directory): a ``SeveralReport`` with each trace's gate
    (``all(t.result.passed for t in report)`` is the command's exit status)."""
    items_per_step, unit = items_and_unit(items_per_step, unit, tokens_per_step)
    typed = {key.replace("_", "-"): str(text) for key, text in limits.items()}
    order = {f"{bound}-{m.name}": i for i, m in enumerate(METRICS.values()) for bound in m.bounds}
    typed = dict(sorted(typed.items(), key=lambda kv: order.get(kv[0], len(order))))
    options = CheckReportOptions(
        limits=typed, config=str(config) if config is not None else None, find_config=False, baseline=baseline,
        step_marker=step, warmup=warmup, allow_unmeasured=allow_unmeasured or None,
        allow_partial=allow_partial or None, items_per_step=items_per_step, unit=unit)
    return handed_out_one_or_several(  # type: ignore[no-any-return]
        trace, lambda source, loader: check_report(source, options, loader),
        lambda sources, loader: check_several(sources, options, loader), _same)


def _same(value: Any) -> Any:
    return value


def ranks(*paths: Paths, step: str | None = None, warmup: int | None = None, workers: int | None = None,
          executor: str | None = None, top: int | None = None) -> RanksReport:
    """Many ranks compared (``tracewhy ranks``): a directory of rank traces, or the files. Each
    rank's own tables (``summaries``) keep that rank's clock."""
    files = trace_files(_flat(paths))
    options = RanksReportOptions(step_marker=step, warmup=warmup)
    return handed_out(None, lambda reads: ranks_report(files, options, workers=workers, executor=executor,
                                                       loader=reads.loader), top)


def pipeline(*logs: Paths, warmup: int = WARMUP_CHUNKS, min_overlap: float = MIN_OVERLAP, stages: str | None = None,
             period: str | None = None, vs: Paths = (), items_per_step: float | None = None, unit: str | None = None,
             tokens_per_step: float | None = None, top: int | None = None,
             allow_unmeasured: bool = False) -> PipelineReport:
    """Pipeline stages from instrument logs (``tracewhy pipeline``): period, stage work, hidden
    time and OverlapScore per chunk, and the gate (``report.gate_failed`` is its exit status)."""
    options = PipelineReportOptions(spec=stage_spec(stages, period), warmup=warmup, min_overlap=min_overlap,
                                    vs=tuple(Path(p) for p in _flat((vs,))),
                                    rate=requested(items_per_step, unit, tokens_per_step),
                                    allow_unmeasured=allow_unmeasured)
    paths = [Path(p) for p in _flat(logs)]
    return handed_out(None, lambda reads: pipeline_report(paths, options, reads.loader), top)


def roofline(path: str | Path, *, device: str | None = None, top: int | None = None
             ) -> NcuRooflineReport | NcuRunsReport | OpRooflineResult:
    """Why is this kernel slow (``tracewhy roofline``): each kernel's verdict from an Nsight
    Compute report (run by run in a CSV of several runs), or each operator's from a trace that
    recorded shapes."""
    return handed_out(path, lambda reads: roofline_report(path, RooflineReportOptions(device=device), reads.loader),
                      top)


def which(*symptom: str) -> WhichReport:
    """Which tool to run first for a symptom, with the exact capture command and what to look
    for (``tracewhy which``); every entry for no words."""
    return which_report(symptom)


def schema(command: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a command's ``--json`` document, as it is shipped
    (``tracewhy schema COMMAND``)."""
    folder = resources.files("tracewhy").joinpath(FOLDER)
    if not folder.joinpath(shipped_path(command)).is_file():
        names = sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))
        raise ValueError(f"no command {command!r} has a schema; one of {', '.join(names)}")
    shipped: dict[str, Any] = json.loads(shipped_text(command))
    return shipped


def _flat(paths: Sequence[Paths]) -> list[str]:
    """Each path given, one or a sequence of them, as strings."""
    out: list[str] = []
    for p in paths:
        out += [str(p)] if isinstance(p, (str, Path)) else [str(q) for q in p]
    return out
