"""``steps``: every step's span and GPU work, and the steady window's statistics, as a terminal
table and as JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final, TypedDict

from tracewhy.renderers import View
from tracewhy.renderers.layout import Layout, label, number, step
from tracewhy.units import fmt_ns, fmt_pct, printable

if TYPE_CHECKING:  # types only: the result comes from the analysis, which the report has loaded
    from collections.abc import Mapping

    import polars as pl
    from rich.console import RenderableType

    from tracewhy.analyses.mfu_steps import MfuResult
    from tracewhy.analyses.steps import STEPS_SCHEMA, StepsResult, StepStats
    from tracewhy.renderers.json_schema import rows
    from tracewhy.renderers.mfu import MfuJson
    from tracewhy.renderers.several import ComparisonJson, GroupingJson
    from tracewhy.renderers.step_classes import InferenceJson
    from tracewhy.renderers.throughput import ThroughputJson
    from tracewhy.reports.several import SeveralReport
    from tracewhy.reports.steps import StepsReport


class StepsPayload(TypedDict):
    """``steps``: every step in time order, and the statistics of the steady steps' durations."""

    #: The annotation that marks a step (ProfilerStep, or --step NAME).
    marker: str
    #: Leading steps excluded as warm-up, and why.
    warmup: int
    warmup_reason: str
    #: Over the steady steps' durations, named by statistic; null without steady steps.
    stats: StepStats | None
    note: str | None
    steps: Annotated[pl.DataFrame, rows(STEPS_SCHEMA, "one row per step, in time order")]
    #: Each step's and region's model FLOPs utilization; null when it was not measured.
    mfu: MfuJson | None


class StepsThroughputPayload(StepsPayload, total=False):
    """``steps --items-per-step N``: the same, with the throughput at the steady step times; on an
    inference trace (steps classed prefill, decode or mixed), the steps by class."""

    throughput: ThroughputJson | None
    inference: InferenceJson


def steps_payload(r: StepsResult, mfu: MfuResult | None = None) -> StepsPayload:
    """The JSON of ``steps``: ``stats`` are over the steady steps' durations, named by statistic."""
    from tracewhy.renderers.mfu import mfu_json

    return {"marker": r.marker, "warmup": r.warmup, "warmup_reason": r.warmup_reason, "stats": r.stats,
            "note": r.note, "steps": r.table, "mfu": mfu_json(mfu) if mfu is not None else None}


#: ``steps``: the step's own duration and its GPU work stay; the window and the kernel count leave first.
STEPS_TABLE: Final = Layout(
    (step(), number("duration"), number("window"), number("GPU busy"), number("kernels"), number("kernel time"),
     number("MFU"), label("steady", "right")),
    drop=("window", "kernels", "kernel time"))


def render_steps(r: StepsResult, top: int, mfu: MfuResult | None = None) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    from tracewhy.analyses.steps import StepCol  # loaded already: ``r`` comes from it
    from tracewhy.renderers.mfu import mfu_line, render_mfu_regions

    parts: list[RenderableType] = []
    step_mfu = _step_mfu(mfu)
    if r.table.height:
        # No "busy %" column: the work a step launched runs wherever the GPU gets to it (a step
        # behind, or long after a marker that wraps only an asynchronous launch), so its busy
        # time over the step's CPU span or window was not a utilization (it showed 29980%).
        t = STEPS_TABLE.table(f"{r.table.height} steps ({r.marker}); first {r.warmup} excluded as warm-up"
                              + (f": {r.warmup_reason}" if r.warmup_reason else ""),
                              "GPU busy: the GPU work each step launched, wherever it ran. "
                              "Utilization per step window: tracewhy overlap TRACE",
                              omit=() if step_mfu else ("MFU",),
                              notes={"MFU": "MFU: the step's matrix math at the device's peak, over its window"})
        for row in r.table.head(top).iter_rows(named=True):
            t.add_row(row[StepCol.NAME], fmt_ns(row[StepCol.DUR]),
                      fmt_ns(row[StepCol.WINDOW_END] - row[StepCol.TS]), fmt_ns(row[StepCol.GPU_BUSY]),
                      str(row[StepCol.KERNEL_COUNT]), fmt_ns(row[StepCol.KERNEL_TIME]),
                      *((fmt_pct(step_mfu.get((row[StepCol.NAME], row[StepCol.NUMBER]))),) if step_mfu else ()),
                      "yes" if row[StepCol.STEADY] else "warm-up")
        parts.append(t)
    if r.stats is not None:
        s = r.stats
        parts.append(Text(
            f"steady window: {s.count} steps, p50 {fmt_ns(s.p50_ns)}, p90 {fmt_ns(s.p90_ns)}, "
            f"p99 {fmt_ns(s.p99_ns)}, mean {fmt_ns(s.mean_ns)}, min {fmt_ns(s.min_ns)}, max {fmt_ns(s.max_ns)}"
        ))
    line = mfu_line(mfu) if mfu is not None else None
    if line:
        parts.append(Text(line))
    regions = render_mfu_regions(mfu, top) if mfu is not None else None
    if regions is not None:
        parts.append(regions)
    if r.note:
        parts.append(Text(f"note: {printable(r.note)}", style="yellow"))
    return Group(*parts)


def _step_mfu(mfu: MfuResult | None) -> dict[tuple[str, int | None], float | None]:
    """Each step's MFU by name and number; empty when no step has one (a CPU trace: no column)."""
    from tracewhy.analyses.mfu_steps import MfuStepCol

    if mfu is None or mfu.steps.get_column(MfuStepCol.MFU).null_count() == mfu.steps.height:
        return {}
    return {(n, k): v for n, k, v in mfu.steps.select(MfuStepCol.STEP, MfuStepCol.NUMBER, MfuStepCol.MFU).iter_rows()}


def steps_output(r: StepsReport, top: int) -> tuple[Mapping[str, Any], View]:
    """The payload and the view of ``steps``, with the throughput line when it was asked for."""
    from tracewhy.renderers.step_classes import with_classes
    from tracewhy.renderers.throughput import with_throughput

    payload, view = with_throughput(steps_payload(r.result, r.mfu), lambda: render_steps(r.result, top, r.mfu),
                                    r.rate, r.throughput)
    return with_classes(payload, view, r.classes, r.decode)


class StepsInput(StepsThroughputPayload):
    """One trace's steps (as ``steps TRACE --json`` gives them), with its path and rank."""

    path: str
    #: The rank the trace's distributedInfo names; null where it names none.
    rank: int | None


class StepsSeveralPayload(TypedDict):
    """``steps`` of several traces: each one's steps, how they were read (as ranks of one job or
    one after another), and the runs of one program compared with the first."""

    grouping: GroupingJson
    #: In rank order when read as ranks, else as given.
    inputs: list[StepsInput]
    #: Null when read as ranks.
    comparison: ComparisonJson | None


def steps_several_output(r: SeveralReport[StepsReport], top: int) -> tuple[Mapping[str, Any], View]:
    """``steps`` of several traces: each one's table under its heading (``renderers/several.py``)."""
    from tracewhy.renderers.several import several_output

    return several_output(r, lambda s: steps_output(s, top))
