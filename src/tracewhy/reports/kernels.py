"""``kernels``: GPU kernel time per kernel name and per family; with ``--ncu``, each kernel name
joined with the Nsight Compute verdict of that kernel (``roofline``'s)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tracewhy.analyses.kernels import KERNELS_NEED, KernelsResult, kernels
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True)
class KernelsReportOptions:
    #: An Nsight Compute report (.ncu-rep or ncu CSV) whose verdicts join the kernels by name.
    ncu: str | None = None


@dataclass(frozen=True)
class KernelsReport:
    """The kernel tables; ``joined``: the per-name table with ncu's verdicts (``--ncu``), else None."""

    result: KernelsResult
    joined: pl.DataFrame | None = None


def kernels_report(trace: TraceSource, options: KernelsReportOptions | None = None,
                   loader: Loader = PLAIN) -> KernelsReport:
    options = options or KernelsReportOptions()
    # Kernels only: on nsys input just the kernel table is read, as `nsys stats -r
    # cuda_gpu_kern_sum` does; the analysis refuses a Trace without kernels (Trace.require).
    r = kernels(loader.trace(trace, kinds=KERNELS_NEED))
    if options.ncu is None:
        return KernelsReport(r)
    # The roofline command's verdicts, matched to this trace's kernel names.
    from tracewhy.findings.roofline import join_ncu, roofline
    from tracewhy.readers.registry import read_kernel_metrics

    ncu = read_kernel_metrics(Path(options.ncu))
    loader.warn(options.ncu, ncu.warnings)
    return KernelsReport(r, join_ncu(r.by_name, roofline(ncu)))
