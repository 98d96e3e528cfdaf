"""The Python API: one function per CLI command, with the command's defaults, returning its typed result.

Each function calls the report of the command of the same name (``reports/``, which the CLI
calls too) and returns what it computes, with one change at this boundary: every table holds
names as plain strings (``pl.String``), where the model keeps them categorical to save memory,
so that ``pl.col("name").str.contains(...)`` works on what a user is handed.
"""

from __future__ import annotations

import html
import importlib
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path, PurePath
from typing import Any, TypeVar

import polars as pl

from tracewhy.analyses.blocks import BlocksResult
from tracewhy.analyses.gaps import GapsResult
from tracewhy.analyses.info import InfoResult
from tracewhy.analyses.kernels import KernelsResult
from tracewhy.analyses.nvtx_ranges import NvtxRangesResult
from tracewhy.analyses.ops import OpsResult
from tracewhy.analyses.overlap import OverlapResult
from tracewhy.analyses.steps import StepsResult
from tracewhy.analyses.summaries import (
    Summary,
    api_summary,
    kernel_summary,
    memory_size_summary,
    memory_time_summary,
)
from tracewhy.errors import install_hint
from tracewhy.findings.compare import Comparison
from tracewhy.model.schema import Kind
from tracewhy.model.trace import Trace
from tracewhy.reports.blocks import BlocksReportOptions, blocks_report
from tracewhy.reports.check import CheckOptions, CheckReport
from tracewhy.reports.check import check as _check
from tracewhy.reports.check_metrics import parse_limit
from tracewhy.reports.diagnose import DiagnoseReportOptions, Report, diagnose_report, recoverable_unit
from tracewhy.reports.diff import DiffReportOptions, diff_report
from tracewhy.reports.gaps import GapsReportOptions, gaps_report
from tracewhy.reports.info import InfoReportOptions, info_report
from tracewhy.reports.inputs import PLAIN
from tracewhy.reports.kernels import kernels_report
from tracewhy.reports.nvtx import nvtx_report
from tracewhy.reports.ops import OpsReportOptions, ops_report
from tracewhy.reports.overlap import OverlapReportOptions, overlap_report
from tracewhy.reports.steps import StepsReportOptions, steps_report
from tracewhy.units import printable

#: A Trace, or the path of a trace file to read first (as ``tracewhy.load`` does).
TraceLike = Trace | str | Path
R = TypeVar("R")

_PANDAS_EXTRA = install_hint("pandas")


def slices(trace: TraceLike, *kinds: Kind | str) -> pl.DataFrame:
    """The slices of the given kinds ("kernel", Kind.MEMCPY, ...; every slice when none), names as
    plain strings. ``trace.of_kind`` gives the same rows with the model's categorical names."""
    t = _trace(trace)
    return public(t.of_kind(*kinds) if kinds else t.slices)


@dataclass(frozen=True, repr=False)
class Diagnosis(Report):
    """The Report ``diagnose`` returns: shown as its findings, one line each (a table in a
    notebook), where the generated repr printed every table the Report holds."""

    def __repr__(self) -> str:
        lines = [f"{self._title()}:"]
        lines += [f"  {f.severity.value:<6} {f.code}: {f.statement}" for f in self.findings]
        return "\n".join(printable(line) for line in lines)  # a trace's names may hold terminal escapes

    def _repr_html_(self) -> str:
        """A small table for Jupyter; every string is escaped (statements quote the trace's names)."""
        unit = recoverable_unit(self)
        rows = "".join(
            f"<tr><td>{html.escape(f.severity.value)}</td><td><code>{html.escape(f.code)}</code></td>"
            f"<td>{html.escape(f.statement)}</td>"
            f'<td style="text-align:right">{f.recoverable_ns_per_step / 1e6:,.3f}</td></tr>'
            for f in self.findings
        )
        return (f"<table><caption>{html.escape(self._title())}</caption><thead><tr><th>severity</th>"
                f"<th>code</th><th>statement</th><th>recoverable ms {html.escape(unit)}</th></tr></thead>"
                f"<tbody>{rows}</tbody></table>")

    def _title(self) -> str:
        n = len(self.findings)
        return f"tracewhy diagnosis of {PurePath(self.path).name}: {n} finding{'s' if n != 1 else ''}"


def diagnose(trace: TraceLike, *, step: str | None = None, warmup: int | None = None,
             min_gap_ns: int = DiagnoseReportOptions().min_gap_ns) -> Diagnosis:
    """Ranked findings, each with evidence and the next step (``tracewhy diagnose``)."""
    options = DiagnoseReportOptions(step_marker=step, warmup=warmup, min_gap_ns=min_gap_ns)
    report = public(diagnose_report(_trace(trace), options).report)
    return Diagnosis(**{f.name: getattr(report, f.name) for f in fields(Report)})


def steps(trace: TraceLike, *, step: str | None = None, warmup: int | None = None) -> StepsResult:
    """Steps with their span, GPU work and steady-window statistics (``tracewhy steps``)."""
    return public(steps_report(_trace(trace), StepsReportOptions(step_marker=step, warmup=warmup)).result)


def gaps(trace: TraceLike, *, step: str | None = None,
         min_gap_ns: int = GapsReportOptions().min_gap_ns) -> GapsResult:
    """GPU idle gaps in time order, each with its class and the host's activity, and idle per
    step (``tracewhy gaps``, which lists ``result.gaps`` largest first)."""
    return public(gaps_report(_trace(trace), GapsReportOptions(step_marker=step, min_gap_ns=min_gap_ns)).result)


def kernels(trace: TraceLike) -> KernelsResult:
    """GPU kernel time per kernel name and per family (``tracewhy kernels``)."""
    return public(kernels_report(_trace(trace)).result)


def ops(trace: TraceLike, *, shapes: bool = False, sort: str | None = None) -> OpsResult:
    """Per operator (and input shapes with ``shapes``): calls, CPU and GPU time (``tracewhy ops``)."""
    return public(ops_report(_trace(trace), OpsReportOptions(by_shapes=shapes, sort_by=sort)))


def overlap(trace: TraceLike, *, step: str | None = None, warmup: int | None = None) -> OverlapResult:
    """Compute, communication (hidden and exposed), copies and idle per GPU and step (``tracewhy overlap``)."""
    return public(overlap_report(_trace(trace), OverlapReportOptions(step_marker=step, warmup=warmup)).result)


def blocks(trace: TraceLike, *, names: tuple[str, ...] = (), step: str | None = None,
           warmup: int | None = None) -> BlocksResult:
    """GPU time per step of each record_function block; ``names`` may hold shell wildcards (``tracewhy blocks``)."""
    r = blocks_report(_trace(trace), BlocksReportOptions(names=names, step_marker=step, warmup=warmup))
    assert isinstance(r.result, BlocksResult)  # (a Trace's blocks, never an instrument log's)
    return public(r.result)


def nvtx(trace: TraceLike) -> NvtxRangesResult:
    """Per NVTX range name (Kineto: user annotation), its time and GPU projection (``tracewhy nvtx``)."""
    return public(nvtx_report(_trace(trace)))


def info(trace: TraceLike, *, step: str | None = None) -> InfoResult:
    """What the trace is: format, versions, devices, capture options, counts, steps, span (``tracewhy info``)."""
    return public(info_report(_trace(trace), InfoReportOptions(step_marker=step)))


def diff(a: TraceLike, b: TraceLike, *, step: str | None = None, warmup: int | None = None) -> Comparison:
    """Run B against baseline A: faster, slower or within noise, and what changed (``tracewhy diff``)."""
    options = DiffReportOptions(step_marker=step, warmup=warmup)
    return public(diff_report(_trace(a), _trace(b), options).comparison)


def check(trace: TraceLike, *, baseline: TraceLike | None = None, step: str | None = None,
          warmup: int | None = None, allow_unmeasured: bool = False, allow_partial: bool = False,
          **limits: str | float) -> CheckReport:
    """The CI gate (``tracewhy check``): ``max_gpu_idle="20%"``, ``max_step_p50="120ms"``, ... are
    the command's ``--max-gpu-idle 20%``, ``--max-step-p50 120ms``; ``report.passed`` is its exit status."""
    parsed = tuple(parse_limit(key.replace("_", "-"), text) for key, text in limits.items())
    if not parsed and baseline is None:
        raise ValueError("nothing to check: give thresholds (e.g. max_gpu_idle='20%') or a baseline")
    options = CheckOptions(limits=parsed, step_marker=step, warmup=warmup, allow_unmeasured=allow_unmeasured,
                           allow_partial=allow_partial)
    return public(_check(_trace(trace), options, _trace(baseline) if baseline is not None else None))


#: ``nsys stats`` report names and the summaries that equal them row by row
#: (tests/test_nsys_stats.py checks each against NVIDIA's own CSVs).
NSYS_STATS_REPORTS: dict[str, Any] = {
    "cuda_gpu_kern_sum": kernel_summary,
    "cuda_api_sum": api_summary,
    "cuda_gpu_mem_time_sum": memory_time_summary,
    "cuda_gpu_mem_size_sum": memory_size_summary,
}


def nsys_stats(trace: TraceLike, report: str = "cuda_gpu_kern_sum") -> Summary:
    """The table ``nsys stats --report REPORT`` prints (count, total, mean, median, min, max,
    stddev, share per name), from any input format: a Kineto trace too."""
    try:
        summarize = NSYS_STATS_REPORTS[report]
    except KeyError:
        raise ValueError(f"unknown report {report!r}; one of {', '.join(NSYS_STATS_REPORTS)}") from None
    return public(summarize(_trace(trace)))  # type: ignore[no-any-return]


def to_pandas(table: pl.DataFrame) -> Any:
    """``table`` as a pandas DataFrame; an ImportError naming the extra to install when pandas
    or pyarrow (which polars converts through) is missing, rather than polars' own message."""
    for module in ("pandas", "pyarrow"):
        try:
            importlib.import_module(module)
        except ImportError:
            raise ImportError(f"to_pandas needs pandas and pyarrow, and {module} is missing: "
                              f"{_PANDAS_EXTRA}") from None
    return table.to_pandas()


def public(value: R) -> R:
    """``value`` with the categorical and enum columns of every table in it (nested results
    too) cast to ``pl.String``: the model's compact dtypes stay inside the pipeline."""
    if isinstance(value, pl.DataFrame):
        casts = [pl.col(name).cast(t) for name, dtype in value.schema.items() if (t := _plain_dtype(dtype)) is not None]
        return value.with_columns(casts) if casts else value  # type: ignore[return-value]
    if is_dataclass(value) and not isinstance(value, type):
        changed = {}
        for f in fields(value):
            old = getattr(value, f.name)
            new = public(old) if f.init else old
            if new is not old:
                changed[f.name] = new
        return replace(value, **changed) if changed else value
    return value


def _plain_dtype(dtype: object) -> pl.DataType | None:
    """String for Categorical and Enum (also inside a List); None for a dtype kept as it is."""
    if isinstance(dtype, (pl.Categorical, pl.Enum)):
        return pl.String()
    if isinstance(dtype, pl.List):
        inner = _plain_dtype(dtype.inner)
        return pl.List(inner) if inner is not None else None
    return None


def _trace(trace: TraceLike) -> Trace:
    return PLAIN.trace(trace)
