"""``step-time-spikes``: steady steps well over the median step, and what they hold that the
other steady steps do not: allocator calls, syncs, collectives and torch.compile work; the ops
they call more often, the untraced time they add and where it falls, the same ops running slower
(``analyses/spikes.spike_contents``); whether those steps come on a schedule (every k-th step:
work a loop does every few steps, such as an evaluation or a checkpoint save); and the user line
their time went to, with stacks."""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.compile import CompileStepCol, RecompileCol
from tracewhy.analyses.compile_fallback import FallbackCol
from tracewhy.analyses.source_lines import SourceLine
from tracewhy.analyses.spikes import SpikeCause, SpikeContents, spike_contents, spikes
from tracewhy.analyses.steps import StepCol
from tracewhy.findings import source_line as sl
from tracewhy.findings import thresholds as th
from tracewhy.findings.applicability import run_facts
from tracewhy.findings.codes import Code
from tracewhy.findings.compile import compile_result
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.units import fmt_ns as ms


def findings(ctx: Context) -> list[Finding]:
    """One finding when some steady steps run over the median by ``spikes.SPIKE_MARGIN``."""
    sp = spikes(ctx.trace, ctx.steps(), ctx.host())
    all_spikes = sp.spikes.get_column("step").to_list()
    # A step that recompiles (or gives up compiling) is the compile findings' to state, once or
    # every step: it is not repeated here as a spike; nor is a step the step account left out as a
    # one-time compile (a branch compiled the first time it is taken): it does not recur per step.
    compiled = _recompile_steps(ctx) + _one_time_steps(ctx)
    sp = replace(sp, spikes=sp.spikes.filter(~pl.col("step").is_in(compiled)))
    if sp.spikes.height == 0:
        return []
    extra_cols = [c for c in sp.spikes.columns if c.startswith("extra_")]
    causes: dict[str, float] = {}
    for c in extra_cols:
        v = float(sp.spikes.get_column(c).mean())  # type: ignore[arg-type]
        if v > 0:
            causes[c.removeprefix("extra_")] = v
    steady = sp.per_step.filter(pl.col(StepCol.STEADY))
    excess = int(sp.spikes.get_column("excess_ns").sum())
    in_steps, recompiled_ns = _compile_in_spikes(ctx, sp.spikes.get_column("step").to_list())
    compiling = sum(in_steps.values())
    parts = [f"+{v:.1f} {k.replace('_', ' ')}" for k, v in causes.items()]
    if compiling:
        parts.insert(0, "torch.compile work (Dynamo, AOT autograd, inductor: "
                     + ", ".join(f"{ms(ns)} in {step}" for step, ns in in_steps.items()) + ")")
    explained = bool(parts)
    # Compile time the recompile finding already claims is not recoverable twice; with compile work
    # the only cause, the other spikes' excess is as unexplained as below.
    recoverable = max((excess if causes else compiling) - min(compiling, recompiled_ns), 0) if explained else 0
    spike_steps = sp.spikes.get_column("step").to_list()
    grown = sl.spike_line(ctx, spike_steps, excess)
    normal = sp.per_step.filter(pl.col(StepCol.STEADY) & ~pl.col("step").is_in(all_spikes)).get_column("step")
    held = spike_contents(ctx.trace, ctx.steps(), ctx.host(), spike_steps, normal.to_list())
    reading = _SpikeReading(ctx, held, excess / sp.spikes.height, len(spike_steps),
                       after_compile=all(step - 1 in compiled for step in spike_steps))
    contents, next_step = _spike_contents(parts, grown, reading)
    return [Finding(
        code=Code.STEP_TIME_SPIKES, severity=Severity.MEDIUM if explained else Severity.LOW,
        statement=f"{sp.spikes.height} of {steady.height} steady steps run over {100 * (1 + sp.margin):.0f}% of the "
                  f"median ({ms(excess / sp.spikes.height)} extra each); {contents}",
        next_step=next_step,
        # Unexplained spikes are not recoverable by any change we can name; a line that takes the
        # extra time names where to look, not a change that recovers it.
        recoverable_ns_per_step=round(recoverable / max(steady.height, 1)),
        evidence={"spike_steps": spike_steps, "excess_ns": excess, "causes": causes, "compile_ns": compiling,
                  **({} if held is None else _held_evidence(reading.names, held)),
                  **({} if grown is None else {**sl.evidence(grown[0]), "line_extra_ns": grown[1]})},
        see=(Code.RECOMPILE,) if compiling else (),
    )]


def _spike_contents(parts: list[str], grown: tuple[SourceLine, int] | None, reading: _SpikeReading) -> tuple[str, str]:
    """What the spikes contain that a median step lacks (events, compile work, the ops they call
    more often, the untraced time they add, the user line their extra time went to), and what to
    do about it."""
    events = f"they contain {', '.join(parts)} over a median step" if parts else ""
    next_step = ("Remove the per-step source of those events (recompiles: mark dynamic shapes or pad; allocator: "
                 "stable shapes; syncs: tracewhy gaps TRACE --class sync)." if parts else
                 "Rerun to see whether the spikes repeat; if they do, capture with with_stack=True around them.")
    held_text, held_next = reading.text()
    if grown is None:
        if held_text:
            return "; ".join(t for t in (events, held_text) if t) + ".", next_step if parts else held_next
        return (events or "they contain nothing a median step lacks (machine noise, GC or I/O outside the trace)"
                ) + ".", next_step
    line, extra_ns = grown
    took = sl.named(line, after=f" takes {ms(extra_ns)} more in each than in the other steady steps.")
    if parts:
        return f"{events}; {took}", next_step
    return took, (f"See what {sl.where(line)} does differently in those steps (tracewhy lines TRACE lists its "
                  "time); rerun to see whether the spikes repeat.")


class _SpikeReading:
    """The spikes' contents (``spike_contents``) said: each cause where it is a fair share of a
    spike's excess (``thresholds.SPIKE_*``), the spikes that hold it named when not all do, and
    the schedule they fall on."""

    def __init__(self, ctx: Context, held: SpikeContents | None, excess_ns: float, spikes: int, *,
                 after_compile: bool) -> None:
        self.names = ctx.steps().table.get_column(StepCol.NAME).cast(pl.String).to_list()
        self.stacks = sl.has_stacks(ctx)
        facts = run_facts(ctx)
        self.workers, self.cpu_only = facts.loader_workers, facts.cpu_only  # loader_workers: None unknown
        self.spikes, self.after_compile = spikes, after_compile
        shown = held if held is not None and excess_ns > 0 else SpikeContents((), None, ())
        self.more = [c for c in shown.more if c.ns >= th.SPIKE_OPS_MIN_SHARE * excess_ns][:3]
        hole = shown.untraced
        self.untraced = hole if hole is not None and hole.ns >= th.SPIKE_PART_MIN_SHARE * excess_ns else None
        self.slower = [(n, t) for n, t in shown.slower if t >= th.SPIKE_PART_MIN_SHARE * excess_ns][:2]

    def which(self, cause: SpikeCause) -> tuple[str, bool]:
        """("each" or "3 of them (ProfilerStep#4, #8, #12)", with "every 4th step: " on a schedule;
        whether one step is meant (a verb in the singular))."""
        k = cause.period
        every = "" if k is None else f"every {({2: '2nd', 3: '3rd'}.get(k, f'{k}th'))} step: "
        named = ", ".join(self.names[i] for i in cause.steps)
        if len(cause.steps) == self.spikes:
            return (f"each ({every}{named})" if k else "each"), True
        return f"{'one' if len(cause.steps) == 1 else len(cause.steps)} of them ({every}{named})", len(cause.steps) == 1

    def text(self) -> tuple[str, str]:
        texts = []
        for c in self.more:
            who, one = self.which(c)
            each = "" if one else " each"
            whole = c.calls >= 0.95 and abs(c.base_calls - round(c.base_calls)) < 0.05
            texts.append(f"{who} {'holds' if one else 'hold'} {c.calls:,.0f} more {c.name} calls (+{ms(c.ns)}{each}) "
                         "than the other steady steps on average" if whole else
                         f"{who} {'holds' if one else 'hold'} {c.base_calls + c.calls:,.1f} {c.name} calls a step "
                         f"(+{ms(c.ns)}{each}) where the other steady steps average {c.base_calls:,.1f}")
        hole = self.untraced
        if hole is not None:
            where = (" at the step's start" if hole.after is None else
                     f" after {hole.after}" + (", at the step's end" if hole.at_end else ""))
            who, one = self.which(hole)
            texts.append(f"in {who} the step's thread spends {ms(hole.ns)} more outside every recorded op (Python, "
                         f"I/O or a wait the profiler does not record), the longest stretch{where}")
        if self.slower:
            texts.append("the same calls ran slower: " + ", ".join(f"{n} +{ms(t)}" for n, t in self.slower))
        if not texts:
            return "", ""
        if not self.more and hole is None:
            return self._slower(texts)
        what = f"the extra {self.more[0].name} calls" if self.more else "the untraced time"
        spy = ", or py-spy the job" if hole is not None else ""
        look = ("tracewhy lines TRACE names the lines that run there" if self.stacks else
                f"capture with with_stack=True to name it (tracewhy lines TRACE){spy}")
        nxt = f"Find the code behind {what}: {look}."
        if any(c.period for c in [*self.more, *([hole] if hole else [])]):
            nxt += (" Work the loop does on a schedule (a checkpoint save, an evaluation pass, logging) can run less "
                    "often or off the training step.")
        return "; ".join(texts), nxt

    def _slower(self, texts: list[str]) -> tuple[str, str]:
        """Only the same calls, slower: after a compile, the new code's first runs; a DataLoader
        fetch that takes longer, a wait for the workers; else what the calls wait on, or noise."""
        if self.after_compile:
            texts.append("each follows a step that compiled: most likely the new code's first runs (loading it, "
                         "cold caches) rather than more work")
            return "; ".join(texts), "Nothing to fix beyond the compile itself (see its finding); measure after it."
        if api_names.is_dataloader(self.slower[0][0]):
            gaps = "" if self.cpu_only else " tracewhy gaps TRACE --class input shows each GPU wait on it."
            if self.workers is False:
                texts.append("the main process loads its batches itself (num_workers=0) and those took longer")
                return "; ".join(texts), ("The input pipeline is the spikes' cause: load in DataLoader worker "
                                          "processes (num_workers > 0) or make each batch cheaper (Dataset "
                                          f"__getitem__, collate).{gaps}")
            texts.append("the main process waited longer for its batch: the DataLoader's workers fall behind on "
                         "those steps")
            return "; ".join(texts), ("The input pipeline is the spikes' cause: make each batch cheaper to produce "
                                      f"(Dataset __getitem__, collate) or add workers.{gaps}")
        return "; ".join(texts), ("The trace records no more work in those steps, only the same calls taking longer: "
                                  "what they wait on (another rank, the input pipeline, a lock) or machine noise; "
                                  "rerun to see whether the spikes repeat.")


def _held_evidence(names: list[str], held: SpikeContents) -> dict[str, object]:
    """The spikes' contents for the evidence; ``names``: the steps table's names."""

    def cause(c: SpikeCause) -> dict[str, object]:
        return {"name": c.name, "steps": [names[i] for i in c.steps], "extra_calls": round(c.calls, 2),
                "extra_ns": round(c.ns), "every_steps": c.period}
    hole = held.untraced
    return {"more_calls": [cause(c) for c in held.more[:5]],
            "untraced": None if hole is None else {**cause(hole), "after": hole.after, "at_end": hole.at_end},
            "slower": [{"name": n, "extra_ns": round(t)} for n, t in held.slower[:5]]}


def _one_time_steps(ctx: Context) -> list[int]:
    """Indexes (in the steps table) of the steps the step account left out as one-time compiles."""
    account = ctx.account()
    if account is None or not account.one_time:
        return []
    names = {s.name for s in account.one_time}
    return [i for i, name in enumerate(ctx.steps().table.get_column(StepCol.NAME).cast(pl.String).to_list())
            if name in names]


def _recompile_steps(ctx: Context) -> list[int]:
    """Indexes (in the steps table) of the steps holding a recompile or a compile that gave up."""
    r = compile_result(ctx)
    if r.per_step.height != ctx.steps().table.height:
        return []
    names = r.per_step.get_column(CompileStepCol.STEP).to_list()
    marked = set(r.recompiles.get_column(RecompileCol.STEP).drop_nulls().to_list())
    marked |= set(r.fallbacks.get_column(FallbackCol.STEP).drop_nulls().to_list())
    return [i for i, name in enumerate(names) if name in marked]


def _compile_in_spikes(ctx: Context, spike_steps: list[int]) -> tuple[dict[str, int], int]:
    """Per spike step that compiles more than the steady median step, that extra torch.compile
    work (nested phases once, wherever they sit under the step); and the cost of the steady
    recompiles. The compile analysis' steps are the step windows, in the steps table's order."""
    r = compile_result(ctx)
    if r.compile_ns == 0 or r.per_step.height != ctx.steps().table.height:
        return {}, 0
    compile_ns = r.per_step.get_column(CompileStepCol.COMPILE_NS).to_list()
    names = r.per_step.get_column(CompileStepCol.STEP).to_list()
    median = r.per_step.filter(pl.col(CompileStepCol.STEADY)).get_column(CompileStepCol.COMPILE_NS).median()
    base = float(median) if isinstance(median, (int, float)) else 0.0
    extra = {str(names[i]): round(compile_ns[i] - base) for i in spike_steps if compile_ns[i] > base}
    recompiled = int(r.recompiles.filter(pl.col(RecompileCol.STEADY)).get_column(RecompileCol.COST_NS).sum())
    return extra, recompiled
