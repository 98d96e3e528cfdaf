"""The commands that read one trace (or one input of another kind, told by content, as the
command does), as functions: each calls its command's report (``reports/``) with the command's
defaults and returns the typed result, its tables made public (``api/tables.py``) and, with
``top``, its first rows only. Options are the command's long options as keywords (``--min-gap``:
``min_gap``; ``--class``, a Python keyword, is ``gap_class``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tracewhy.analyses.blocks import BlocksResult
from tracewhy.analyses.critical_path import CriticalPathResult
from tracewhy.analyses.gaps import GapCol, GapsResult
from tracewhy.analyses.info import InfoResult
from tracewhy.analyses.kernels import KernelsResult
from tracewhy.analyses.lines import LinesResult
from tracewhy.analyses.log_blocks import LogBlocksResult
from tracewhy.analyses.nvtx_ranges import NvtxRangesResult
from tracewhy.analyses.ops import OpsResult
from tracewhy.analyses.overlap import OverlapResult
from tracewhy.analyses.sql import SqlResult
from tracewhy.analyses.summaries import (
    Summary,
    api_summary,
    kernel_summary,
    memory_size_summary,
    memory_time_summary,
)
from tracewhy.analyses.throughput import requested
from tracewhy.api.results import Diagnosis, Steps, extended
from tracewhy.api.tables import Reads, Sources, TraceLike, handed_out, handed_out_one_or_several, public
from tracewhy.reports.account import AccountReport, AccountReportOptions, account_report
from tracewhy.reports.blocks import BlocksReportOptions, blocks_report
from tracewhy.reports.compile import CompileReport, CompileReportOptions, compile_report
from tracewhy.reports.critical_path import CriticalPathReportOptions, critical_path_report
from tracewhy.reports.diagnose import DiagnoseReport, DiagnoseReportOptions, diagnose_report, diagnose_several
from tracewhy.reports.gaps import GapsReport, GapsReportOptions, gaps_report, gaps_several
from tracewhy.reports.info import InfoReportOptions, info_report
from tracewhy.reports.kernels import KernelsReportOptions, kernels_report
from tracewhy.reports.lines import LinesReportOptions, lines_report
from tracewhy.reports.memory import (
    MemoryGrowthReport,
    MemoryRanksReport,
    MemoryReportOptions,
    SnapshotMemoryReport,
    TimelineMemoryReport,
    TraceMemoryReport,
    memory_growth_report,
    memory_ranks_report,
    memory_report,
)
from tracewhy.reports.nvtx import nvtx_report
from tracewhy.reports.ops import OpsReportOptions, ops_report
from tracewhy.reports.overlap import OverlapReportOptions, overlap_report
from tracewhy.reports.several import SeveralReport
from tracewhy.reports.sql import SqlReportOptions, sql_report
from tracewhy.reports.steps import StepsReport, StepsReportOptions, steps_report, steps_several

_MIN_GAP_NS = GapsReportOptions().min_gap_ns
_GAINS = CriticalPathReportOptions().gain_items


def diagnose(trace: Sources, *, step: str | None = None, warmup: int | None = None, min_gap: int = _MIN_GAP_NS,
             logs: str | Path | None = None, items_per_step: float | None = None, unit: str | None = None,
             tokens_per_step: float | None = None, decode_bytes: int | None = None,
             top: int | None = None) -> Diagnosis | SeveralReport[Diagnosis]:
    """Ranked findings, each with evidence and the next step (``tracewhy diagnose``); ``logs``:
    the TORCH_LOGS capture or TORCH_TRACE directory of the run (``--logs``). Several traces (a list, or a directory): a
    ``SeveralReport`` whose rows are the traces, each with its Diagnosis (``.result``), grouped
    as ranks of one job or runs compared, as the command groups them."""
    options = DiagnoseReportOptions(step_marker=step, warmup=warmup, min_gap_ns=min_gap,
                                    torch_logs=Path(logs) if logs is not None else None,
                                    rate=requested(items_per_step, unit, tokens_per_step), decode_bytes=decode_bytes)

    def shown(r: DiagnoseReport) -> Diagnosis:
        return extended(Diagnosis, r.report, throughput=r.throughput)

    return handed_out_one_or_several(  # type: ignore[no-any-return]
        trace, lambda source, loader: diagnose_report(source, options, loader),
        lambda sources, loader: diagnose_several(sources, options, loader), shown, top)


def steps(trace: Sources, *, step: str | None = None, warmup: int | None = None,
          items_per_step: float | None = None, unit: str | None = None,
          tokens_per_step: float | None = None, decode_bytes: int | None = None,
          top: int | None = None) -> Steps | SeveralReport[Steps]:
    """Steps with their span, GPU work and steady-window statistics (``tracewhy steps``); several
    traces (a list, or a directory): a ``SeveralReport`` with each trace's Steps."""
    options = StepsReportOptions(step_marker=step, warmup=warmup,
                                 rate=requested(items_per_step, unit, tokens_per_step), decode_bytes=decode_bytes)

    def shown(r: StepsReport) -> Steps:
        return extended(Steps, r.result, throughput=r.throughput)

    return handed_out_one_or_several(  # type: ignore[no-any-return]
        trace, lambda source, loader: steps_report(source, options, loader),
        lambda sources, loader: steps_several(sources, options, loader), shown, top)


def gaps(trace: Sources, *, step: str | None = None, min_gap: int = _MIN_GAP_NS, gap_class: str | None = None,
         top: int | None = None) -> GapsResult | SeveralReport[GapsResult]:
    """GPU idle gaps in time order, each with its class and the host's activity, and idle per
    step (``tracewhy gaps``); ``top``: the largest gaps, as the command lists them. Several
    traces (a list, or a directory): a ``SeveralReport`` with each trace's GapsResult."""
    options = GapsReportOptions(step_marker=step, min_gap_ns=min_gap)

    def shown(r: GapsReport) -> GapsResult:
        if gap_class is None:
            return r.result
        import polars as pl

        return replace(r.result, gaps=r.result.gaps.filter(pl.col(GapCol.GAP_CLASS) == gap_class))

    return handed_out_one_or_several(  # type: ignore[no-any-return]
        trace, lambda source, loader: gaps_report(source, options, loader),
        lambda sources, loader: gaps_several(sources, options, loader), shown, top)


def kernels(trace: TraceLike, *, ncu: str | Path | None = None, top: int | None = None) -> KernelsResult:
    """GPU kernel time per kernel name and per family (``tracewhy kernels``); with ``ncu`` (an
    Nsight Compute report), ``by_name`` carries each kernel's ncu verdict."""

    def make(reads: Reads) -> KernelsResult:
        r = kernels_report(trace, KernelsReportOptions(ncu=str(ncu) if ncu is not None else None), reads.loader)
        return r.result if r.joined is None else replace(r.result, by_name=r.joined)

    return handed_out(trace, make, top)


def ops(trace: TraceLike, *, shapes: bool = False, sort: str | None = None, logs: str | Path | None = None,
        top: int | None = None) -> OpsResult:
    """Per operator (and input shapes with ``shapes``): calls, CPU and GPU time (``tracewhy ops``);
    ``logs``: the run's TORCH_TRACE or TORCH_LOGS=output_code, for compiled kernels as rows."""
    options = OpsReportOptions(by_shapes=shapes, sort_by=sort, logs=Path(logs) if logs is not None else None)
    return handed_out(trace, lambda reads: ops_report(trace, options, reads.loader), top)


def overlap(trace: TraceLike, *, step: str | None = None, warmup: int | None = None,
            top: int | None = None) -> OverlapResult:
    """Compute, communication (hidden and exposed), copies and idle per GPU and step (``tracewhy overlap``)."""
    options = OverlapReportOptions(step_marker=step, warmup=warmup)
    return handed_out(trace, lambda reads: overlap_report(trace, options, reads.loader).result, top)


def blocks(trace: TraceLike, *, names: str | tuple[str, ...] = (), step: str | None = None,
           warmup: int | None = None, top: int | None = None) -> BlocksResult | LogBlocksResult:
    """GPU time per step of each record_function block (``tracewhy blocks``); an instrument log's
    block timers when ``trace`` is one. ``names``: "a,b*" or a tuple, shell wildcards allowed."""
    wanted = tuple(n.strip() for n in names.split(",") if n.strip()) if isinstance(names, str) else tuple(names)
    options = BlocksReportOptions(names=wanted, step_marker=step, warmup=warmup)
    return handed_out(trace, lambda reads: blocks_report(trace, options, reads.loader).result, top)


def nvtx(trace: TraceLike, *, top: int | None = None) -> NvtxRangesResult:
    """Per NVTX range name (Kineto: user annotation), its time and GPU projection (``tracewhy nvtx``)."""
    return handed_out(trace, lambda reads: nvtx_report(trace, reads.loader), top)


def info(trace: TraceLike, *, step: str | None = None) -> InfoResult:
    """What the trace is: format, versions, devices, capture options, counts, steps, span
    (``tracewhy info``); its rows are the devices. ``first_ts_ns`` is the trace start."""
    return handed_out(trace, lambda reads: info_report(trace, InfoReportOptions(step_marker=step), reads.loader))


def lines(trace: TraceLike, *, all: bool = False, sort: str | None = None, logs: str | Path | None = None,
          step: str | None = None, warmup: int | None = None, top: int | None = None) -> LinesResult:
    """Which Python line is slow: per source frame, host and GPU time, syncs and step share
    (``tracewhy lines``); ``all``: library frames too; ``logs``: the run's TORCH_TRACE or
    TORCH_LOGS=output_code, for compiled kernels' source lines. ``stacks`` is what ``--flame`` draws."""
    options = LinesReportOptions(include_library=all, sort_by=sort, step_marker=step, warmup=warmup,
                                 logs=Path(logs) if logs is not None else None)
    return handed_out(trace, lambda reads: lines_report(trace, options, reads.loader), top)


def critical_path(trace: TraceLike, *, step: str | None = None, window: tuple[int, int] | None = None,
                  gains: int = _GAINS, top: int | None = None) -> CriticalPathResult:
    """The critical path of each step: its make-up, what lies on it and what removing each top
    item would save (``tracewhy critical-path``). ``window``: (start_ns, end_ns) on the trace's
    clock (the ``*_raw_ns`` columns), as ``--window`` takes it."""
    options = CriticalPathReportOptions(step_marker=step, gain_items=gains, window_ns=window)
    return handed_out(trace, lambda reads: critical_path_report(trace, options, reads.loader), top)


def account(trace: TraceLike, *, step: str | None = None, warmup: int | None = None,
            max_steps: int = AccountReportOptions().max_steps, logs: str | Path | None = None,
            decode_bytes: int | None = None, top: int | None = None) -> AccountReport:
    """Where the step goes (``tracewhy account``): each analysed steady step's critical path split
    into named parts that add up to the step; its rows are the parts, largest first. ``logs``:
    the run's TORCH_TRACE or TORCH_LOGS=output_code, for compiled kernels' source lines."""
    options = AccountReportOptions(step_marker=step, warmup=warmup, max_steps=max_steps,
                                   logs=Path(logs) if logs is not None else None, decode_bytes=decode_bytes)
    return handed_out(trace, lambda reads: account_report(trace, options, reads.loader), top)


def compile(trace: TraceLike, *, logs: str | Path | None = None, step: str | None = None,
            warmup: int | None = None, top: int | None = None) -> CompileReport:
    """torch.compile's regions, graph breaks, recompiles and compile time per step, and the
    findings (``tracewhy compile``); ``logs``: the TORCH_LOGS capture or TORCH_TRACE directory (``--logs``)."""
    options = CompileReportOptions(step_marker=step, warmup=warmup,
                                   torch_logs=Path(logs) if logs is not None else None)
    return handed_out(trace, lambda reads: compile_report(trace, options, reads.loader), top)


MemoryReport = TraceMemoryReport | SnapshotMemoryReport | TimelineMemoryReport | MemoryRanksReport | MemoryGrowthReport


def memory(source: TraceLike | list[str | Path] | tuple[str | Path, ...], *, vs: str | Path | None = None,
           step: str | None = None, warmup: int | None = None, top: int | None = None) -> MemoryReport:
    """What the run's memory did (``tracewhy memory``), from a profile_memory trace, an allocator
    snapshot or a memory-timeline export; a timeline's times run from its first sample. Several
    files (a list, or a directory): the ranks of one job compared; ``vs``: what grew from run
    ``source`` to run ``vs`` (both files)."""
    options = MemoryReportOptions(step_marker=step, warmup=warmup)
    if vs is not None:
        if not isinstance(source, (str, Path)):
            raise TypeError("memory(vs=...) compares one file with another: give source as a path")
        a = source
        return handed_out(None, lambda reads: memory_growth_report(a, vs, options, reads.loader), top)
    if isinstance(source, (list, tuple)):
        paths = [str(p) for p in source]
        return handed_out(None, lambda reads: memory_ranks_report(paths, options, reads.loader), top)
    if isinstance(source, (str, Path)) and Path(source).is_dir():
        folder = [str(source)]
        return handed_out(None, lambda reads: memory_ranks_report(folder, options, reads.loader), top)
    one = source
    made = handed_out(one, lambda reads: memory_report(one, options, reads.loader))
    if isinstance(made, TimelineMemoryReport) and made.result.table.height:
        first = int(made.result.table.get_column("ts_ns").min())  # type: ignore[arg-type]
        made = public(made, first)
    return made.top(top)


def sql(trace: TraceLike, query: str, *, step: str | None = None, warmup: int | None = None,
        top: int | None = None) -> SqlResult:
    """The rows of a SQL query (DuckDB) over the trace's tables (``tracewhy sql``), as DuckDB
    returns them: the query chose its columns, so its times stay on the trace's clock."""
    options = SqlReportOptions(step_marker=step, warmup=warmup)
    return handed_out(None, lambda reads: sql_report(trace, query, options, reads.loader), top)


#: ``nsys stats`` report names and the summaries that equal them row by row
#: (tests/test_nsys_stats.py checks each against NVIDIA's own CSVs).
NSYS_STATS_REPORTS: dict[str, Any] = {
    "cuda_gpu_kern_sum": kernel_summary,
    "cuda_api_sum": api_summary,
    "cuda_gpu_mem_time_sum": memory_time_summary,
    "cuda_gpu_mem_size_sum": memory_size_summary,
}


def nsys_stats(trace: TraceLike, report: str = "cuda_gpu_kern_sum", *, top: int | None = None) -> Summary:
    """The table ``nsys stats --report REPORT`` prints (count, total, mean, median, min, max,
    stddev, share per name), from any input format: a Kineto trace too."""
    try:
        summarize = NSYS_STATS_REPORTS[report]
    except KeyError:
        raise ValueError(f"unknown report {report!r}; one of {', '.join(NSYS_STATS_REPORTS)}") from None
    return handed_out(trace, lambda reads: summarize(reads.trace(trace)), top)  # type: ignore[no-any-return]
