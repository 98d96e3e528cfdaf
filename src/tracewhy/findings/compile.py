"""torch.compile findings: graph breaks, recompiles in steady state, the cold start, and the
many-small-regions signature of a fragmented model. Each names the lines and guards behind it
when the trace has stacks or a TORCH_LOGS capture is given."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import polars as pl

from tracewhy.analyses.compile import CompileResult, CompileStepCol, RecompileCol, RegionCol, compile_analysis
from tracewhy.analyses.compile_fallback import FallbackCol
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.compile_fallback import fallback_findings
from tracewhy.findings.compile_ranks import rank_divergence_findings
from tracewhy.findings.compile_recompiles import every_step_frames, recompile_finding, resume_frames
from tracewhy.findings.consolidate import severity_for_share
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.units import fmt_ns, fmt_pct

if TYPE_CHECKING:  # (the TORCH_LOGS parser is imported only where --logs is given)
    from tracewhy.model.torch_logs import TorchLogs

#: Break locations and guards named in a statement; the evidence holds them all.
NAMED: Final = 3


def compile_result(ctx: Context) -> CompileResult:
    """The compile analysis of a diagnosis, made once per Context on its steps (the step-time
    spikes, check and the report read it too)."""
    return ctx.cached("compile", lambda: compile_analysis(ctx.trace, ctx.steps(), ctx.compile_marked()))


def findings(ctx: Context) -> list[Finding]:
    """The compile findings of a diagnosis, with the TORCH_LOGS capture of ``diagnose --logs``."""
    stats = ctx.steps().stats
    return compile_findings(compile_result(ctx), stats.p50_ns if stats else None, ctx.options.torch_logs)


def compile_findings(r: CompileResult, step_p50_ns: float | None, logs: TorchLogs | None = None) -> list[Finding]:
    """Judge a CompileResult; ``step_p50_ns`` (the steady median step) sizes the shares."""
    if not r.has_compile:
        return rank_divergence_findings(logs)
    gave_up = {int(f) for f in r.fallbacks.get_column(FallbackCol.FRAME).to_list()}
    return [*fallback_findings(r, logs), *_graph_breaks(r, step_p50_ns, logs),
            *recompile_finding(r, step_p50_ns, logs, gave_up), *_cold_start(r), *_many_small_regions(r, step_p50_ns),
            *rank_divergence_findings(logs)]


def _break_lines(r: CompileResult, logs: TorchLogs | None) -> list[str]:
    """Where the breaks are: from TORCH_LOGS (with the reason) when given, else resume frames."""
    if logs is not None and logs.breaks.height:
        from tracewhy.model.torch_logs import LogBreakCol  # (already loaded: it made ``logs``)

        rows = logs.breaks.unique([LogBreakCol.LOCATION, LogBreakCol.REASON], maintain_order=True)
        return [f"{row[LogBreakCol.LOCATION] or '?'} ({row[LogBreakCol.REASON] or 'reason not logged'})"
                for row in rows.iter_rows(named=True)]
    return [f"{loc} in {fn}" for fn, loc in r.breaks.select("function", "location").iter_rows()]


def _graph_breaks(r: CompileResult, step_p50_ns: float | None, logs: TorchLogs | None) -> list[Finding]:
    per_step = r.graph_breaks_measured
    if per_step < th.GRAPH_BREAKS_MIN_PER_STEP:
        return []
    eager_ns = r.eager_ns_per_step or 0.0
    lines = _break_lines(r, logs)
    where = f"; breaks at {', '.join(lines[:NAMED])}" if lines else ""
    recompile_ns = _resume_recompiles_per_step(r)
    caused = (f" The code after the break (its resume function) also recompiles every step, "
              f"{fmt_ns(recompile_ns)} per step: that is what the break costs." if recompile_ns else "")
    share = (eager_ns + recompile_ns) / step_p50_ns if step_p50_ns else 0.0
    return [Finding(
        code=Code.GRAPH_BREAKS,
        severity=_at_least_medium(share),
        statement=f"{per_step:g} graph break{'' if per_step == 1 else 's'} per step "
                  f"({r.regions_per_step or 0:g} compiled regions per step, "
                  f"{fmt_ns(eager_ns)} of eager aten ops between them{where}): each break ends a graph, runs "
                  "Python and eager ops, then enters the next graph through its guards." + caused,
        next_step="Remove the break: no .item(), print or data-dependent Python inside the compiled code "
                  "(torch._dynamo.config.capture_scalar_outputs=True for .item()). TORCH_LOGS=graph_breaks names "
                  "each reason; `tracewhy compile TRACE --logs LOG` joins them to these regions.",
        recoverable_ns_per_step=round(eager_ns + recompile_ns),
        evidence={"graph_breaks_per_step": per_step, "regions_per_step": r.regions_per_step,
                  "eager_ns_between_regions_per_step": eager_ns, "break_locations": lines,
                  "resume_recompile_ns_per_step": recompile_ns},
        see=(Code.RECOMPILE,) if recompile_ns else (),
    )]


def _at_least_medium(share: float) -> Severity:
    """A break or steady recompile is worth fixing however small its share: MEDIUM at least."""
    severity = severity_for_share(share)
    return Severity.MEDIUM if severity is Severity.LOW else severity


def _resume_recompiles_per_step(r: CompileResult) -> float:
    """Per steady step, the compile work of resume functions (regions nested in the broken frame's
    region) that recompile every step: a break that hands a changing Python value on causes it."""
    frames = set(every_step_frames(r)) & resume_frames(r)
    if not frames:
        return 0.0
    steady = r.recompiles.filter(pl.col(RecompileCol.FRAME).is_in(list(frames)) & pl.col(RecompileCol.STEADY))
    steps = max(r.per_step.filter(pl.col(CompileStepCol.STEADY)).height, 1)
    return float(steady.get_column(RecompileCol.COST_NS).sum()) / steps


def _cold_start(r: CompileResult) -> list[Finding]:
    if r.cold_start_ns <= 0:
        return []
    return [Finding(
        code=Code.COMPILE_COLD_START,
        severity=Severity.INFO,
        statement=f"Cold start: {r.cold_start_step} spent {fmt_ns(r.cold_start_ns)} compiling "
                  f"({fmt_pct(r.cold_start_share)} of the captured time); it is warm-up, left out of every step "
                  "statistic, but it is the time to the first step.",
        next_step="Expected once per process. To shorten it: keep the compile caches between runs (the FX graph "
                  "and AOTAutograd caches are on by default; keep TORCHINDUCTOR_CACHE_DIR on a persistent disk), "
                  "or compile the repeated block instead of the whole model.",
        evidence={"cold_start_ns": r.cold_start_ns, "step": r.cold_start_step,
                  "share_of_captured": r.cold_start_share, "compile_ns_total": r.compile_ns},
    )]


def _many_small_regions(r: CompileResult, step_p50_ns: float | None) -> list[Finding]:
    per_step = r.regions_per_step
    calls = int(r.regions.get_column(RegionCol.CALLS).sum())
    if per_step is None or per_step < th.MANY_REGIONS_MIN_PER_STEP or calls == 0:
        return []
    mean_ns = float(r.regions.get_column(RegionCol.TOTAL_NS).sum()) / calls
    if mean_ns >= th.SMALL_REGION_MAX_NS:
        return []
    share = (per_step * mean_ns) / step_p50_ns if step_p50_ns else 0.0
    return [Finding(
        code=Code.MANY_SMALL_REGIONS,
        severity=Severity.MEDIUM,
        statement=f"{per_step:g} compiled regions per step, {fmt_ns(mean_ns)} each on average "
                  f"({fmt_pct(share)} of the step inside them): the signature of a model cut into many small graphs "
                  "by graph breaks or recompiles; every region pays a guard check and wrapper overhead.",
        next_step="Find the cuts: TORCH_LOGS=graph_breaks,recompiles (or `tracewhy compile TRACE --logs LOG`); aim "
                  "for one compiled graph per block (torch.compile on the block, no breaks inside).",
        evidence={"regions_per_step": per_step, "mean_region_ns": mean_ns, "graph_breaks_per_step":
                  r.graph_breaks_per_step},
    )]
