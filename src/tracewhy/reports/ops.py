"""``ops``: per operator (or operator and input shapes), calls, CPU total and self time, and the
GPU time of the work it launched."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tracewhy.analyses.ops import SORT_KEYS, OpsOptions, OpsResult, ops
from tracewhy.readers.registry import read_kernel_provenance
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource

#: The columns the rows may be sorted by (``--sort``).
OPS_SORT_KEYS: Final = SORT_KEYS


@dataclass(frozen=True)
class OpsReportOptions:
    #: One row per operator and input shapes (needs record_shapes).
    by_shapes: bool = False
    #: One of ``OPS_SORT_KEYS``; None: GPU self time, or CPU self time on a CPU-only trace.
    sort_by: str | None = None
    #: A TORCH_TRACE directory (or log) or TORCH_LOGS=output_code capture of the same run.
    logs: Path | None = None


def ops_report(trace: TraceSource, options: OpsReportOptions | None = None, loader: Loader = PLAIN) -> OpsResult:
    options = options or OpsReportOptions()
    provenance = None
    if options.logs is not None:
        provenance = read_kernel_provenance(options.logs)
        if provenance.warnings:
            loader.warn(options.logs, provenance.warnings)
    return ops(loader.trace(trace), OpsOptions(by_shapes=options.by_shapes, sort_by=options.sort_by,
                                               provenance=provenance))
