"""``roofline`` on an Nsight Compute report: each kernel's verdict as terminal tables and as JSON,
run by run for a file of several ncu runs. On a trace, the shape-based roofline is
``renderers/roofline_ops.py``'s."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Final, Literal, TypedDict

import polars as pl

from tracewhy.analyses.roofline import RULES_SCHEMA, STALLS_SCHEMA
from tracewhy.findings.roofline import (
    KERNEL_VERDICTS_SCHEMA,
    LATENCY_BOUND,
    LAUNCH_VERDICTS_SCHEMA,
    NcuRooflineResult,
    rule_rank,
)
from tracewhy.model.ncu import NcuRun
from tracewhy.renderers import View
from tracewhy.renderers.layout import Layout, label, name, number
from tracewhy.renderers.names import cut_middle
from tracewhy.renderers.roofline_cells import BOUND_STYLE, bound_cell, pct_cell, plain, rate_cell, share_cell
from tracewhy.units import fmt_ns

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tracewhy.findings.roofline_ops import OpRooflineResult
    from tracewhy.renderers.json_schema import rows
    from tracewhy.renderers.roofline_ops import OpRooflinePayload
    from tracewhy.reports.roofline import NcuRooflineReport, NcuRunsReport

#: The columns of the ncu roofline's points, of the launch table.
NCU_POINT_COLUMNS: Final = ("launch_id", "name", "dur_ns", "bound", "precision", "arithmetic_intensity", "flop_per_s",
                            "dram_bytes_per_s")


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
    parts: list[RenderableType] = [Text(plain(head), style="bold")]
    t = (NCU_LAUNCHES_TABLE if per_launch else NCU_KERNELS_TABLE).table(
        "launches by GPU time" if per_launch else "kernels by GPU time")
    if per_launch:
        for row in r.launches.head(top).iter_rows(named=True):
            occ = (f"{pct_cell(row['achieved_occupancy_pct'])}/{pct_cell(row['theoretical_occupancy_pct'])}"
                   if row["achieved_occupancy_pct"] is not None else "-")
            t.add_row(plain(row["name"]), str(row["launch_id"]), fmt_ns(row["dur_ns"]),
                      pct_cell(row["sm_pct"]), pct_cell(row["memory_pct"]), share_cell(row["roof_fraction"]), occ,
                      bound_cell(row["bound"]))
    else:
        for row in r.kernels.head(top).iter_rows(named=True):
            t.add_row(plain(row["name"]), str(row["launches"]), fmt_ns(row["total_ns"]),
                      share_cell(row["share"]), pct_cell(row["sm_pct"]), pct_cell(row["memory_pct"]),
                      share_cell(row["roof_fraction"]), bound_cell(row["bound"]))
    parts.append(t)
    parts.extend(_ncu_details(r, top, per_launch))
    parts.extend(Text(f"note: {plain(n)}", style="yellow") for n in r.notes if n not in shown_elsewhere)
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
        text.append(plain(label), style="bold")
        text.append("  ")
        text.append(row["bound"], style=BOUND_STYLE.get(row["bound"], ""))
        text.append(f": {plain(row['reason'])}\n")
        bullets: list[str] = []
        if not per_launch and len(row["bounds"] or []) > 1:
            bullets.append(f"launches differ: {', '.join(row['bounds'])} (see --launches)")
        if row["details"]:
            bullets.extend(row["details"].split("; "))
        if row["top_stalls"] and row["bound"] != LATENCY_BOUND:
            bullets.append(row["top_stalls"])
        ai = row["arithmetic_intensity"]
        if ai is not None and not math.isnan(ai):
            bullets.append(f"{row['precision'] or 'FP'} {rate_cell(row['flop_per_s'], 'FLOP/s')} over DRAM "
                           f"{rate_cell(row['dram_bytes_per_s'], 'B/s')}: {ai:.3g} FLOP/B")
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
        text.append("\n".join(f"  - {plain(b)}" for b in bullets))
        out.append(text)
    return out


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


def roofline_output(r: NcuRooflineReport | NcuRunsReport | OpRooflineResult, top: int, per_launch: bool
                    ) -> tuple[NcuPayload | NcuRunsPayload | OpRooflinePayload, View]:
    """The payload and the view of ``roofline``: an ncu report's (run by run when it holds
    several), or a trace's shape-based estimate. The reader's warnings, printed on stderr, are not
    repeated in the view."""
    from tracewhy.reports.roofline import NcuRooflineReport, NcuRunsReport

    if isinstance(r, NcuRunsReport):
        runs, warnings = r.runs, r.warnings
        return ncu_runs_payload(r.path, runs), lambda: render_ncu_runs(runs, top, per_launch, warnings)
    if isinstance(r, NcuRooflineReport):
        result, warnings = r.result, r.warnings
        return ncu_payload(result), lambda: render_ncu_roofline(result, top, per_launch, warnings)
    from tracewhy.renderers.roofline_ops import op_roofline_payload, render_op_roofline

    return op_roofline_payload(r), lambda: render_op_roofline(r, top)
