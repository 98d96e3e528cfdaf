"""``roofline`` on a PyTorch profiler trace with input shapes: a first roofline of each operator,
as terminal tables and as JSON."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypedDict

import polars as pl

from tracewhy.findings.roofline_ops import OP_ROOFLINE_SCHEMA, OpRooflineResult
from tracewhy.renderers.layout import Layout, label, name, number
from tracewhy.renderers.roofline_cells import bound_cell, plain, scaled_cell, share_cell
from tracewhy.units import fmt_ns

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tracewhy.renderers.json_schema import rows

#: The columns of the shape roofline's points and of its ops furthest below their roof, of the op table.
OP_POINT_COLUMNS: Final = ("name", "input_dims", "dtype", "precision", "gpu_ns", "bound", "arithmetic_intensity",
                           "flop_per_s", "bytes_per_s")
FURTHEST_COLUMNS: Final = ("name", "input_dims", "dtype", "gpu_ns", "roof_ns", "lost_ns", "roof_fraction", "bound")


def _of(schema: pl.Schema, columns: tuple[str, ...]) -> pl.Schema:
    """The part of a declared table's schema that a payload selects."""
    return pl.Schema({c: schema[c] for c in columns})


class OpCeilings(TypedDict):
    device: str
    source: str
    flop_per_s: dict[str, float]
    dram_bytes_per_s: float


class OpRoofline(TypedDict):
    x: str
    y: str
    #: Null without peaks for the device.
    ceilings: OpCeilings | None
    points: Annotated[pl.DataFrame, rows(_of(OP_ROOFLINE_SCHEMA, OP_POINT_COLUMNS),
                                         "one point per op and shapes with an arithmetic intensity")]


class OpRooflinePayload(TypedDict):
    """``roofline`` on a trace with input shapes: a first roofline of each operator."""

    source: Literal["shapes"]
    device: str | None
    gpu_time_ns: int
    #: GPU time of the ops with an estimate.
    covered_ns: int
    ops: Annotated[pl.DataFrame, rows(OP_ROOFLINE_SCHEMA, "per op name, shapes and dtype, most GPU time first")]
    furthest_below_roof: Annotated[pl.DataFrame, rows(_of(OP_ROOFLINE_SCHEMA, FURTHEST_COLUMNS),
                                                      "the 20 ops that lose most time against their roof")]
    roofline: OpRoofline
    notes: list[str]


#: ``roofline`` on a trace (shapes): the estimate's rates leave before the time and the verdict.
OPS_ROOFLINE_TABLE: Final = Layout(
    (name("op and input shapes"), number("calls"), number("time"), number("TFLOP/s"), number("GB/s"),
     number("roof"), label("bound")),
    drop=("calls", "GB/s", "TFLOP/s"), look="simple")
BELOW_ROOF_TABLE: Final = Layout(
    (name("op and input shapes"), number("time"), number("at roof"), number("lost"), number("reaches"),
     label("bound")),
    drop=("reaches", "at roof"), look="simple")


#: Trailing arguments that are not tensors (``[][][]``): they tell no two ops apart.
_NO_TENSORS: Final = re.compile(r"(\[\])+$")


def _op_label(row: dict[str, Any]) -> str:
    """"mm [8944,1024][1024,2816]": the op without its namespace, then its tensor shapes."""
    name = str(row["name"]).split("::", 1)[-1]
    dims = (row["input_dims"] or "").replace("],[", "][").replace(",[]", "").replace("[[", "[").replace("]]", "]")
    return f"{name} {_NO_TENSORS.sub('', dims)}"


def render_op_roofline(r: OpRooflineResult, top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = []
    head = (f"shape-based roofline on {r.device_name or 'an unknown GPU'}: {r.ops.height} op shapes, "
            f"{fmt_ns(r.covered_ns)} of {fmt_ns(r.gpu_time_ns)} GPU time estimated")
    parts.append(Text(plain(head), style="bold"))
    t = OPS_ROOFLINE_TABLE.table("ops by GPU time")
    for row in r.ops.head(top).iter_rows(named=True):
        t.add_row(plain(_op_label(row)), str(row["calls"]), fmt_ns(row["gpu_ns"]), scaled_cell(row["flop_per_s"], 1e12),
                  scaled_cell(row["bytes_per_s"], 1e9), share_cell(row["roof_fraction"]), bound_cell(row["bound"]))
    parts.append(t)
    worst = r.ops.filter(pl.col("lost_ns").is_not_null()).sort("lost_ns", descending=True).head(min(top, 8))
    if worst.height:
        w = BELOW_ROOF_TABLE.table("furthest below their roof: time lost against the roof")
        for row in worst.iter_rows(named=True):
            w.add_row(plain(_op_label(row)), fmt_ns(row["gpu_ns"]), fmt_ns(row["roof_ns"]), fmt_ns(row["lost_ns"]),
                      share_cell(row["roof_fraction"]), bound_cell(row["bound"]))
        parts.append(w)
    parts.extend(Text(f"note: {plain(n)}", style="yellow") for n in r.notes)
    return Group(*parts)


def op_roofline_payload(r: OpRooflineResult) -> OpRooflinePayload:
    """JSON body for the shape-based roofline."""
    points = r.ops.filter(pl.col("arithmetic_intensity").is_not_null()).select(OP_POINT_COLUMNS)
    peaks = r.peaks
    return {
        "source": "shapes",
        "device": r.device_name,
        "gpu_time_ns": r.gpu_time_ns,
        "covered_ns": r.covered_ns,
        "ops": r.ops,
        "furthest_below_roof": r.ops.filter(pl.col("lost_ns").is_not_null()).sort("lost_ns", descending=True)
        .head(20).select(FURTHEST_COLUMNS),
        "roofline": {
            "x": "arithmetic_intensity (FLOP per minimum byte)", "y": "flop_per_s",
            "ceilings": None if peaks is None else {
                "device": peaks.name, "source": peaks.source, "flop_per_s": peaks.flop_per_s,
                "dram_bytes_per_s": peaks.dram_bytes_per_s},
            "points": points,
        },
        "notes": list(r.notes),
    }
