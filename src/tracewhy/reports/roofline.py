"""``roofline``: why is this kernel slow. Given an Nsight Compute report (.ncu-rep or an ncu CSV
export), each kernel's verdict (memory-, compute- or latency-bound, and why), run by run when the
file holds several ncu runs; given a PyTorch profiler trace that recorded shapes, a first
roofline of each operator from its input shapes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

import polars as pl

from tracewhy.analyses.roofline import RooflineOptions
from tracewhy.analyses.roofline_ops import OpRooflineOptions
from tracewhy.errors import TraceError
from tracewhy.findings.roofline import NcuRooflineResult, roofline
from tracewhy.findings.roofline_ops import OpRooflineResult, op_roofline
from tracewhy.model.ncu import NcuRun
from tracewhy.readers.registry import InputKind, detect, read_kernel_metrics, suffixes
from tracewhy.reports.inputs import PLAIN, Loader
from tracewhy.rows import Rows

#: The column of ``NcuRunsReport.kernels`` naming the run a kernel's row is of.
RUN: Final = "run"


@dataclass(frozen=True)
class RooflineReportOptions:
    #: The GPU of the peak table when the input does not name one (e.g. 'H100 SXM').
    device: str | None = None


@dataclass(frozen=True)
class NcuRooflineReport(Rows, rows="result.kernels", key="name"):
    """The verdicts of an Nsight Compute report with one run, and what its reader warned of."""

    result: NcuRooflineResult
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class NcuRunsReport(Rows, rows="kernels", key="name"):
    """The verdicts of each run of an ncu CSV holding several (exports appended into one file);
    ``kernels``: every run's kernel verdicts in one table, each row with its ``run`` (the index)."""

    path: str
    runs: list[tuple[NcuRun, NcuRooflineResult]]
    warnings: tuple[str, ...]
    kernels: pl.DataFrame


def roofline_report(path: str | Path, options: RooflineReportOptions | None = None, loader: Loader = PLAIN
                    ) -> NcuRooflineReport | NcuRunsReport | OpRooflineResult:
    """The roofline of the report or trace at ``path``, told by its content (an ncu CSV also by its name)."""
    options = options or RooflineReportOptions()
    file = Path(path)
    if not file.exists():
        raise TraceError(file, "no such file")
    timeline = detect(file, (InputKind.TIMELINE,))
    if timeline is not None and timeline.operator_shapes:
        return op_roofline(loader.trace(str(path)), OpRooflineOptions(device=options.device))
    metrics = detect(file, (InputKind.KERNEL_METRICS,))
    if metrics is None and file.suffix not in suffixes(InputKind.KERNEL_METRICS):
        raise TraceError(file, "not a PyTorch profiler trace, an .ncu-rep report or an ncu CSV export")
    report = read_kernel_metrics(file, metrics)
    # What the reader skipped or reinterpreted: on stderr (before the table, also with --json),
    # and the same lines under "warnings" in the JSON, as for traces.
    loader.warn(file, report.warnings)
    measured = RooflineOptions(device=options.device)
    if len(report.runs) > 1:
        runs = [(run, roofline(report.run_report(run.index), measured)) for run in report.runs]
        kernels = pl.concat([r.kernels.with_columns(pl.lit(run.index, pl.Int64).alias(RUN)) for run, r in runs],
                            how="diagonal_relaxed")
        return NcuRunsReport(report.path, runs, tuple(report.warnings), kernels)
    return NcuRooflineReport(roofline(report, measured), tuple(report.warnings))
