"""``lines``: which Python line is slow: per source frame, calls, host self and total time, the GPU
time of the work launched under it, sync points, ops and its share of the steady steps; and the
stacks a flame graph or a speedscope profile draws."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tracewhy.analyses.lines import SORT_KEYS, LinesOptions, LinesResult, lines
from tracewhy.analyses.steps import StepsOptions, steps
from tracewhy.readers.registry import read_kernel_provenance
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource

#: The columns the rows may be sorted by (``--sort``).
LINES_SORT_KEYS: Final = SORT_KEYS


@dataclass(frozen=True)
class LinesReportOptions:
    #: List library, torch and standard-library frames as rows too.
    include_library: bool = False
    #: One of ``LINES_SORT_KEYS``; None: GPU self time, or host self time on a CPU-only trace.
    sort_by: str | None = None
    step_marker: str | None = None
    warmup: int | None = None
    #: A TORCH_TRACE directory (or log) or TORCH_LOGS=output_code capture of the same run: compiled
    #: kernels' time goes to the source lines they fuse.
    logs: Path | None = None


def lines_report(trace: TraceSource, options: LinesReportOptions | None = None, loader: Loader = PLAIN) -> LinesResult:
    options = options or LinesReportOptions()
    provenance = None
    if options.logs is not None:
        provenance = read_kernel_provenance(options.logs)
        if provenance.warnings:
            loader.warn(options.logs, provenance.warnings)
    t = loader.trace(trace)
    steps_result = steps(t, StepsOptions(marker=options.step_marker, warmup=options.warmup))
    return lines(t, LinesOptions(include_library=options.include_library, sort_by=options.sort_by,
                                 provenance=provenance), steps_result=steps_result)
