"""``nvtx``: per NVTX range name (on Kineto input, per user annotation: record_function scopes and
ProfilerStep#N), its time as ``nsys stats -r nvtx_sum`` gives it and its GPU projection as
``nvtx_gpu_proj_sum`` does."""

from __future__ import annotations

from tracewhy.analyses.nvtx_ranges import NvtxRangesResult, nvtx_ranges
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource


def nvtx_report(trace: TraceSource, loader: Loader = PLAIN) -> NvtxRangesResult:
    return nvtx_ranges(loader.trace(trace))
