"""Readable tables for the terminal (rich) and the JSON payloads of the same results (``info``,
``ops``, ``kernels``, ``steps``). Takes finished results, never a trace."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from tracewhy.units import Fit, fmt_bytes, fmt_ns, fmt_pct, name_cells, printable, shorten

if TYPE_CHECKING:  # types only: importing the analyses here would load every one of them
    import polars as pl
    from rich.console import RenderableType
    from rich.table import Table

    from tracewhy.analyses.info import InfoResult
    from tracewhy.analyses.kernels import KernelsResult
    from tracewhy.analyses.ops import OpsResult
    from tracewhy.analyses.steps import StepsResult


def info_payload(r: InfoResult) -> dict[str, Any]:
    """The JSON of ``info``."""
    return {"info": r}


def render_info(r: InfoResult) -> RenderableType:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("file", shorten(r.path, 200))
    t.add_row("format", f"{r.format} (schema {r.schema_version})" if r.schema_version else r.format)
    if r.accelerator:
        t.add_row("accelerator", shorten(r.accelerator))
    for k, v in sorted(r.versions.items()):
        t.add_row(k, shorten(v))
    if r.devices:
        for d in r.devices:
            t.add_row(f"device {d['device']}", _device_line(d, r.format))
    else:
        t.add_row("devices", "none described")
    if r.rank is not None or r.world_size is not None:
        t.add_row("rank", f"{r.rank} of {r.world_size} ({shorten(r.backend or 'backend unknown')})")
    c = r.capture
    flags = [name for name in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
             if getattr(c, name)]
    t.add_row("capture", (", ".join(flags) or "no extra options") + f"  ({c.source})")
    t.add_row("slices", ", ".join(f"{k} {v}" for k, v in r.slices_by_kind.items()) or "none")
    t.add_row("memory events", str(r.memory_events))
    t.add_row("flow events", str(r.flow_events))
    t.add_row("steps", f"{r.step_count} ({shorten(r.step_marker)})")
    t.add_row("time span", fmt_ns(r.span_ns))
    parts: list[RenderableType] = [t]
    for w in r.warnings:
        parts.append(Text(f"warning: {printable(w)}", style="yellow"))
    return Group(*parts)


def _device_line(d: dict[str, Any], fmt: str) -> str:
    """Name, compute capability and memory of a device, or why the file does not say them (an
    nsys export without a TARGET_INFO_GPU table printed ``? -``)."""
    cc = f"sm_{d['compute_major']}{d['compute_minor']}" if d["compute_major"] is not None else ""
    mem = d["total_global_mem_bytes"]
    described = [x for x in (shorten(d["name"]) if d["name"] else "", cc, fmt_bytes(mem) if mem else "") if x]
    if described:
        return " ".join(described)
    where = ("this export has no TARGET_INFO_GPU table (its capture did not record GPU properties)"
             if fmt.startswith("nsys") else "the trace has no deviceProperties entry for it")
    return f"used, but not described: {where}"


def kernels_payload(r: KernelsResult, joined: pl.DataFrame | None = None) -> dict[str, Any]:
    """The JSON of ``kernels``; ``joined``: the kernel table with Nsight Compute verdicts (--ncu)."""
    return {
        "total_count": r.total_count,
        "total_time_ns": r.total_time_ns,
        "kernels": r.by_name if joined is None else joined,
        "families": r.by_family,
    }


#: Columns of the kernel table left out below these widths, the least needed first: a 9-column
#: table of numbers does not fit 80 columns beside any name (``--wide`` and ``--json`` have them all).
_KERNEL_COLUMNS_FROM: Final = {"by": 120, "mean": 100, "p50": 90}


def render_kernels(r: KernelsResult, top: int) -> RenderableType:
    from rich.console import Group
    from rich.table import Table

    from tracewhy.analyses.kernels import KernelCol  # loaded already: ``r`` comes from it

    rows = list(r.by_name.head(top).iter_rows(named=True))
    names = name_cells([row[KernelCol.NAME] for row in rows])

    def table(width: int) -> Table:
        cols = [c for c in ("kernel", "family", "by", "count", "total", "mean", "p50", "max", "share")
                if width >= _KERNEL_COLUMNS_FROM.get(c, 0)]
        left_out = [c for c in _KERNEL_COLUMNS_FROM if c not in cols]
        t = Table(title=f"{r.total_count} kernels, {fmt_ns(r.total_time_ns)} total",
                  caption="by: what decided the family (collective op, comm-only stream, library, name)" if "by" in cols
                  else f"{', '.join(left_out)}: in a wider terminal, --wide or --json")
        for col in cols:
            t.add_column(col, justify="left" if col in ("kernel", "family", "by") else "right", no_wrap=col != "kernel")
        for row, name in zip(rows, names, strict=True):
            cells: dict[str, RenderableType] = {
                "kernel": name, "family": row[KernelCol.FAMILY], "by": row[KernelCol.RULE],
                "count": str(row[KernelCol.COUNT]), "total": fmt_ns(row[KernelCol.TOTAL]),
                "mean": fmt_ns(row[KernelCol.MEAN]), "p50": fmt_ns(row[KernelCol.P50]),
                "max": fmt_ns(row[KernelCol.MAX]), "share": fmt_pct(row[KernelCol.SHARE])}
            t.add_row(*(cells[c] for c in cols))
        return t

    f = Table(title="by family")
    for col in ("family", "count", "total", "share"):
        f.add_column(col, justify="left" if col == "family" else "right")
    for row in r.by_family.iter_rows(named=True):
        f.add_row(row[KernelCol.FAMILY], str(row[KernelCol.COUNT]), fmt_ns(row[KernelCol.TOTAL]),
                  fmt_pct(row[KernelCol.SHARE]))
    return Group(Fit(table), f)


def ops_payload(r: OpsResult) -> dict[str, Any]:
    """The JSON of ``ops``."""
    return {"sort_by": r.sort_by, "gpu_time_ns": r.gpu_time_ns, "gpu_unattributed_ns": r.gpu_unattributed_ns,
            "ops": r.table}


def render_ops(r: OpsResult, top: int) -> RenderableType:
    from rich.table import Table

    from tracewhy.analyses.ops import OpCol  # loaded already: ``r`` comes from it

    t = Table(title=f"operators by {r.sort_by}; GPU time {fmt_ns(r.gpu_time_ns)}, "
                    f"{fmt_ns(r.gpu_unattributed_ns)} of it launched outside any op")
    t.add_column("operator")
    if r.by_shapes:
        t.add_column("input shapes")
    for col in ("calls", "CPU total", "CPU self", "GPU total", "GPU self"):
        t.add_column(col, justify="right", no_wrap=True)
    rows = list(r.table.head(top).iter_rows(named=True))
    names = name_cells([row[OpCol.NAME] for row in rows])
    dims = name_cells([row[OpCol.INPUT_DIMS] for row in rows], min_width=16) if r.by_shapes else names
    for row, name, shapes in zip(rows, names, dims, strict=True):
        cells: list[RenderableType] = [name]
        if r.by_shapes:
            cells.append(shapes)
        cells += [str(row[OpCol.CALLS]), fmt_ns(row[OpCol.CPU_TOTAL]), fmt_ns(row[OpCol.CPU_SELF]),
                  fmt_ns(row[OpCol.GPU_TOTAL]), fmt_ns(row[OpCol.GPU_SELF])]
        t.add_row(*cells)
    return t


def steps_payload(r: StepsResult) -> dict[str, Any]:
    """The JSON of ``steps``: ``stats`` are over the steady steps' durations, named by statistic."""
    return {"marker": r.marker, "warmup": r.warmup, "warmup_reason": r.warmup_reason, "stats": r.stats,
            "note": r.note, "steps": r.table}


def render_steps(r: StepsResult, top: int) -> RenderableType:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from tracewhy.analyses.steps import StepCol  # loaded already: ``r`` comes from it

    parts: list[RenderableType] = []
    if r.table.height:
        # No "busy %" column: the work a step launched runs wherever the GPU gets to it (a step
        # behind, or long after a marker that wraps only an asynchronous launch), so its busy
        # time over the step's CPU span or window was not a utilization (it showed 29980%).
        t = Table(title=f"{r.table.height} steps ({r.marker}); first {r.warmup} excluded as warm-up"
                        + (f": {r.warmup_reason}" if r.warmup_reason else ""),
                  caption="GPU busy: the GPU work each step launched, wherever it ran. "
                          "Utilization per step window: tracewhy overlap TRACE")
        for col in ("step", "duration", "window", "GPU busy", "kernels", "kernel time", "steady"):
            t.add_column(col, justify="left" if col == "step" else "right")
        for row in r.table.head(top).iter_rows(named=True):
            t.add_row(shorten(row[StepCol.NAME]), fmt_ns(row[StepCol.DUR]),
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
