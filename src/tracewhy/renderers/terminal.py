"""Readable tables for the terminal (rich) and the JSON payloads of the same results (``info``,
``ops``, ``kernels``, ``steps``). Takes finished results, never a trace."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final, TypedDict

from tracewhy.renderers.layout import Layout, label, name, number, step, text
from tracewhy.units import fmt_bytes, fmt_ns, fmt_pct, printable

if TYPE_CHECKING:  # types only: importing the analyses here would load every one of them
    import polars as pl
    from rich.console import RenderableType

    from tracewhy.analyses.info import InfoDevice, InfoResult
    from tracewhy.analyses.kernels import KERNELS_BY_FAMILY_SCHEMA, KERNELS_BY_NAME_SCHEMA, KernelsResult
    from tracewhy.analyses.ops import OPS_BY_SHAPES_SCHEMA, OPS_SCHEMA, OpsResult
    from tracewhy.analyses.steps import STEPS_SCHEMA, StepsResult, StepStats
    from tracewhy.findings.roofline import NCU_JOIN_SCHEMA
    from tracewhy.renderers.json_schema import rows
    from tracewhy.renderers.throughput import ThroughputJson


class InfoPayload(TypedDict):
    """``info``: what the trace is."""

    info: InfoResult


def info_payload(r: InfoResult) -> InfoPayload:
    """The JSON of ``info``."""
    return {"info": r}


#: ``info``: one line per fact; the value wraps (a file path, the slice counts).
INFO_TABLE: Final = Layout((label("fact"), text("value")), look="plain")


def render_info(r: InfoResult) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    t = INFO_TABLE.table()
    t.add_row(Text("file", style="bold"), r.path)
    t.add_row(Text("format", style="bold"),
              f"{r.format} (schema {r.schema_version})" if r.schema_version else r.format)
    rows: list[tuple[str, str]] = []
    if r.accelerator:
        rows.append(("accelerator", r.accelerator))
    rows += sorted(r.versions.items())
    if r.devices:
        rows += [(f"device {d['device']}", _device_line(d, r.format)) for d in r.devices]
    else:
        rows.append(("devices", "none described"))
    if r.rank is not None or r.world_size is not None:
        rows.append(("rank", f"{r.rank} of {r.world_size} ({r.backend or 'backend unknown'})"))
    c = r.capture
    flags = [name for name in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
             if getattr(c, name)]
    rows += [("capture", (", ".join(flags) or "no extra options") + f"  ({c.source})"),
             ("slices", ", ".join(f"{k} {v}" for k, v in r.slices_by_kind.items()) or "none"),
             ("memory events", str(r.memory_events)), ("flow events", str(r.flow_events)),
             ("steps", f"{r.step_count} ({r.step_marker})"), ("time span", fmt_ns(r.span_ns))]
    for key, value in rows:
        t.add_row(Text(printable(key), style="bold"), value)
    parts: list[RenderableType] = [t]
    for w in r.warnings:
        parts.append(Text(f"warning: {printable(w)}", style="yellow"))
    return Group(*parts)


def _device_line(d: InfoDevice, fmt: str) -> str:
    """Name, compute capability and memory of a device, or why the file does not say them (an
    nsys export without a TARGET_INFO_GPU table printed ``? -``)."""
    cc = f"sm_{d['compute_major']}{d['compute_minor']}" if d["compute_major"] is not None else ""
    mem = d["total_global_mem_bytes"]
    described = [x for x in (d["name"] or "", cc, fmt_bytes(mem) if mem else "") if x]
    if described:
        return " ".join(described)
    from tracewhy.model.trace import NSYS_FORMAT  # (already loaded: a trace was read)

    where = ("this export has no TARGET_INFO_GPU table (its capture did not record GPU properties)"
             if fmt.startswith(NSYS_FORMAT) else "the trace has no deviceProperties entry for it")
    return f"used, but not described: {where}"


class _KernelsTotals(TypedDict):
    total_count: int
    total_time_ns: int
    families: Annotated[pl.DataFrame, rows(KERNELS_BY_FAMILY_SCHEMA, "kernel time per family, largest first")]


class KernelsPayload(_KernelsTotals):
    """``kernels``: kernel time per name and family, largest first."""

    kernels: Annotated[pl.DataFrame, rows(KERNELS_BY_NAME_SCHEMA, "kernel time per name, largest first")]


class KernelsNcuPayload(_KernelsTotals):
    """``kernels --ncu REPORT``: the same, each name with the Nsight Compute verdict of that kernel."""

    kernels: Annotated[pl.DataFrame, rows({**KERNELS_BY_NAME_SCHEMA, **NCU_JOIN_SCHEMA},
                                          "kernel time per name, with ncu's verdict where the name matched")]


def kernels_payload(r: KernelsResult, joined: pl.DataFrame | None = None) -> KernelsPayload | KernelsNcuPayload:
    """The JSON of ``kernels``; ``joined``: the kernel table with Nsight Compute verdicts (--ncu)."""
    return {
        "total_count": r.total_count,
        "total_time_ns": r.total_time_ns,
        "kernels": r.by_name if joined is None else joined,
        "families": r.by_family,
    }


#: ``kernels``: the per-name table; "by" (what decided the family) and the spread leave a narrow
#: terminal first: the total and the share say where the time goes.
KERNEL_TABLE: Final = Layout(
    (name("kernel"), label("family"), label("by"), number("count"), number("total"), number("mean"), number("p50"),
     number("max"), number("share")),
    drop=("by", "mean", "p50", "max", "family"))
KERNEL_FAMILY_TABLE: Final = Layout((label("family"), number("count"), number("total"), number("share")))


def render_kernels(r: KernelsResult, top: int) -> RenderableType:
    from rich.console import Group

    from tracewhy.analyses.kernels import KernelCol  # loaded already: ``r`` comes from it

    t = KERNEL_TABLE.table(f"{r.total_count} kernels, {fmt_ns(r.total_time_ns)} total",
                           notes={"by": "by: what decided the family (collective op, comm-only stream, library, name)"})
    for row in r.by_name.head(top).iter_rows(named=True):
        t.add_row(row[KernelCol.NAME], row[KernelCol.FAMILY], row[KernelCol.RULE], str(row[KernelCol.COUNT]),
                  fmt_ns(row[KernelCol.TOTAL]), fmt_ns(row[KernelCol.MEAN]), fmt_ns(row[KernelCol.P50]),
                  fmt_ns(row[KernelCol.MAX]), fmt_pct(row[KernelCol.SHARE]))
    f = KERNEL_FAMILY_TABLE.table("by family")
    for row in r.by_family.iter_rows(named=True):
        f.add_row(row[KernelCol.FAMILY], str(row[KernelCol.COUNT]), fmt_ns(row[KernelCol.TOTAL]),
                  fmt_pct(row[KernelCol.SHARE]))
    return Group(t, f)


class _OpsTotals(TypedDict):
    #: The column the rows are in order of (largest first).
    sort_by: str
    gpu_time_ns: int
    #: GPU time launched outside any op.
    gpu_unattributed_ns: int


class OpsPayload(_OpsTotals):
    """``ops``: per operator, calls, CPU total and self time, and the GPU time it launched."""

    ops: Annotated[pl.DataFrame, rows(OPS_SCHEMA, "one row per operator")]


class OpsByShapesPayload(_OpsTotals):
    """``ops --shapes``: the same per operator and input shapes."""

    ops: Annotated[pl.DataFrame, rows(OPS_BY_SHAPES_SCHEMA, "one row per operator and input shapes")]


def ops_payload(r: OpsResult) -> OpsPayload | OpsByShapesPayload:
    """The JSON of ``ops``."""
    return {"sort_by": r.sort_by, "gpu_time_ns": r.gpu_time_ns, "gpu_unattributed_ns": r.gpu_unattributed_ns,
            "ops": r.table}


#: ``ops``: the self times tell where an op's own time goes, the totals include its children;
#: CPU totals leave first (GPU time is what the table is sorted by most often).
OPS_TABLE: Final = Layout(
    (name("operator"), name("input shapes"), number("calls"), number("CPU total"), number("CPU self"),
     number("GPU total"), number("GPU self")),
    drop=("CPU total", "GPU total", "calls"))


def render_ops(r: OpsResult, top: int) -> RenderableType:
    from tracewhy.analyses.ops import OpCol  # loaded already: ``r`` comes from it

    t = OPS_TABLE.table(f"operators by {r.sort_by}; GPU time {fmt_ns(r.gpu_time_ns)}, "
                        f"{fmt_ns(r.gpu_unattributed_ns)} of it launched outside any op",
                        omit=() if r.by_shapes else ("input shapes",))
    for row in r.table.head(top).iter_rows(named=True):
        shapes = (row[OpCol.INPUT_DIMS],) if r.by_shapes else ()
        t.add_row(row[OpCol.NAME], *shapes, str(row[OpCol.CALLS]), fmt_ns(row[OpCol.CPU_TOTAL]),
                  fmt_ns(row[OpCol.CPU_SELF]), fmt_ns(row[OpCol.GPU_TOTAL]), fmt_ns(row[OpCol.GPU_SELF]))
    return t


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


class StepsThroughputPayload(StepsPayload, total=False):
    """``steps --items-per-step N``: the same, with the throughput at the steady step times."""

    throughput: ThroughputJson | None


def steps_payload(r: StepsResult) -> StepsPayload:
    """The JSON of ``steps``: ``stats`` are over the steady steps' durations, named by statistic."""
    return {"marker": r.marker, "warmup": r.warmup, "warmup_reason": r.warmup_reason, "stats": r.stats,
            "note": r.note, "steps": r.table}


#: ``steps``: the step's own duration and its GPU work stay; the window and the kernel count leave first.
STEPS_TABLE: Final = Layout(
    (step(), number("duration"), number("window"), number("GPU busy"), number("kernels"), number("kernel time"),
     label("steady", "right")),
    drop=("window", "kernels", "kernel time"))


def render_steps(r: StepsResult, top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    from tracewhy.analyses.steps import StepCol  # loaded already: ``r`` comes from it

    parts: list[RenderableType] = []
    if r.table.height:
        # No "busy %" column: the work a step launched runs wherever the GPU gets to it (a step
        # behind, or long after a marker that wraps only an asynchronous launch), so its busy
        # time over the step's CPU span or window was not a utilization (it showed 29980%).
        t = STEPS_TABLE.table(f"{r.table.height} steps ({r.marker}); first {r.warmup} excluded as warm-up"
                              + (f": {r.warmup_reason}" if r.warmup_reason else ""),
                              "GPU busy: the GPU work each step launched, wherever it ran. "
                              "Utilization per step window: tracewhy overlap TRACE")
        for row in r.table.head(top).iter_rows(named=True):
            t.add_row(row[StepCol.NAME], fmt_ns(row[StepCol.DUR]),
                      fmt_ns(row[StepCol.WINDOW_END] - row[StepCol.TS]), fmt_ns(row[StepCol.GPU_BUSY]),
                      str(row[StepCol.KERNEL_COUNT]), fmt_ns(row[StepCol.KERNEL_TIME]),
                      "yes" if row[StepCol.STEADY] else "warm-up")
        parts.append(t)
    if r.stats is not None:
        s = r.stats
        parts.append(Text(
            f"steady window: {s.count} steps, p50 {fmt_ns(s.p50_ns)}, p90 {fmt_ns(s.p90_ns)}, "
            f"p99 {fmt_ns(s.p99_ns)}, mean {fmt_ns(s.mean_ns)}, min {fmt_ns(s.min_ns)}, max {fmt_ns(s.max_ns)}"
        ))
    if r.note:
        parts.append(Text(f"note: {printable(r.note)}", style="yellow"))
    return Group(*parts)
