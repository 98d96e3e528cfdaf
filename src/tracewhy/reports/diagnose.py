"""``diagnose``: every rule run on a trace (the rules are findings/' modules, listed in ``RULES``)
and what they find consolidated and ranked; for the command, the TORCH_LOGS capture of
``--logs`` read first and the throughput of ``--items-per-step``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from tracewhy.analyses.account import AccountResult
from tracewhy.analyses.account_classes import parts_by_class
from tracewhy.analyses.compile import CompileResult
from tracewhy.analyses.gaps import GapsOptions, GapsResult
from tracewhy.analyses.memory import MemoryResult
from tracewhy.analyses.step_bytes import DecodeBandwidth, decode_bandwidth
from tracewhy.analyses.step_classes import StepClasses, step_classes
from tracewhy.analyses.steps import StepsResult
from tracewhy.analyses.throughput import Throughput, ThroughputOptions, from_step_stats
from tracewhy.findings import (
    account,
    anti_patterns,
    blocks,
    collective_bandwidth,
    extra_copies,
    grad_sync,
    host,
    host_collectives,
    idle,
    inference_autograd,
    memory,
    nsys_rules,
    overlap,
    platform,
    recompute,
    sample_loops,
    spikes,
    tensor_growth,
    trust,
)
from tracewhy.findings import compile as torch_compile
from tracewhy.findings.basis import Basis, basis
from tracewhy.findings.codes import Code
from tracewhy.findings.consolidate import CaptureSize, consolidate
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.findings.explain import FixesTogether, explain
from tracewhy.findings.model import Finding, Severity
from tracewhy.findings.where_step_goes import avoidable_over_line
from tracewhy.model.trace import Trace
from tracewhy.reports import at_once
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource
from tracewhy.rows import Rows

if TYPE_CHECKING:
    from tracewhy.reports.several import SeveralReport

Rule = Callable[[Context], list[Finding]]

#: Every rule module; each returns the findings it can make for one trace.
RULES: tuple[Rule, ...] = (
    trust.findings, idle.findings, host.findings, spikes.findings, platform.findings, overlap.findings,
    collective_bandwidth.findings, blocks.findings,
    nsys_rules.findings, memory.findings, torch_compile.findings, account.findings, anti_patterns.findings,
    extra_copies.findings, recompute.findings, tensor_growth.findings,
    sample_loops.findings, host_collectives.findings, grad_sync.findings, inference_autograd.findings,
)


@dataclass(frozen=True)
class Report(Rows, rows="findings", key="code"):
    """The ranked findings and the measurements they rest on."""

    path: str
    findings: list[Finding]
    steps: StepsResult
    gaps: GapsResult
    basis: Basis
    #: The memory analysis the memory findings rest on; None without ``[memory]`` events.
    memory: MemoryResult | None = None
    #: The torch.compile analysis the compile findings rest on; None without compile markers.
    compile: CompileResult | None = None
    #: Where the step goes (``analyses.account``); None for a trace with nothing to account for.
    account: AccountResult | None = None
    #: The finding that explains the account's largest avoidable part (None: no finding does).
    lead: Code | None = None
    #: The fixes of the findings that save most, predicted together (None: fewer than two).
    together: FixesTogether | None = None
    #: The steps the predictions replay, of the account's analysed ones, and their mean (ns):
    #: what every finding's "step X -> Y" starts from (None: nothing replayed).
    replayed: tuple[int, int] | None = None

    @property
    def healthy(self) -> bool:
        """No high or medium finding, in a trace that held something to look at, and no avoidable
        part of the step account at UNEXPLAINED_PART_MIN_SHARE of the step or more."""
        return not any(f.severity in (Severity.HIGH, Severity.MEDIUM) or f.code == Code.EMPTY_TRACE
                       for f in self.findings) and not (self.account is not None and avoidable_over_line(self.account))


def recoverable_unit(report: Report) -> str:
    """What findings' recoverable time is measured over: per step when the trace has steady
    steps (GPU or CPU-only), else over the whole trace."""
    return "per step" if report.basis.per_steps or report.steps.stats is not None else "over the trace"


@dataclass(frozen=True)
class DiagnoseReportOptions:
    step_marker: str | None = None
    warmup: int | None = None
    #: Shortest GPU idle gap counted.
    min_gap_ns: int = GapsOptions().min_gap_ns
    #: The stderr of the run with TORCH_LOGS="graph_breaks,recompiles" (``--logs``).
    torch_logs: Path | None = None
    #: Items per step, to say the steady step times as throughput.
    rate: ThroughputOptions | None = None
    #: Bytes one decode step reads, as the user gave them (``--decode-bytes``).
    decode_bytes: int | None = None


@dataclass(frozen=True)
class DiagnoseReport:
    """The diagnosis, and (with ``rate``) the throughput at its steady step times (None without
    steady steps)."""

    report: Report
    rate: ThroughputOptions | None = None
    throughput: Throughput | None = None
    #: On an inference trace: the steps by class, the account's parts per class and the decode MBU.
    classes: StepClasses | None = None
    parts_by_class: pl.DataFrame | None = None
    decode: DecodeBandwidth | None = None


def diagnose_report(trace: TraceSource, options: DiagnoseReportOptions | None = None,
                    loader: Loader = PLAIN) -> DiagnoseReport:
    """The diagnosis of ``trace``; the TORCH_LOGS capture, when given, is read before the trace."""
    options = options or DiagnoseReportOptions()
    logs = None
    if options.torch_logs is not None:
        from tracewhy.readers.registry import read_compile_logs  # (only with --logs)

        logs = read_compile_logs(options.torch_logs)
        if logs.warnings:
            loader.warn(options.torch_logs, logs.warnings)
    t = loader.trace(trace)
    if logs is not None:  # a TORCH_TRACE directory of several ranks: the breaks of this trace's rank
        logs = logs.for_rank(t.meta.rank)
    report = diagnose(t, DiagnoseOptions(step_marker=options.step_marker, warmup=options.warmup,
                                         min_gap_ns=options.min_gap_ns, torch_logs=logs))
    rate = options.rate
    classes = step_classes(t, report.steps, rate) if t.slices.height else None
    return DiagnoseReport(report, rate, from_step_stats(report.steps.stats, rate) if rate is not None else None,
                          classes, parts_by_class(report.account, classes) if classes and report.account else None,
                          decode_bandwidth(t, classes, options.decode_bytes) if classes else None)


def diagnose_several(sources: Sequence[TraceSource], options: DiagnoseReportOptions | None = None,
                     loader: Loader = PLAIN) -> SeveralReport[DiagnoseReport]:
    """The diagnosis of every trace ``sources`` stand for (a directory: the traces in it), grouped:
    ranks of one job compared (``ranks``), other runs of the first's program compared with it."""
    from tracewhy.errors import UsageError
    from tracewhy.reports.several import SeveralOptions, read_several  # (several traces only)

    options = options or DiagnoseReportOptions()
    if options.torch_logs is not None:
        raise UsageError("--logs is the TORCH_LOGS capture of one run: give it with that run's trace alone")
    return read_several(sources, SeveralOptions(options.step_marker, options.warmup),
                        lambda t: diagnose_report(t, options, loader), loader, compare_ranks_too=True)


def diagnose(trace: Trace, options: DiagnoseOptions | None = None) -> Report:
    return diagnose_in(Context(trace, options or DiagnoseOptions()))


def diagnose_in(ctx: Context, found: list[Finding] | None = None, *, replay: bool = True) -> Report:
    """``diagnose`` on a context the caller keeps: the report and the export ask the same
    context for blocks, overlap and the GPU work per range afterwards, which the rules have
    already computed there. ``found``: the rules' findings on this context, when the caller has
    them (``rule_findings``); without ``replay`` no fix is replayed (``explain``): the findings
    have the same codes, but no predictions (so no recoverable time to rank by) and no lead."""
    trace = ctx.trace
    if found is None:
        found = rule_findings(ctx)
    b = basis(ctx)
    stats = ctx.steps().stats
    explained = explain(ctx, found, replay=replay) if trace.slices.height else None
    # What recoverable times are shares of: the step predictions start from, else the GPU's step
    # window, else the host's median step.
    window = b.window_ns if b.device is not None and b.window_ns > 0 else (stats.p50_ns if stats else None)
    if explained is not None and explained.step_ns:
        window = explained.step_ns
    capture = CaptureSize(events=trace.slices.height, steps=stats.count if stats is not None else None)
    ranked = consolidate(explained.findings if explained is not None else found, window, capture)
    lead = explained.lead if explained is not None else None
    return Report(path=trace.meta.path, findings=_lead_first(ranked, lead), steps=ctx.steps(), gaps=ctx.gaps(),
                  basis=b, memory=memory.memory_result(ctx) if trace.slices.height else None,
                  compile=_compile(ctx), account=ctx.account() if trace.slices.height else None, lead=lead,
                  together=explained.together if explained is not None else None,
                  replayed=(explained.replayed_steps, explained.step_ns)
                  if explained is not None and explained.step_ns else None)


def rule_findings(ctx: Context) -> list[Finding]:
    """Every rule's findings on ``ctx``, before ``explain`` joins them to the step account."""
    empty = trust.empty_trace(ctx.trace)
    found: list[Finding] = [empty] if empty is not None else []
    for rule_found in _run_rules(ctx) if ctx.trace.slices.height else ():
        found += rule_found
    return found


def _lead_first(findings: list[Finding], lead: Code | None) -> list[Finding]:
    """The finding that explains the largest avoidable part right after the trust findings (the
    summary it belongs to, if any, before it)."""
    at = next((i for i, f in enumerate(findings) if f.code == lead), None)
    if at is None:
        return findings
    first = next((i for i, f in enumerate(findings) if f.severity is not Severity.TRUST), len(findings))
    summary = next((i for i, f in enumerate(findings) if lead in f.parts), None)
    moved = [findings[i] for i in (summary, at) if i is not None and i >= first]
    rest = [f for f in findings[first:] if all(f is not m for m in moved)]
    return findings[:first] + moved + rest


def _run_rules(ctx: Context) -> list[list[Finding]]:
    """Every rule's findings, in the order of ``RULES``; at once on small traces
    (``reports/at_once.py``), where the context computes each analysis they share once. On a
    large trace they run in turn, the step account's graph built beside them from the start
    (``Context.start_graph``); where the account would wait for it, the syncs, anti-pattern and
    NVTX-range GPU work analyses the later rules read are made first (on a 606 MB export they
    fill the 1-2 s the account waited)."""
    together = at_once.small(ctx.trace)
    if not together:
        ctx.start_graph(meanwhile=(ctx.syncs, functools.partial(anti_patterns.anti_patterns_result, ctx),
                                   functools.partial(blocks.gpu_work_result, ctx)))
    return at_once.run([functools.partial(rule, ctx) for rule in RULES], together=together, name="tracewhy-rule")


def _compile(ctx: Context) -> CompileResult | None:
    """The compile analysis the rules made, when the trace has compile markers."""
    if ctx.trace.slices.height == 0:
        return None
    r = torch_compile.compile_result(ctx)
    return r if r.has_compile else None
