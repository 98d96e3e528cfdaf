"""``compile``: torch.compile's compiled regions, graph breaks, recompiles and compile time per
step, the cold start, and the compile findings; with the TORCH_LOGS="graph_breaks,recompiles"
capture of the same run (``--logs``), each break's reason and each recompile's failed guard."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tracewhy.analyses.compile import CompileResult, compile_analysis
from tracewhy.analyses.steps import StepsOptions, steps
from tracewhy.findings.compile import compile_findings
from tracewhy.findings.model import Finding
from tracewhy.model.torch_logs import TorchLogs
from tracewhy.readers.registry import read_compile_logs
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource
from tracewhy.rows import Rows


@dataclass(frozen=True)
class CompileReportOptions:
    step_marker: str | None = None
    warmup: int | None = None
    #: The stderr of the run with TORCH_LOGS="graph_breaks,recompiles" (plain or .gz).
    torch_logs: Path | None = None


@dataclass(frozen=True)
class CompileReport(Rows, rows="result.per_step"):
    """The compile analysis, the TORCH_LOGS capture when given, and the findings on them."""

    result: CompileResult
    logs: TorchLogs | None
    findings: list[Finding]


def compile_report(trace: TraceSource, options: CompileReportOptions | None = None,
                   loader: Loader = PLAIN) -> CompileReport:
    """The compile report of ``trace``; the TORCH_LOGS capture or TORCH_TRACE directory, when given,
    is read first."""
    options = options or CompileReportOptions()
    logs = None
    if options.torch_logs is not None:
        logs = read_compile_logs(options.torch_logs)
        if logs.warnings:
            loader.warn(options.torch_logs, logs.warnings)
    t = loader.trace(trace)
    if logs is not None:  # a TORCH_TRACE directory of several ranks: the breaks of this trace's rank
        logs = logs.for_rank(t.meta.rank)
    steps_result = steps(t, StepsOptions(marker=options.step_marker, warmup=options.warmup))
    result = compile_analysis(t, steps_result)
    return CompileReport(result, logs, compile_findings(result,
                                                        steps_result.stats.p50_ns if steps_result.stats else None,
                                                        logs))
