"""Several traces on one command line (``diagnose``, ``report``, ``steps``, ``gaps``, ``check``):
each read once, in order, and what the command computes on it kept (``per_input``), with the
trace's identity (``analyses/run_identity.py``); then the traces grouped
(``findings/inputs_grouping.py``): the ranks of one job are compared as ``ranks`` compares them,
other captures are shown one after another, and each that is a run of the first's program is
compared with the first as ``diff`` compares two runs (the first trace is kept while the others
are read, so that no file is read twice).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tracewhy.analyses.diff import DiffOptions, diff
from tracewhy.analyses.rank_compare import compare_ranks
from tracewhy.analyses.ranks import RanksOptions, RankSummary, summarize_trace
from tracewhy.analyses.run_identity import RunIdentity, run_identity
from tracewhy.analyses.steps import StepsOptions, StepStats, steps
from tracewhy.errors import TraceError
from tracewhy.findings import thresholds as th
from tracewhy.findings.compare import Comparison, judge
from tracewhy.findings.inputs_grouping import AS_RANKS, Grouping, group, relation
from tracewhy.findings.ranks import rank_findings
from tracewhy.model.trace import Trace
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource
from tracewhy.reports.ranks import RanksReport
from tracewhy.reports.trace_dirs import SkippedFile, TraceInput, trace_inputs
from tracewhy.rows import Rows

R = TypeVar("R")


@dataclass(frozen=True)
class SeveralOptions:
    """What every trace is read with: the step marker and warm-up the command was given."""

    step_marker: str | None = None
    warmup: int | None = None


@dataclass(frozen=True)
class PerTrace(Generic[R]):
    """One trace: its path, identity, steady step statistics (None without steady steps) and
    what the command computed on it (None where it was not asked for)."""

    path: str
    identity: RunIdentity
    step_stats: StepStats | None
    result: R


@dataclass(frozen=True)
class SeveralReport(Rows, Generic[R], rows="inputs", key="path"):
    """What a command computed on several traces, its rows the traces (``PerTrace``).
    ``grouping`` is None when one trace was left (a directory holding one): the command then
    shows it as it shows a single trace.
    ``ranks``: the ranks compared, when read as ranks and the command compares them;
    ``comparisons``: by path, each trace compared with the first (a run of its program)."""

    inputs: tuple[PerTrace[R], ...]
    grouping: Grouping | None
    skipped: tuple[SkippedFile, ...] = ()
    ranks: RanksReport | None = None
    comparisons: dict[str, Comparison] = field(default_factory=dict)

    @property
    def as_ranks(self) -> bool:
        return self.grouping is not None and self.grouping.read_as == AS_RANKS

    @property
    def pace_rank(self) -> int | None:
        """The rank that sets the pace: the one the others waited on longest (the straggler),
        else, when none waited, the one with the longest median step; None unless read as ranks."""
        if not self.as_ranks:
            return None
        if self.ranks is not None and self.ranks.result.straggler is not None:
            return self.ranks.result.straggler
        timed = [(i.step_stats.p50_ns, -(i.identity.rank or 0)) for i in self.inputs if i.step_stats is not None]
        if timed:
            return -max(timed)[1]
        return min(i.identity.rank or 0 for i in self.inputs)

    @property
    def pace_reason(self) -> str:
        if self.ranks is not None and self.ranks.result.straggler is not None:
            return "the others waited on it longest"
        return "the longest median step (no rank waited on another)"

    def by_rank(self) -> list[PerTrace[R]]:
        """The inputs in rank order (as read, when not read as ranks)."""
        return sorted(self.inputs, key=lambda i: i.identity.rank or 0) if self.as_ranks else list(self.inputs)


def read_several(sources: Sequence[TraceSource], options: SeveralOptions, per_input: Callable[[Trace], R],
                 loader: Loader = PLAIN, *, compare_ranks_too: bool = False,
                 compare_runs: bool = True) -> SeveralReport[R]:
    """Every trace ``sources`` stand for (a directory: the traces in it), read once each, with
    ``per_input`` run on it; the ranks compared when they are a job's and ``compare_ranks_too``;
    the runs of the first's program compared with it when ``compare_runs``. A file found in a
    directory that cannot be read as a trace is skipped with a warning; a named one fails."""
    items, skipped = trace_inputs(sources, loader)
    reading = _Reading(options, compare_ranks_too, compare_runs)
    results: list[PerTrace[R]] = []
    for item in items:
        trace = _read(item, loader, skipped)
        if trace is None:
            continue
        identity, stats = reading.take(trace, item.path)
        results.append(PerTrace(item.path, identity, stats, per_input(trace)))
        del trace  # (only the first stays, for the comparisons)
    if not results:
        raise TraceError(str(sources[0]) if len(sources) == 1 else None,
                         "no timeline trace could be read: " + "; ".join(f"{s.path}: {s.why}" for s in skipped))
    return reading.finish(results, tuple(skipped))


def _read(item: TraceInput, loader: Loader, skipped: list[SkippedFile]) -> Trace | None:
    """The trace, or None for a file of a directory that is not one (said through the loader)."""
    try:
        return loader.trace(item.source)
    except TraceError as e:
        if not item.listed:
            raise
        loader.warn(item.path, [f"skipped: {e.problem}"])
        skipped.append(SkippedFile(item.path, e.problem))
        return None


class _Reading:
    """What is gathered while the traces are read: identities, rank summaries, and the first
    trace, against which each later run of its program is compared as it is read."""

    def __init__(self, options: SeveralOptions, ranks: bool, runs: bool) -> None:
        self.options = options
        self.ranks = ranks
        self.runs = runs
        self.summaries: list[RankSummary] = []
        self.first: tuple[Trace, RunIdentity] | None = None
        self.comparisons: dict[str, Comparison] = {}

    def take(self, trace: Trace, path: str) -> tuple[RunIdentity, StepStats | None]:
        o = self.options
        steps_result = steps(trace, StepsOptions(marker=o.step_marker, warmup=o.warmup))
        identity = run_identity(trace, steps_result)
        if self.ranks and identity.rank is not None and (identity.world_size or 0) > 1:
            self.summaries += summarize_trace(trace, path, RanksOptions(step_marker=o.step_marker, warmup=o.warmup))
        if self.first is None:
            self.first = (trace, identity) if self.runs else None
        elif self.runs:
            first_trace, first_identity = self.first
            r = relation(first_identity, identity)
            if r.same_program and not r.same_job:
                options = DiffOptions(step_marker=o.step_marker, warmup=o.warmup, confidence=th.DIFF_CONFIDENCE)
                self.comparisons[path] = judge(diff(first_trace, trace, options))
        return identity, steps_result.stats

    def finish(self, results: list[PerTrace[R]], skipped: tuple[SkippedFile, ...]) -> SeveralReport[R]:
        self.first = None
        if len(results) == 1:
            return SeveralReport((results[0],), None, skipped)
        grouping = group([r.identity for r in results])
        ranks = None
        if grouping.read_as == AS_RANKS and self.ranks:
            summaries = sorted(self.summaries, key=lambda s: s.rank)
            compared = compare_ranks(summaries)
            ranks = RanksReport(tuple(summaries), compared, rank_findings(compared), "in-process")
        comparisons = {} if grouping.read_as == AS_RANKS else self.comparisons
        return SeveralReport(tuple(results), grouping, skipped, ranks, comparisons)
