"""``compile``: torch.compile regions, breaks, recompiles and compile time
per step, the regions by compile id (joined to TORCH_LOGS when given), as rich tables and as
the ``--json`` payload."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final, TypedDict

from tracewhy.analyses.compile import (
    BREAKS_SCHEMA,
    COMPILE_STEPS_SCHEMA,
    RECOMPILES_SCHEMA,
    REGIONS_SCHEMA,
    BreakCol,
    CompileResult,
    CompileStepCol,
    RecompileCol,
    RegionCol,
)
from tracewhy.analyses.compile_fallback import FALLBACKS_SCHEMA, FallbackCol
from tracewhy.analyses.torch_logs import JOIN_SCHEMA, JoinCol, join_regions
from tracewhy.findings.model import Finding
from tracewhy.model.torch_logs import (
    BREAK_SCHEMA,
    COMPILE_SCHEMA,
    FALLBACK_SCHEMA,
    RANK_SCHEMA,
    RECOMPILE_SCHEMA,
    LogCompileCol,
    LogRankCol,
    TorchLogs,
)
from tracewhy.renderers.layout import FitTable, Layout, label, name, number, step, text
from tracewhy.units import fmt_ns, fmt_pct, printable

if TYPE_CHECKING:
    import polars as pl
    from rich.console import RenderableType

    from tracewhy.renderers.json_schema import rows


class _CompileTotals(TypedDict):
    #: The median over the steady steps; null without one.
    graph_breaks_per_step: float | None
    regions_per_step: float | None
    eager_ns_between_regions_per_step: float | None
    #: Every captured step's.
    recompiles: int
    steady_recompiles: int
    compile_ns: int
    #: The compile work of the first step, when it compiles a frame for the first time.
    cold_start_ns: int
    cold_start_step: str | None
    cold_start_share: float | None
    captured_ns: int
    steps: Annotated[pl.DataFrame, rows(COMPILE_STEPS_SCHEMA, "one row per step, in time order")]
    recompile_list: Annotated[pl.DataFrame, rows(RECOMPILES_SCHEMA, "one row per recompile")]
    break_locations: Annotated[pl.DataFrame, rows(BREAKS_SCHEMA, "where the graph breaks are")]
    fallbacks: Annotated[pl.DataFrame, rows(FALLBACKS_SCHEMA, "one row per frame that stopped running compiled: "
                                            "no region of its last compile, nor of the frame after it, ran")]


class CompileSummary(_CompileTotals):
    """What torch.compile did in the captured steps (the report's ``compile`` section)."""

    regions: Annotated[pl.DataFrame, rows(REGIONS_SCHEMA, "one row per compiled region (frame/compile id)")]


class CompilePayload(CompileSummary):
    """``compile``: compiled regions, graph breaks, recompiles and compile time per step, and the cold start."""

    findings: list[Finding]


class CompileLogsPayload(_CompileTotals):
    """``compile --logs FILE|DIR``: the same, the regions joined to the TORCH_LOGS capture or
    TORCH_TRACE directory, and its breaks and recompiles; from TORCH_TRACE also every compile
    and every rank."""

    regions: Annotated[pl.DataFrame, rows({**REGIONS_SCHEMA, **JOIN_SCHEMA},
                                          "one row per compiled region, with its logged break and guard")]
    findings: list[Finding]
    logged_breaks: Annotated[pl.DataFrame, rows(BREAK_SCHEMA, "one row per logged graph break")]
    logged_recompiles: Annotated[pl.DataFrame, rows(RECOMPILE_SCHEMA, "one row per logged recompile")]
    logged_fallbacks: Annotated[pl.DataFrame, rows(FALLBACK_SCHEMA, "one row per logged frame skip or recompile "
                                                   "limit")]
    logged_compiles: Annotated[pl.DataFrame, rows(COMPILE_SCHEMA, "TORCH_TRACE: one row per compile id per rank, "
                                                  "with its phases' times and cache results (empty from TORCH_LOGS)")]
    logged_ranks: Annotated[pl.DataFrame, rows(RANK_SCHEMA, "TORCH_TRACE: one row per rank log, with how its "
                                               "compiles differ from most ranks' (empty from TORCH_LOGS)")]


def compile_summary(r: CompileResult) -> CompileSummary:
    """What the report shows of torch.compile: ``compile --json`` without the findings."""
    return {
        "graph_breaks_per_step": r.graph_breaks_per_step,
        "regions_per_step": r.regions_per_step,
        "eager_ns_between_regions_per_step": r.eager_ns_per_step,
        "recompiles": r.recompile_count,
        "steady_recompiles": r.steady_recompiles,
        "compile_ns": r.compile_ns,
        "cold_start_ns": r.cold_start_ns,
        "cold_start_step": r.cold_start_step,
        "cold_start_share": r.cold_start_share,
        "captured_ns": r.captured_ns,
        "steps": r.per_step,
        "regions": r.regions,
        "recompile_list": r.recompiles,
        "break_locations": r.breaks,
        "fallbacks": r.fallbacks,
    }


def compile_payload(r: CompileResult, logs: TorchLogs | None,
                    findings: list[Finding]) -> CompilePayload | CompileLogsPayload:
    """JSON: ``steps[]`` (per step: regions, graph_breaks, recompiles, compile_ns,
    eager_ns_between_regions, ...), the totals, ``regions[]`` by compile id, ``recompiles[]``,
    ``break_locations[]`` and, with ``--logs``, ``logged_breaks[]``, ``logged_recompiles[]`` and
    (from a TORCH_TRACE directory) ``logged_compiles[]`` and ``logged_ranks[]``."""
    if logs is None:
        return {**compile_summary(r), "findings": findings}
    return {**compile_summary(r), "regions": join_regions(r.regions, logs), "findings": findings,
            "logged_breaks": logs.breaks, "logged_recompiles": logs.recompiles, "logged_fallbacks": logs.fallbacks,
            "logged_compiles": logs.compiles if logs.compiles is not None else COMPILE_SCHEMA.to_frame(),
            "logged_ranks": logs.ranks if logs.ranks is not None else RANK_SCHEMA.to_frame()}


def render_compile(r: CompileResult, logs: TorchLogs | None, findings: list[Finding], top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    if not r.has_compile:
        return Text("no torch.compile markers in this trace (no Torch-Compiled Region, no compile work)")
    head = Text(
        f"graph breaks per step {_num(r.graph_breaks_per_step)} · regions per step {_num(r.regions_per_step)} · "
        f"recompiles {r.recompile_count} ({r.steady_recompiles} steady) · compile time {fmt_ns(r.compile_ns)} · "
        f"cold start {fmt_ns(r.cold_start_ns)} ({fmt_pct(r.cold_start_share)} of the capture)"
        + (f" · frames given up on {r.fallbacks.height}" if r.fallbacks.height else "")
    )
    parts: list[RenderableType] = [head, _steps_table(r, top), _regions_table(r, logs)]
    if r.recompiles.height:
        t = RECOMPILES_TABLE.table("recompiles (compile ids F/C with C > 0)")
        for row in r.recompiles.iter_rows(named=True):
            t.add_row(row[RecompileCol.REGION], row[RecompileCol.STEP] or "-",
                      "yes" if row[RecompileCol.STEADY] else "no", fmt_ns(row[RecompileCol.COST_NS]))
        parts.append(t)
    if r.fallbacks.height:
        t = FALLBACKS_TABLE.table("frames that stopped running compiled (a compile that ran no region)")
        for row in r.fallbacks.iter_rows(named=True):
            t.add_row(row[FallbackCol.REGION], row[FallbackCol.STEP] or "-", str(row[FallbackCol.COMPILED_BEFORE]),
                      printable(row[FallbackCol.CALL_SITE] or "-"), str(row[FallbackCol.EAGER_STEPS]),
                      fmt_ns(row[FallbackCol.EAGER_NS_PER_STEP]) if row[FallbackCol.EAGER_NS_PER_STEP] is not None
                      else "-")
        parts.append(t)
    if r.breaks.height:
        t = BREAKS_TABLE.table("graph breaks seen as resume functions (Python stacks)")
        for row in r.breaks.head(top).iter_rows(named=True):
            t.add_row(row[BreakCol.LOCATION], row[BreakCol.FUNCTION],
                      str(row[BreakCol.CALLS]), str(row[BreakCol.STEPS]))
        parts.append(t)
    if logs is not None and logs.compiles is not None and logs.compiles.height:
        parts.append(_logged_compiles_table(logs.compiles, top))
    if logs is not None and logs.ranks is not None and logs.ranks.height > 1:
        parts.append(_ranks_table(logs.ranks))
    parts += [Text(f"[{f.code}] {printable(f.statement)} {printable(f.next_step)}") for f in findings]
    return Group(*parts)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


#: ``compile`` per step: breaks, recompiles and compile time stay; the graph and kernel counts
#: leave a narrow terminal first.
COMPILE_STEPS_TABLE: Final = Layout(
    (step(), label("steady"), number("regions"), number("breaks"), number("recompiles"), number("compile"),
     number("eager between"), number("graph calls"), number("kernels"), number("graph launches")),
    drop=("graph launches", "graph calls", "kernels", "eager between", "regions"))
#: ``compile`` regions: calls and time stay; the kernel counts leave first; the logged break wraps.
REGIONS_TABLE: Final = Layout(
    (label("region"), number("calls"), number("after a break"), number("total"), number("kernels"),
     number("graph launches"), text("logged break / failed guard")),
    drop=("graph launches", "kernels", "after a break"))
RECOMPILES_TABLE: Final = Layout((label("region"), step(), label("steady"), number("cost")))
BREAKS_TABLE: Final = Layout((name("location"), name("function"), number("calls"), number("steps")))
FALLBACKS_TABLE: Final = Layout((label("compile"), step(), number("compiled before"), name("call site"),
                                 number("eager steps"), number("eager per step")))


#: TORCH_TRACE compiles: the id, the total and cache results stay; the phases leave first.
LOGGED_COMPILES_TABLE: Final = Layout(
    (label("rank"), label("compile"), name("frame"), number("graphs"), number("breaks"), number("compile"),
     number("dynamo"), number("aot autograd"), number("inductor"), number("backward"), label("fx cache"),
     text("recompiled: guard")),
    drop=("dynamo", "aot autograd", "backward", "breaks", "graphs", "frame"))
RANKS_TABLE: Final = Layout((label("rank"), number("compiles"), number("graphs"), number("breaks"),
                             number("recompiles"), number("compile"), text("differs from most ranks")))


def _ns_cell(value: int | None) -> str:
    return "-" if value is None else fmt_ns(value)


def _logged_compiles_table(compiles: pl.DataFrame, top: int) -> FitTable:
    t = LOGGED_COMPILES_TABLE.table("compiles in the TORCH_TRACE logs (compile id F/C; time by phase)")
    for row in compiles.head(top).iter_rows(named=True):
        rank = row[LogCompileCol.RANK]
        t.add_row("-" if rank is None else str(rank), row[LogCompileCol.COMPILE_ID],
                  printable(f"{row[LogCompileCol.FUNCTION] or '?'} {row[LogCompileCol.LOCATION] or ''}".strip()),
                  str(row[LogCompileCol.GRAPHS]), str(row[LogCompileCol.GRAPH_BREAKS]),
                  *(_ns_cell(row[c]) for c in (LogCompileCol.COMPILE_NS, LogCompileCol.DYNAMO_NS,
                                               LogCompileCol.AOT_AUTOGRAD_NS, LogCompileCol.INDUCTOR_NS,
                                               LogCompileCol.BACKWARD_NS)),
                  printable(row[LogCompileCol.FX_GRAPH_CACHE] or "-"),
                  printable(row[LogCompileCol.RECOMPILE_GUARD] or "-"))
    return t


def _ranks_table(ranks: pl.DataFrame) -> FitTable:
    t = RANKS_TABLE.table("ranks (TORCH_TRACE): what each compiled")
    for row in ranks.iter_rows(named=True):
        rank = row[LogRankCol.RANK]
        t.add_row("-" if rank is None else str(rank), str(row[LogRankCol.COMPILES]), str(row[LogRankCol.GRAPHS]),
                  str(row[LogRankCol.GRAPH_BREAKS]), str(row[LogRankCol.RECOMPILES]),
                  _ns_cell(row[LogRankCol.COMPILE_NS]), printable(row[LogRankCol.DIFFERS] or "-"))
    return t


def _steps_table(r: CompileResult, top: int) -> FitTable:
    t = COMPILE_STEPS_TABLE.table("torch.compile per step")
    cols = [("step", CompileStepCol.STEP), ("steady", CompileStepCol.STEADY), ("regions", CompileStepCol.REGIONS),
            ("breaks", CompileStepCol.GRAPH_BREAKS), ("recompiles", CompileStepCol.RECOMPILES),
            ("compile", CompileStepCol.COMPILE_NS), ("eager between", CompileStepCol.EAGER_NS),
            ("graph calls", CompileStepCol.GRAPH_CALLS), ("kernels", CompileStepCol.KERNELS),
            ("graph launches", CompileStepCol.GRAPH_LAUNCHES)]
    for row in r.per_step.head(top).iter_rows(named=True):
        t.add_row(*[_cell(c, row[c]) for _, c in cols])
    return t


def _cell(column: str, value: Any) -> str:
    if column in (CompileStepCol.COMPILE_NS, CompileStepCol.EAGER_NS):
        return fmt_ns(value)
    if column == CompileStepCol.STEADY:
        return "yes" if value else "no"
    return str(value) if column == CompileStepCol.STEP else printable(str(value))


def _regions_table(r: CompileResult, logs: TorchLogs | None) -> FitTable:
    regions = join_regions(r.regions, logs) if logs is not None else r.regions
    t = REGIONS_TABLE.table("regions by compile id (Torch-Compiled Region: F/C)",
                            omit=() if logs is not None else ("logged break / failed guard",))
    for row in regions.iter_rows(named=True):
        cells = [row[RegionCol.REGION], str(row[RegionCol.CALLS]), str(row[RegionCol.NESTED_CALLS]),
                 fmt_ns(row[RegionCol.TOTAL_NS]), str(row[RegionCol.KERNELS]), str(row[RegionCol.GRAPH_LAUNCHES])]
        if logs is not None:
            cells.append(_logged(row))
        t.add_row(*cells)
    return t


def _logged(row: dict[str, Any]) -> str:
    parts = []
    if row.get(JoinCol.BREAK_LOCATION) or row.get(JoinCol.BREAK_REASON):
        parts.append(f"break at {row.get(JoinCol.BREAK_LOCATION) or '?'}: {row.get(JoinCol.BREAK_REASON) or '?'}")
    if row.get(JoinCol.GUARD):
        parts.append(f"recompiled: {row[JoinCol.GUARD]}")
    return "; ".join(parts) or "-"

