"""torch.compile from the trace alone: compiled regions per step, graph breaks, recompiles,
compile time and the cold start, CUDA-graph replays, and the eager work between regions.

Structure decides, names only find the slices (``compile_markers`` holds them with their
source). A graph break shows as a region nested in another region on the same thread: Dynamo's
rewritten bytecode of the broken frame runs the eager part, then calls the resume function
``torch_dynamo_resume_in_<fn>_at_<line>``, which is a frame of its own with its own region.
Several regions of one frame side by side are not breaks (a per-block compile runs one
compiled block several times per step). A recompile is compile work for an id ``F/C`` with
C > 0 (``*_data: compile_id=`` annotations name it); where a trace has no such annotations,
the first region ``F/C`` (C > 0) in a step that holds compile work.

``compile_slices`` finds the marked slices and their roles; ``compile_kernels`` says which
region run issued which kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

from tracewhy.analyses import compile_markers as M
from tracewhy.analyses.compile_fallback import FALLBACKS_SCHEMA, FallbackCol, compile_fallbacks
from tracewhy.analyses.compile_kernels import has_triton_kernels, kernel_items, region_work
from tracewhy.analyses.compile_slices import ROLE, STEP_INDEX, Role, anchors, marked_slices, step_of
from tracewhy.analyses.steps import StepsResult, WindowCol, step_windows, steps
from tracewhy.analyses.thread_intervals import END, inside, union_per_thread
from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows

WHOLE_TRACE = "(whole trace)"
ATEN_PREFIX = "aten::"


class CompileStepCol:
    """Columns of ``CompileResult.per_step``, one row per step in time order."""

    STEP: Final = "step"
    NUMBER: Final = "number"
    STEADY: Final = "steady"
    REGIONS: Final = "regions"  # Torch-Compiled Region runs
    GRAPH_BREAKS: Final = "graph_breaks"  # regions nested in a region (resume functions)
    RECOMPILES: Final = "recompiles"  # compile ids F/C, C > 0, first compiled in this step
    COMPILE_NS: Final = "compile_ns"  # union of compile work (dynamo_timed phases) in the step
    EAGER_NS: Final = "eager_ns_between_regions"
    EAGER_OPS: Final = "eager_ops_between_regions"
    GRAPH_CALLS: Final = "graph_calls"  # ## Call CompiledFxGraph ## (forward and backward)
    KERNELS: Final = "kernels"  # GPU kernels launched from regions + inductor CPU kernel frames
    GRAPH_LAUNCHES: Final = "graph_launches"  # cudaGraphLaunch from regions


class RegionCol:
    """Columns of ``CompileResult.regions``, one row per region id F/C."""

    REGION: Final = "region"  # "F/C"
    FRAME: Final = "frame"
    COMPILE: Final = "compile"
    CALLS: Final = "calls"
    NESTED_CALLS: Final = "nested_calls"  # runs inside another region: after a graph break
    TOTAL_NS: Final = "total_ns"
    GRAPH_LAUNCHES: Final = "graph_launches"
    KERNELS: Final = "kernels"


class RecompileCol:
    """Columns of ``CompileResult.recompiles``, one row per compile id with C > 0."""

    REGION: Final = RegionCol.REGION
    FRAME: Final = RegionCol.FRAME
    COMPILE: Final = RegionCol.COMPILE
    STEP: Final = CompileStepCol.STEP
    STEADY: Final = CompileStepCol.STEADY
    COST_NS: Final = "cost_ns"  # compile work of this id (forward and backward)
    FRAME_STEPS: Final = "frame_recompile_steps"  # captured steps in which this frame recompiled


class BreakCol:
    """Columns of ``CompileResult.breaks``: resume functions seen as Python frames."""

    FUNCTION: Final = "function"  # the broken frame's function
    LOCATION: Final = "location"  # file:line of the break
    CALLS: Final = "calls"
    STEPS: Final = "steps"  # steps it ran in


#: The per-step counts, in ``per_step``'s order.
_STEP_COUNTS: Final = (CompileStepCol.REGIONS, CompileStepCol.GRAPH_BREAKS, CompileStepCol.RECOMPILES,
                       CompileStepCol.COMPILE_NS, CompileStepCol.EAGER_NS, CompileStepCol.EAGER_OPS,
                       CompileStepCol.GRAPH_CALLS, CompileStepCol.KERNELS, CompileStepCol.GRAPH_LAUNCHES)
COMPILE_STEPS_SCHEMA: Final = pl.Schema({
    CompileStepCol.STEP: pl.String(), CompileStepCol.NUMBER: pl.Int64(), CompileStepCol.STEADY: pl.Boolean(),
    **{c: pl.Int64() for c in _STEP_COUNTS},
})
REGIONS_SCHEMA: Final = pl.Schema({
    RegionCol.REGION: pl.String(),
    **{c: pl.Int64() for c in (RegionCol.FRAME, RegionCol.COMPILE, RegionCol.CALLS, RegionCol.NESTED_CALLS,
                               RegionCol.TOTAL_NS, RegionCol.GRAPH_LAUNCHES, RegionCol.KERNELS)},
})
RECOMPILES_SCHEMA: Final = pl.Schema({
    RecompileCol.REGION: pl.String(), RecompileCol.FRAME: pl.Int64(), RecompileCol.COMPILE: pl.Int64(),
    RecompileCol.STEP: pl.String(), RecompileCol.STEADY: pl.Boolean(), RecompileCol.COST_NS: pl.Int64(),
    RecompileCol.FRAME_STEPS: pl.Int64(),
})
BREAKS_SCHEMA: Final = pl.Schema({BreakCol.FUNCTION: pl.String(), BreakCol.LOCATION: pl.String(),
                                  BreakCol.CALLS: pl.Int64(), BreakCol.STEPS: pl.Int64()})


@dataclass(frozen=True)
class CompileResult(Rows, rows="per_step"):
    """What torch.compile did in the captured steps: ``per_step`` (COMPILE_STEPS_SCHEMA),
    ``regions`` (REGIONS_SCHEMA), ``recompiles`` (RECOMPILES_SCHEMA), ``breaks`` (BREAKS_SCHEMA),
    ``fallbacks`` (FALLBACKS_SCHEMA: frames that stopped running compiled, whose last compile is
    not in ``recompiles``).
    ``graph_breaks_per_step`` is the median
    over steady steps (None without one); ``recompiles`` counts every captured step;
    ``cold_start_ns`` is the compile work of the first step when that step compiles a frame
    for the first time (it is warm-up, and reported all the same)."""

    per_step: pl.DataFrame
    regions: pl.DataFrame
    recompiles: pl.DataFrame
    breaks: pl.DataFrame
    fallbacks: pl.DataFrame
    graph_breaks_per_step: float | None
    regions_per_step: float | None
    eager_ns_per_step: float | None
    recompile_count: int
    steady_recompiles: int
    compile_ns: int
    cold_start_ns: int
    cold_start_step: str | None
    captured_ns: int

    @property
    def has_compile(self) -> bool:
        return self.regions.height > 0 or self.compile_ns > 0

    @property
    def graph_breaks_measured(self) -> float:
        """``graph_breaks_per_step``, or without steady steps the breaks of every captured step:
        what the graph-breaks finding, ``check --max-graph-breaks`` and ``diff`` state."""
        if self.graph_breaks_per_step is not None:
            return self.graph_breaks_per_step
        return float(self.per_step.get_column(CompileStepCol.GRAPH_BREAKS).sum())

    @property
    def cold_start_share(self) -> float | None:
        return self.cold_start_ns / self.captured_ns if self.captured_ns else None


def _windows(trace: Trace, steps_result: StepsResult) -> pl.DataFrame:
    """Step windows in time order; the whole trace as one non-steady window without steps."""
    w = step_windows(trace, steps_result)
    if w.height == 0:
        lo = int(trace.slices.get_column(Col.TS).min() or 0)  # type: ignore[arg-type]
        return pl.DataFrame({
            WindowCol.STEP: [WHOLE_TRACE], WindowCol.NUMBER: [None], WindowCol.STEADY: [False],
            WindowCol.WINDOW_START: [lo], WindowCol.WINDOW_END: [lo + trace.span_ns + 1],
        }, schema_overrides={WindowCol.NUMBER: pl.Int64})
    return w.sort(WindowCol.WINDOW_START)


def _regions(marked: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """One row per region run: frame, compile id, step, and whether it runs nested in another."""
    r = marked.filter(pl.col(ROLE) == Role.REGION)
    ids = r.get_column(Col.NAME).str.extract_groups(M.REGION.pattern)
    prev_end = pl.col(END).cum_max().shift(1).over([Col.PID, Col.TID])
    return (
        r.with_columns(
            ids.struct.field("1").cast(pl.Int64).alias(RegionCol.FRAME),
            ids.struct.field("2").cast(pl.Int64).alias(RegionCol.COMPILE),
            step_of(r.get_column(Col.TS), windows),
        )
        .sort([Col.PID, Col.TID, Col.TS])
        .with_columns((pl.col(Col.TS) < prev_end).fill_null(False).alias("_nested"))
    )


_NO_EAGER: Final = pl.Schema({STEP_INDEX: pl.Int64(), CompileStepCol.EAGER_NS: pl.Int64(),
                               CompileStepCol.EAGER_OPS: pl.UInt32()})


def _eager_between(trace: Trace, regions: pl.DataFrame, marked: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per step: eager aten ops (outermost) from the first outermost region's start to the last
    one's end under one anchor, outside every compiled-code wrapper and compile phase: the
    eager code of a graph break (inside the broken frame's region) and the eager ops between
    per-block regions."""
    outer = regions.filter(~pl.col("_nested"))
    if outer.height == 0:
        return pl.DataFrame(schema=_NO_EAGER)
    outer = outer.with_columns(pl.Series("_anchor", anchors(trace, outer.get_column(Col.ID).to_numpy())))
    spans = outer.group_by([STEP_INDEX, Col.PID, Col.TID, "_anchor"]).agg(pl.col(Col.TS).min(), pl.col(END).max())
    lo = spans.get_column(Col.TS).min()
    hi = spans.get_column(END).max()
    if lo is None or hi is None:
        return pl.DataFrame(schema=_NO_EAGER)
    s = trace.slices
    aten = trace.slices_where(
        (pl.col(Col.KIND) == Kind.CPU_OP.value) & pl.col(Col.TS).is_between(lo, hi)
        & pl.col(Col.NAME).cat.starts_with(ATEN_PREFIX),
        Col.ID, Col.TS, Col.PID, Col.TID, Col.PARENT, (pl.col(Col.TS) + pl.col(Col.DUR)).alias(END), Col.DUR,
    )
    parent_names = s.get_column(Col.NAME).gather(aten.get_column(Col.PARENT).fill_null(0)).cast(pl.String)
    under_aten = aten.get_column(Col.PARENT).is_not_null() & parent_names.str.starts_with(ATEN_PREFIX).fill_null(False)
    outermost = ~under_aten
    aten = aten.filter(outermost)
    hidden = union_per_thread(marked.filter(pl.col(ROLE).is_in([Role.WRAPPER, Role.GRAPH_CALL, Role.COMPILE])))
    in_span = inside(aten, spans.select(Col.PID, Col.TID, Col.TS, END), "_in_span").filter(pl.col("_in_span"))
    eager = inside(in_span, hidden, "_hidden").filter(~pl.col("_hidden"))
    return eager.with_columns(step_of(eager.get_column(Col.TS), windows)).group_by(STEP_INDEX).agg(
        pl.col(Col.DUR).sum().alias(CompileStepCol.EAGER_NS), pl.len().alias(CompileStepCol.EAGER_OPS)
    )


def _step_kernels(items: pl.DataFrame, marked: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per step: kernels and graph launches issued inside compiled code (regions, and graph
    calls, which is where the backward graphs run), and Triton kernels wherever they were
    launched (vLLM runs inductor's graphs without Dynamo, replayed from CUDA graphs)."""
    compiled = union_per_thread(marked.filter(pl.col(ROLE).is_in([Role.REGION, Role.GRAPH_CALL])))
    issued = inside(items, compiled, "_compiled").filter(pl.col("_compiled") | pl.col("_triton"))
    return issued.with_columns(step_of(issued.get_column(Col.TS), windows)).group_by(STEP_INDEX).agg(
        pl.col("_kernel").sum().alias(CompileStepCol.KERNELS),
        pl.col("_launch").sum().alias(CompileStepCol.GRAPH_LAUNCHES))


def _compile_work(marked: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Compile work merged per thread, each piece with its step and clipped to the window."""
    merged = union_per_thread(marked.filter(pl.col(ROLE) == Role.COMPILE))
    merged = merged.with_columns(step_of(merged.get_column(Col.TS), windows))
    wend = windows.get_column(WindowCol.WINDOW_END).to_numpy()
    idx = merged.get_column(STEP_INDEX).fill_null(0).to_numpy()
    return merged.with_columns(
        pl.min_horizontal(END, pl.Series(wend[idx] if wend.size else idx)).alias("_clipped_end")
    ).with_columns((pl.col("_clipped_end") - pl.col(Col.TS)).alias("_ns"))


def _recompiles(marked: pl.DataFrame, regions: pl.DataFrame, work: pl.DataFrame,
                windows: pl.DataFrame) -> tuple[pl.DataFrame, bool]:
    """Recompiled ids (C > 0) with their step and cost; also whether the first step compiles a
    frame for the first time (C == 0), which makes it the cold start."""
    data = marked.filter(pl.col(ROLE) == Role.COMPILE).filter(pl.col(Col.NAME).str.contains(M.COMPILE_DATA.pattern))
    schema = {STEP_INDEX: pl.Int64, RecompileCol.FRAME: pl.Int64, RecompileCol.COMPILE: pl.Int64,
              RecompileCol.COST_NS: pl.Int64}
    if data.height:
        ids = data.get_column(Col.NAME).str.extract_groups(M.COMPILE_DATA.pattern)
        data = data.with_columns(
            ids.struct.field("2").cast(pl.Int64).alias(RecompileCol.FRAME),
            ids.struct.field("3").cast(pl.Int64).alias(RecompileCol.COMPILE),
            step_of(data.get_column(Col.TS), windows),
        )
        cold = data.filter((pl.col(RecompileCol.COMPILE) == 0) & (pl.col(STEP_INDEX) == 0)).height > 0
        pieces = work.select(Col.PID, Col.TID, pl.col(Col.TS).alias("_w_ts"), "_ns").sort("_w_ts")
        costed = data.filter(pl.col(RecompileCol.COMPILE) > 0).sort(Col.TS).join_asof(
            pieces, left_on=Col.TS, right_on="_w_ts", by=[Col.PID, Col.TID], strategy="backward",
                   check_sortedness=False)
        table = costed.group_by(RecompileCol.FRAME, RecompileCol.COMPILE).agg(
            pl.col(STEP_INDEX).sort_by(Col.TS).first(),
            pl.struct("_w_ts", "_ns").unique().struct.field("_ns").sum().alias(RecompileCol.COST_NS),
        )
        return table.select(list(schema)).cast(schema), cold  # type: ignore[arg-type]
    # Without *_data annotations (torch before 2.6): a new F/C in a step that compiles.
    compiling = work.group_by(STEP_INDEX).agg(pl.col("_ns").sum().alias(RecompileCol.COST_NS))
    first = regions.group_by(RecompileCol.FRAME, RecompileCol.COMPILE).agg(pl.col(STEP_INDEX).sort_by(Col.TS).first())
    table = first.filter(pl.col(RecompileCol.COMPILE) > 0).join(compiling, on=STEP_INDEX, how="inner")
    cold = work.filter(pl.col(STEP_INDEX) == 0).height > 0
    return table.select(list(schema)).cast(schema), cold  # type: ignore[arg-type]


def _breaks(marked: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Resume functions seen as Python frames: where each break is, how often it ran."""
    r = marked.filter(pl.col(ROLE) == Role.RESUME)
    parts = r.get_column(Col.NAME).str.extract_groups(M.RESUME.pattern)
    r = r.with_columns(
        parts.struct.field("2").alias(BreakCol.FUNCTION),
        pl.concat_str([parts.struct.field("1").fill_null("?"), pl.lit(":"), parts.struct.field("3")])
        .alias(BreakCol.LOCATION),
        step_of(r.get_column(Col.TS), windows),
    )
    return r.group_by(BreakCol.FUNCTION, BreakCol.LOCATION).agg(
        pl.len().cast(pl.Int64).alias(BreakCol.CALLS),
        pl.col(STEP_INDEX).n_unique().cast(pl.Int64).alias(BreakCol.STEPS)
    ).sort(BreakCol.CALLS, BreakCol.LOCATION, descending=[True, False])


def _median(table: pl.DataFrame, column: str) -> float | None:
    steady = table.filter(pl.col(CompileStepCol.STEADY))
    return float(steady.get_column(column).median()) if steady.height else None  # type: ignore[arg-type]


def compile_analysis(trace: Trace, steps_result: StepsResult | None = None,
                     marked: pl.DataFrame | None = None) -> CompileResult:
    """Regions, breaks, recompiles and compile time per step (see the module docstring); ``marked``:
    the trace's ``marked_slices``, when the caller has them. A trace with no marked slice and no
    Triton kernel (most eager traces) has nothing to count: its result is made at once, without
    the ~60 queries of the analysis on empty tables (``tests/test_compile.py`` compares the two)."""
    trace.require_whole()
    steps_result = steps(trace) if steps_result is None else steps_result
    windows = _windows(trace, steps_result)
    marked = marked if marked is not None else marked_slices(trace)
    if marked.height == 0 and not has_triton_kernels(trace):
        return _nothing_compiled(trace, windows)
    return _analysis(trace, windows, marked)


def _nothing_compiled(trace: Trace, windows: pl.DataFrame) -> CompileResult:
    """``_analysis`` of a trace without marked slices or Triton kernels: every count 0."""
    per_step = windows.select(pl.col(WindowCol.STEP).alias(CompileStepCol.STEP), pl.col(WindowCol.NUMBER),
                              pl.col(WindowCol.STEADY), *[pl.lit(0, pl.Int64).alias(c) for c in _STEP_COUNTS])
    zero = 0.0 if per_step.get_column(CompileStepCol.STEADY).any() else None
    return CompileResult(
        per_step=per_step, regions=pl.DataFrame(schema=REGIONS_SCHEMA),
        recompiles=pl.DataFrame(schema=RECOMPILES_SCHEMA), breaks=pl.DataFrame(schema=BREAKS_SCHEMA),
        fallbacks=pl.DataFrame(schema=FALLBACKS_SCHEMA),
        graph_breaks_per_step=zero, regions_per_step=zero, eager_ns_per_step=zero, recompile_count=0,
        steady_recompiles=0, compile_ns=0, cold_start_ns=0, cold_start_step=None, captured_ns=trace.span_ns)


def _analysis(trace: Trace, windows: pl.DataFrame, marked: pl.DataFrame) -> CompileResult:
    regions = _regions(marked, windows)
    work = _compile_work(marked, windows)
    recompiles, cold = _recompiles(marked, regions, work, windows)
    fallbacks = compile_fallbacks(trace, marked, regions, windows)
    # A compile that produced no region is the frame giving up (the recompile limit, a skipped
    # frame), reported as such, not as a recompile.
    recompiles = recompiles.join(fallbacks.select(FallbackCol.FRAME, FallbackCol.COMPILE),
                                 on=[RecompileCol.FRAME, RecompileCol.COMPILE], how="anti")
    items = kernel_items(trace, marked)
    per_region = region_work(items, regions)
    regions = regions.join(per_region, left_on=Col.ID, right_on="_region_id", how="left").with_columns(
        pl.col("_launches").fill_null(0), pl.col("_kernels").fill_null(0))
    counts = [
        regions.group_by(STEP_INDEX).agg(
            pl.len().alias(CompileStepCol.REGIONS), pl.col("_nested").sum().alias(CompileStepCol.GRAPH_BREAKS)),
        _step_kernels(items, marked, windows),
        recompiles.group_by(STEP_INDEX).agg(pl.len().alias(CompileStepCol.RECOMPILES)),
        work.group_by(STEP_INDEX).agg(pl.col("_ns").sum().alias(CompileStepCol.COMPILE_NS)),
        _eager_between(trace, regions, marked, windows),
        marked.filter(pl.col(ROLE) == Role.GRAPH_CALL).with_columns(step_of(
            marked.filter(pl.col(ROLE) == Role.GRAPH_CALL).get_column(Col.TS), windows)
        ).group_by(STEP_INDEX).agg(pl.len().alias(CompileStepCol.GRAPH_CALLS)),
    ]
    per_step = windows.with_row_index(STEP_INDEX).with_columns(pl.col(STEP_INDEX).cast(pl.Int64)).select(
        STEP_INDEX, pl.col(WindowCol.STEP).alias(CompileStepCol.STEP), pl.col(WindowCol.NUMBER),
        pl.col(WindowCol.STEADY))
    for c in counts:
        per_step = per_step.join(c.drop_nulls(STEP_INDEX), on=STEP_INDEX, how="left")
    per_step = per_step.select(
        CompileStepCol.STEP, CompileStepCol.NUMBER, CompileStepCol.STEADY,
        *[pl.col(c).fill_null(0).cast(pl.Int64) for c in _STEP_COUNTS], STEP_INDEX,
    ).sort(STEP_INDEX)
    step_names = per_step.select(STEP_INDEX, CompileStepCol.STEP, CompileStepCol.STEADY)
    recompile_table = recompiles.join(step_names, on=STEP_INDEX, how="left").select(
        pl.format("{}/{}", RecompileCol.FRAME, RecompileCol.COMPILE).alias(RecompileCol.REGION),
        RecompileCol.FRAME, RecompileCol.COMPILE, RecompileCol.STEP,
        pl.col(RecompileCol.STEADY).fill_null(False), RecompileCol.COST_NS,
    ).sort(RecompileCol.STEP, RecompileCol.FRAME, RecompileCol.COMPILE, nulls_last=True).with_columns(
        pl.col(RecompileCol.STEP).n_unique().over(RecompileCol.FRAME).cast(pl.Int64).alias(RecompileCol.FRAME_STEPS))
    region_table = regions.group_by(RegionCol.FRAME, RegionCol.COMPILE).agg(
        pl.len().cast(pl.Int64).alias(RegionCol.CALLS),
        pl.col("_nested").sum().cast(pl.Int64).alias(RegionCol.NESTED_CALLS),
        pl.col(Col.DUR).sum().alias(RegionCol.TOTAL_NS),
        pl.col("_launches").sum().cast(pl.Int64).alias(RegionCol.GRAPH_LAUNCHES),
        pl.col("_kernels").sum().cast(pl.Int64).alias(RegionCol.KERNELS),
    ).sort(RegionCol.FRAME, RegionCol.COMPILE).select(
        pl.format("{}/{}", RegionCol.FRAME, RegionCol.COMPILE).alias(RegionCol.REGION), pl.all())
    first_compile = int(per_step.get_column(CompileStepCol.COMPILE_NS)[0]) if per_step.height else 0
    return CompileResult(
        per_step=per_step.drop(STEP_INDEX),
        regions=region_table,
        recompiles=recompile_table,
        breaks=_breaks(marked, windows),
        fallbacks=fallbacks.cast(dict(FALLBACKS_SCHEMA)),  # type: ignore[arg-type]
        graph_breaks_per_step=_median(per_step, CompileStepCol.GRAPH_BREAKS),
        regions_per_step=_median(per_step, CompileStepCol.REGIONS),
        eager_ns_per_step=_median(per_step, CompileStepCol.EAGER_NS),
        recompile_count=recompile_table.height,
        steady_recompiles=recompile_table.filter(pl.col(RecompileCol.STEADY)).height,
        compile_ns=int(work.get_column("_ns").sum()),
        cold_start_ns=first_compile if cold else 0,
        cold_start_step=str(per_step.get_column(CompileStepCol.STEP)[0]) if cold and per_step.height else None,
        captured_ns=trace.span_ns,
    )
