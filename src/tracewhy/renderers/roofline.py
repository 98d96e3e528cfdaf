"""Terminal and JSON views of the roofline results (ncu reports and shape-based estimates)."""

from __future__ import annotations

import math
import re
import unicodedata
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypedDict

import polars as pl

from tracewhy.analyses.roofline import RULES_SCHEMA, STALLS_SCHEMA
from tracewhy.findings.roofline import (
    COMPUTE_BOUND,
    KERNEL_VERDICTS_SCHEMA,
    LATENCY_BOUND,
    LAUNCH_VERDICTS_SCHEMA,
    MEMORY_BOUND,
    OP_ROOFLINE_SCHEMA,
    UNKNOWN,
    NcuRooflineResult,
    OpRooflineResult,
    rule_rank,
)
from tracewhy.model.ncu import NcuRun
from tracewhy.renderers.layout import Layout, label, name, number
from tracewhy.renderers.names import cut_middle
from tracewhy.units import fmt_ns, fmt_pct

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.text import Text

    from tracewhy.renderers.json_schema import rows

#: The columns of the ncu roofline's points, of the launch table.
NCU_POINT_COLUMNS: Final = ("launch_id", "name", "dur_ns", "bound", "precision", "arithmetic_intensity", "flop_per_s",
                            "dram_bytes_per_s")
#: The columns of the shape roofline's points and of its ops furthest below their roof, of the op table.
OP_POINT_COLUMNS: Final = ("name", "input_dims", "dtype", "precision", "gpu_ns", "bound", "arithmetic_intensity",
                           "flop_per_s", "bytes_per_s")
FURTHEST_COLUMNS: Final = ("name", "input_dims", "dtype", "gpu_ns", "roof_ns", "lost_ns", "roof_fraction", "bound")


def _of(schema: pl.Schema, columns: tuple[str, ...]) -> pl.Schema:
    """The part of a declared table's schema that a payload selects."""
    return pl.Schema({c: schema[c] for c in columns})


class NcuReportInfo(TypedDict):
    path: str
    #: How the report was read: ncu-rep, csv-details, csv-raw, ...
    format: str
    tool_version: str | None
    device: str | None
    #: Whether ncu locked the clocks (its default); null where it does not say.
    clocks_locked: bool | None


class NcuCeilings(TypedDict):
    """The roofs: peak FLOP/s per precision and DRAM bytes/s, and where they came from."""

    flop_per_s: dict[str, float]
    dram_bytes_per_s: float | None
    source: str


class NcuRoofline(TypedDict):
    """The points and ceilings of a roofline plot."""

    x: str
    y: str
    ceilings: NcuCeilings
    points: Annotated[pl.DataFrame, rows(_of(LAUNCH_VERDICTS_SCHEMA, NCU_POINT_COLUMNS),
                                         "one point per launch with an arithmetic intensity")]


class NcuPayload(TypedDict):
    """``roofline`` on an Nsight Compute report: per kernel and launch, the bound and why."""

    source: Literal["ncu"]
    report: NcuReportInfo
    kernels: Annotated[pl.DataFrame, rows(KERNEL_VERDICTS_SCHEMA, "per kernel name, most time first")]
    launches: Annotated[pl.DataFrame, rows(LAUNCH_VERDICTS_SCHEMA, "per launch, longest first")]
    rules: Annotated[pl.DataFrame, rows(RULES_SCHEMA, "ncu's rule messages per launch")]
    stalls: Annotated[pl.DataFrame, rows(STALLS_SCHEMA, "warp stall reasons per launch")]
    roofline: NcuRoofline
    notes: list[str]


class NcuRunsInfo(TypedDict):
    path: str
    runs: int


class NcuRunPayload(NcuPayload):
    """One ncu run of a file that holds several."""

    run: int
    #: The 1-based line of the run's header in the file.
    header_line: int | None
    #: Added to the run's own launch IDs to give the file-wide launch_id.
    launch_id_offset: int


class NcuRunsPayload(TypedDict):
    """``roofline`` on a CSV that holds several ncu runs: each run's roofline."""

    source: Literal["ncu"]
    report: NcuRunsInfo
    runs: list[NcuRunPayload]


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


_BOUND_STYLE = {MEMORY_BOUND: "cyan", COMPUTE_BOUND: "magenta", LATENCY_BOUND: "yellow", UNKNOWN: "dim"}


def _rate(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.0f}%"


def _share(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else fmt_pct(value)


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}g}"


def _plain(value: object) -> str:
    """Text from a report or trace with control and bidi-format characters removed: a kernel name
    must never move the cursor, recolour the terminal or reverse the line (files come from others)."""
    text = str(value)
    return "".join(" " if ch in "\n\r\t" else ch for ch in text
                   if ch in "\n\r\t" or unicodedata.category(ch) not in ("Cc", "Cf"))


#: ``roofline`` on an ncu report: the verdict (bound, roof) and the time stay; the launch count,
#: the share and the units' percentages leave a narrow terminal first.
NCU_KERNELS_TABLE: Final = Layout(
    (name("kernel"), number("n"), number("time"), number("share"), number("SM"), number("mem"), number("roof"),
     label("bound")),
    drop=("n", "share", "mem", "SM"), look="simple")
NCU_LAUNCHES_TABLE: Final = Layout(
    (name("kernel"), number("id"), number("time"), number("SM"), number("mem"), number("roof"), number("occ"),
     label("bound")),
    drop=("occ", "mem", "SM"), look="simple")
#: ``roofline`` on a trace (shapes): the estimate's rates leave before the time and the verdict.
OPS_ROOFLINE_TABLE: Final = Layout(
    (name("op and input shapes"), number("calls"), number("time"), number("TFLOP/s"), number("GB/s"),
     number("roof"), label("bound")),
    drop=("calls", "GB/s", "TFLOP/s"), look="simple")
BELOW_ROOF_TABLE: Final = Layout(
    (name("op and input shapes"), number("time"), number("at roof"), number("lost"), number("reaches"),
     label("bound")),
    drop=("reaches", "at roof"), look="simple")
NCU_JOIN_TABLE: Final = Layout(
    (name("kernel"), number("time"), label("bound"), number("SM"), number("mem"), number("roof"), label("match")),
    drop=("match", "SM", "mem"), look="simple")


def _scaled(value: float | None, unit: float) -> str:
    if value is None or math.isnan(value):
        return "-"
    v = value / unit
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


#: Trailing arguments that are not tensors (``[][][]``): they tell no two ops apart.
_NO_TENSORS: Final = re.compile(r"(\[\])+$")


def _op_label(row: dict[str, Any]) -> str:
    """"mm [8944,1024][1024,2816]": the op without its namespace, then its tensor shapes."""
    name = str(row["name"]).split("::", 1)[-1]
    dims = (row["input_dims"] or "").replace("],[", "][").replace(",[]", "").replace("[[", "[").replace("]]", "]")
    return f"{name} {_NO_TENSORS.sub('', dims)}"


def _bound(value: str | None) -> Text:
    """The bound without its "-bound" suffix, coloured: tables stay inside 80 columns."""
    from rich.text import Text

    return Text((value or "-").removesuffix("-bound"), style=_BOUND_STYLE.get(value or "", ""))


def render_ncu_roofline(r: NcuRooflineResult, top: int, per_launch: bool = False,
                        shown_elsewhere: tuple[str, ...] = ()) -> RenderableType:
    """Tables and paragraphs for one run; notes in ``shown_elsewhere`` (the reader's warnings,
    printed on stderr) are not repeated."""
    from rich.console import Group
    from rich.text import Text

    launches = r.launches.height
    kernels = r.kernels.height
    head = (f"{r.path}: {launches} launch{'es' if launches != 1 else ''} of {kernels} kernel"
            f"{'s' if kernels != 1 else ''}" + (f" on {r.device_name}" if r.device_name else "")
            + (f", ncu {r.tool_version.split(' ')[0]}" if r.tool_version else ""))
    parts: list[RenderableType] = [Text(_plain(head), style="bold")]
    t = (NCU_LAUNCHES_TABLE if per_launch else NCU_KERNELS_TABLE).table(
        "launches by GPU time" if per_launch else "kernels by GPU time")
    if per_launch:
        for row in r.launches.head(top).iter_rows(named=True):
            occ = (f"{_pct(row['achieved_occupancy_pct'])}/{_pct(row['theoretical_occupancy_pct'])}"
                   if row["achieved_occupancy_pct"] is not None else "-")
            t.add_row(_plain(row["name"]), str(row["launch_id"]), fmt_ns(row["dur_ns"]),
                      _pct(row["sm_pct"]), _pct(row["memory_pct"]), _share(row["roof_fraction"]), occ,
                      _bound(row["bound"]))
    else:
        for row in r.kernels.head(top).iter_rows(named=True):
            t.add_row(_plain(row["name"]), str(row["launches"]), fmt_ns(row["total_ns"]),
                      _share(row["share"]), _pct(row["sm_pct"]), _pct(row["memory_pct"]),
                      _share(row["roof_fraction"]), _bound(row["bound"]))
    parts.append(t)
    parts.extend(_ncu_details(r, top, per_launch))
    parts.extend(Text(f"note: {_plain(n)}", style="yellow") for n in r.notes if n not in shown_elsewhere)
    return Group(*parts)


def _run_heading(run: NcuRun, count: int) -> str:
    return f"run {run.index + 1} of {count}: the ncu export whose header is at line {run.line} (IDs as ncu wrote them)"


def render_ncu_runs(runs: list[tuple[NcuRun, NcuRooflineResult]], top: int, per_launch: bool,
                    shown_elsewhere: tuple[str, ...] = ()) -> RenderableType:
    """A file holding several ncu runs: each run on its own, kernels of different runs never merged."""
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = []
    for run, result in runs:
        parts.append(Text(_run_heading(run, len(runs)), style="bold reverse"))
        parts.append(render_ncu_roofline(result, top, per_launch, shown_elsewhere))
        parts.append(Text(""))
    return Group(*parts)


def _ncu_details(r: NcuRooflineResult, top: int, per_launch: bool) -> list[RenderableType]:
    """A paragraph per kernel (or launch): the verdict, its reasons, and ncu's top rules."""
    from rich.text import Text

    out: list[RenderableType] = []
    rows = r.launches if per_launch else r.kernels
    for row in rows.head(min(top, 8)).iter_rows(named=True):
        label = f"{row['name']}" + (f" (launch {row['launch_id']})" if per_launch else "")
        text = Text()
        text.append(_plain(label), style="bold")
        text.append("  ")
        text.append(row["bound"], style=_BOUND_STYLE.get(row["bound"], ""))
        text.append(f": {_plain(row['reason'])}\n")
        bullets: list[str] = []
        if not per_launch and len(row["bounds"] or []) > 1:
            bullets.append(f"launches differ: {', '.join(row['bounds'])} (see --launches)")
        if row["details"]:
            bullets.extend(row["details"].split("; "))
        if row["top_stalls"] and row["bound"] != LATENCY_BOUND:
            bullets.append(row["top_stalls"])
        ai = row["arithmetic_intensity"]
        if ai is not None and not math.isnan(ai):
            bullets.append(f"{row['precision'] or 'FP'} {_rate(row['flop_per_s'], 'FLOP/s')} over DRAM "
                           f"{_rate(row['dram_bytes_per_s'], 'B/s')}: {ai:.3g} FLOP/B")
        if row["occupancy_limiter"] and not any("limited by" in b for b in bullets):
            bullets.append(f"theoretical occupancy limited by {row['occupancy_limiter']}")
        match = (pl.col("launch_id") == row["launch_id"]) if per_launch else (pl.col("name") == row["name"])
        # Ranked as the verdict's top rule is: global estimated speedups first (rule_rank).
        ranked = sorted(r.rules.filter(match).iter_rows(named=True), key=rule_rank)
        # One line per rule and title: each launch repeats it with its own numbers; the best stays.
        shown = list({(rule["rule_id"], rule["title"]): rule
                      for rule in reversed(ranked)}.values())
        for rule in sorted(shown, key=rule_rank)[:3]:
            speed = (f" (ncu estimates {rule['speedup_pct']:.0f}% {rule['speedup_type'] or ''} speedup)"
                     if rule["speedup_pct"] is not None else "")
            title = rule["title"] or rule["message"].split(". ")[0]
            bullets.append(f"ncu {rule['rule_id']}: {cut_middle(title, 100)}{speed}")
        text.append("\n".join(f"  - {_plain(b)}" for b in bullets))
        out.append(text)
    return out


def render_op_roofline(r: OpRooflineResult, top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = []
    head = (f"shape-based roofline on {r.device_name or 'an unknown GPU'}: {r.ops.height} op shapes, "
            f"{fmt_ns(r.covered_ns)} of {fmt_ns(r.gpu_time_ns)} GPU time estimated")
    parts.append(Text(_plain(head), style="bold"))
    t = OPS_ROOFLINE_TABLE.table("ops by GPU time")
    for row in r.ops.head(top).iter_rows(named=True):
        t.add_row(_plain(_op_label(row)), str(row["calls"]), fmt_ns(row["gpu_ns"]), _scaled(row["flop_per_s"], 1e12),
                  _scaled(row["bytes_per_s"], 1e9), _share(row["roof_fraction"]), _bound(row["bound"]))
    parts.append(t)
    worst = r.ops.filter(pl.col("lost_ns").is_not_null()).sort("lost_ns", descending=True).head(min(top, 8))
    if worst.height:
        w = BELOW_ROOF_TABLE.table("furthest below their roof: time lost against the roof")
        for row in worst.iter_rows(named=True):
            w.add_row(_plain(_op_label(row)), fmt_ns(row["gpu_ns"]), fmt_ns(row["roof_ns"]), fmt_ns(row["lost_ns"]),
                      _share(row["roof_fraction"]), _bound(row["bound"]))
        parts.append(w)
    parts.extend(Text(f"note: {_plain(n)}", style="yellow") for n in r.notes)
    return Group(*parts)


def ncu_payload(r: NcuRooflineResult) -> NcuPayload:
    """JSON body for an ncu roofline: tables, and points and ceilings ready to plot."""
    points = r.launches.filter(pl.col("arithmetic_intensity").is_not_null()).select(NCU_POINT_COLUMNS)
    return {
        "source": "ncu",
        "report": {"path": r.path, "format": r.format, "tool_version": r.tool_version,
                   "device": r.device_name, "clocks_locked": r.clocks_locked},
        "kernels": r.kernels,
        "launches": r.launches,
        "rules": r.rules,
        "stalls": r.stalls,
        "roofline": {
            "x": "arithmetic_intensity (FLOP per DRAM byte)", "y": "flop_per_s",
            "ceilings": {"flop_per_s": r.ceilings.flop_per_s,
                         "dram_bytes_per_s": r.ceilings.dram_bytes_per_s, "source": r.ceilings.source},
            "points": points,
        },
        "notes": list(r.notes),
    }


def ncu_runs_payload(path: str, runs: list[tuple[NcuRun, NcuRooflineResult]]) -> NcuRunsPayload:
    """JSON body for a file of several ncu runs: one ncu_payload per run, under ``runs``.

    A run's tables carry ncu's own launch IDs; ``launch_id_offset`` maps them to the file-wide
    launch_id of ``NcuReport`` (``model/ncu.py``).
    """
    return {
        "source": "ncu",
        "report": {"path": path, "runs": len(runs)},
        "runs": [{"run": run.index, "header_line": run.line, "launch_id_offset": run.id_offset,
                  **ncu_payload(result)} for run, result in runs],
    }


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


def render_ncu_join(joined: pl.DataFrame, top: int) -> RenderableType:
    """The trace's kernels with the verdict ncu's report gives the same kernel."""
    from rich.console import Group
    from rich.text import Text

    matched = joined.filter(pl.col("ncu_bound").is_not_null())
    t = NCU_JOIN_TABLE.table("ncu verdicts for the trace's kernels")
    for row in matched.head(top).iter_rows(named=True):
        t.add_row(_plain(row["name"]), fmt_ns(row["total_ns"]), _bound(row["ncu_bound"]),
                  _pct(row["ncu_sm_pct"]), _pct(row["ncu_memory_pct"]), _share(row["ncu_roof_fraction"]),
                  row["ncu_match"] or "-")
    counts = joined.get_column("ncu_match").value_counts()
    by = {r["ncu_match"]: r["count"] for r in counts.iter_rows(named=True)}
    summary = (f"{matched.height} of {joined.height} trace kernels matched ncu kernels "
               f"({by.get('exact', 0)} by full name, {by.get('base name', 0)} by base name"
               + (f"; {by['ambiguous']} ambiguous base names left unmatched" if by.get("ambiguous") else "")
               + ")")
    return Group(t, Text(summary, style="yellow"))
