"""MFU beside a command's own output: the ``mfu`` entry of ``steps``, ``account`` and ``report``
JSON, the one line that says it, and the regions table of ``steps``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final, TypedDict

from tracewhy.renderers.layout import Layout, label, name, number
from tracewhy.units import fmt_ns, fmt_pct, printable

if TYPE_CHECKING:
    import polars as pl
    from rich.console import RenderableType

    from tracewhy.analyses.mfu_steps import MFU_REGIONS_SCHEMA, MFU_STEPS_SCHEMA, MfuResult
    from tracewhy.renderers.json_schema import rows


class MfuJson(TypedDict):
    """Model FLOPs utilization: the matrix math (GEMMs, convolutions, attention) of each step and
    region over its time, against the device's peak for each op's precision."""

    #: The GPU the trace names, and the peak-table entry its peaks come from (null: none).
    device: str | None
    peak: str | None
    #: Why MFU is null (no GPU work, a device without peaks), or that peaks were scaled to a partition.
    note: str | None
    #: Where the FLOPs come from: "trace" (its with_flops fields), "shapes", "trace+shapes"; null: no math.
    flops_source: str | None
    #: Over the steady steps together: their ideal time at peak over their windows.
    steady_mfu: float | None
    steady_flops_per_step: float | None
    steps: Annotated[pl.DataFrame, rows(MFU_STEPS_SCHEMA, "one row per step, in time order")]
    regions: Annotated[pl.DataFrame, rows(MFU_REGIONS_SCHEMA, "one row per region with matrix math, most FLOPs first")]


def mfu_json(r: MfuResult) -> MfuJson:
    return {"device": r.device_name, "peak": r.peak_name, "note": r.peak_note, "flops_source": r.flops_source,
            "steady_mfu": r.steady_mfu, "steady_flops_per_step": r.steady_flops_per_step,
            "steps": r.steps, "regions": r.regions}


def fmt_flops(value: float) -> str:
    """A FLOP count with its SI prefix: 5.76 TFLOP."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}FLOP"
    return f"{value:.0f} FLOP"


def mfu_line(r: MfuResult) -> str | None:
    """One sentence: the steady MFU and FLOPs per step, or why there is no MFU; None without math."""
    if r.flops_source is None or r.steady_flops_per_step is None:
        return None
    flops = f"{fmt_flops(r.steady_flops_per_step)} of matrix math per steady step (FLOPs from {r.flops_source})"
    if r.steady_mfu is None:
        return f"MFU: none, {printable(r.peak_note or 'no peak')}; {flops}"
    scaled = f"; {printable(r.peak_note)}" if r.peak_note else ""
    peak = printable(r.peak_name or "")
    return f"MFU {fmt_pct(r.steady_mfu)} of the {peak} peak over the steady steps; {flops}{scaled}"


#: ``steps``: the regions with most matrix math; time and FLOP/s leave a narrow terminal first.
REGIONS: Final = Layout((name("region"), label("kind"), number("instances"), number("time"), number("FLOPs"),
                         number("FLOP/s"), number("MFU")), drop=("kind", "instances", "FLOP/s"))


def render_mfu_regions(r: MfuResult, top: int) -> RenderableType | None:
    from tracewhy.analyses.mfu_steps import MfuRegionCol

    if r.regions.height == 0:
        return None
    basis = r.regions.get_column(MfuRegionCol.TIME_BASIS)[0]
    no_mfu = r.regions.get_column(MfuRegionCol.MFU).null_count() == r.regions.height
    t = REGIONS.table(f"Matrix math per region ({r.regions.height}, most FLOPs first)",
                      f"time: each instance's {basis}, summed", omit=("MFU",) if no_mfu else ())
    for row in r.regions.head(top).iter_rows(named=True):
        rate = row[MfuRegionCol.FLOP_PER_S]
        t.add_row(printable(row[MfuRegionCol.REGION]), row[MfuRegionCol.KIND], str(row[MfuRegionCol.INSTANCES]),
                  fmt_ns(row[MfuRegionCol.TIME_NS]), fmt_flops(row[MfuRegionCol.FLOPS]),
                  f"{fmt_flops(rate)}/s" if rate is not None else None,
                  *(() if no_mfu else (fmt_pct(row[MfuRegionCol.MFU]),)))
    return t
