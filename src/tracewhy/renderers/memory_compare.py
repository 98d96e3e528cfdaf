"""``memory`` on several ranks (each rank's peak, the imbalance, the sites that differ) and
``memory A --vs B`` (what grew), as rich tables and as their ``--json`` payloads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final, Literal, TypedDict

from tracewhy.analyses.memory_compare import (
    GROWTH_SCHEMA,
    MEASURES_SCHEMA,
    OP_GROWTH_SCHEMA,
    RANK_MEMORY_SCHEMA,
    RANK_SITES_SCHEMA,
    GrowthCol,
    MemoryCapture,
    MemoryGrowth,
    MemoryMeasureCol,
    MemoryRanks,
    RankMemCol,
    RankSiteCol,
)
from tracewhy.findings.model import Finding
from tracewhy.renderers import View
from tracewhy.renderers.layout import Layout, label, name, number
from tracewhy.units import fmt_bytes, printable

if TYPE_CHECKING:
    import polars as pl
    from rich.console import RenderableType

    from tracewhy.renderers.json_schema import rows
    from tracewhy.reports.memory import MemoryGrowthReport, MemoryRanksReport


class MemoryRanksPayload(TypedDict):
    """``memory`` on several ranks' traces or snapshots: each rank's peak, the highest rank
    against the median, and the allocation sites whose bytes at the peak differ between ranks."""

    input: Literal["ranks"]
    ranks: Annotated[pl.DataFrame, rows(RANK_MEMORY_SCHEMA, "one row per rank, in rank order")]
    max_rank: int
    max_peak_bytes: int
    median_peak_bytes: float
    #: The highest peak over the median peak; null where the median is 0.
    imbalance: float | None
    sites: Annotated[pl.DataFrame, rows(RANK_SITES_SCHEMA, "bytes live at each rank's peak per allocation site, "
                                                           "the sites that differ most between ranks first")]
    findings: list[Finding]


class MemoryCaptureJson(TypedDict):
    """One side of ``--vs``: its file, kind and device."""

    source: str
    #: "trace" or "snapshot".
    kind: str
    device: str
    #: Each steady step's own peak of allocated (traces with steps).
    step_peaks_bytes: list[int]


class MemoryGrowthPayload(TypedDict):
    """``memory A --vs B``: what grew from run A to run B: the peak, reserved against allocated,
    and the bytes live at each peak per allocation site, with the noise a difference must exceed."""

    input: Literal["vs"]
    a: MemoryCaptureJson
    b: MemoryCaptureJson
    #: The larger of either run's step-to-step spread of its peak and 0.5% of the larger peak.
    noise_bytes: int
    peak_growth_bytes: int
    measures: Annotated[pl.DataFrame, rows(MEASURES_SCHEMA, "peak allocated, peak reserved, reserved at the "
                                                            "peak and the slack at it, in A and in B")]
    sites: Annotated[pl.DataFrame, rows(GROWTH_SCHEMA, "bytes live at each run's peak per allocation site, the "
                                                       "largest growth first")]
    ops: Annotated[pl.DataFrame, rows(OP_GROWTH_SCHEMA, "the sites summed per op, largest growth first (empty "
                                                        "for snapshots)")]
    findings: list[Finding]


def memory_ranks_payload(r: MemoryRanks, findings: list[Finding]) -> MemoryRanksPayload:
    return {"input": "ranks", "ranks": r.ranks, "max_rank": r.max_rank, "max_peak_bytes": r.max_peak_bytes,
            "median_peak_bytes": r.median_peak_bytes, "imbalance": r.imbalance, "sites": r.sites,
            "findings": findings}


def _capture_json(c: MemoryCapture) -> MemoryCaptureJson:
    return {"source": c.source, "kind": c.kind, "device": c.device, "step_peaks_bytes": list(c.step_peaks_bytes)}


def memory_growth_payload(g: MemoryGrowth, findings: list[Finding]) -> MemoryGrowthPayload:
    return {"input": "vs", "a": _capture_json(g.a), "b": _capture_json(g.b), "noise_bytes": g.noise_bytes,
            "peak_growth_bytes": g.peak_growth_bytes, "measures": g.measures, "sites": g.sites, "ops": g.ops,
            "findings": findings}


RANKS_TABLE: Final = Layout((label("rank"), label("device"), number("peak allocated"), number("vs median"),
                             number("reserved at peak"), label("rank from")),
                            drop=("rank from", "reserved at peak"))
RANK_SITES_TABLE: Final = Layout((name("site"), number("most"), label("on rank"), number("least"), label("on rank "),
                                  number("median")), drop=("median",))
MEASURES_TABLE: Final = Layout((label("measure"), number("A"), number("B"), number("growth")))
GROWTH_TABLE: Final = Layout((name("site"), number("A"), number("B"), number("growth")), drop=("A",))
OPS_TABLE: Final = Layout((name("op"), number("A"), number("B"), number("growth")), drop=("A",))


def _site(op: str | None, frame: str | None, size_class: int | None) -> str:
    return " ".join(x for x in (op, frame, f"[{fmt_bytes(size_class)} class]" if size_class else None) if x) or "-"


def _signed(n: int | None) -> str:
    return "-" if n is None else f"+{fmt_bytes(n)}" if n > 0 else f"-{fmt_bytes(-n)}" if n < 0 else "0 B"


def render_memory_ranks(r: MemoryRanks, findings: list[Finding], top: int) -> RenderableType:
    from rich.console import Group

    ratio = "-" if r.imbalance is None else f"{r.imbalance:.2f}x"
    t = RANKS_TABLE.table(f"memory per rank: rank {r.max_rank} peaks highest, {ratio} the median "
                          f"{fmt_bytes(int(r.median_peak_bytes))}")
    for row in r.ranks.iter_rows(named=True):
        t.add_row(str(row[RankMemCol.RANK]), row[RankMemCol.DEVICE], fmt_bytes(row[RankMemCol.PEAK_ALLOCATED]),
                  _signed(row[RankMemCol.ABOVE_MEDIAN]), fmt_bytes(row[RankMemCol.RESERVED_AT_PEAK]),
                  row[RankMemCol.RANK_FROM])
    sites = RANK_SITES_TABLE.table("live at each rank's peak: the sites that differ between ranks")
    for row in r.sites.filter(r.sites.get_column(RankSiteCol.SPREAD) > 0).head(top).iter_rows(named=True):
        sites.add_row(_site(row[RankSiteCol.OP], row[RankSiteCol.FRAME], row[RankSiteCol.SIZE_CLASS]),
                      fmt_bytes(row[RankSiteCol.MAX_BYTES]), str(row[RankSiteCol.MAX_RANK]),
                      fmt_bytes(row[RankSiteCol.MIN_BYTES]), str(row[RankSiteCol.MIN_RANK]),
                      fmt_bytes(int(row[RankSiteCol.MEDIAN_BYTES])))
    return Group(t, sites, *_findings(findings))


def render_memory_growth(g: MemoryGrowth, findings: list[Finding], top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    head = Text(f"A: {printable(g.a.source)}\nB: {printable(g.b.source)}")
    devices = g.a.device if g.a.device == g.b.device else f"{g.a.device} (A), {g.b.device} (B)"
    t = MEASURES_TABLE.table(f"{devices}: B against A (noise {fmt_bytes(g.noise_bytes)})")
    for row in g.measures.iter_rows(named=True):
        t.add_row(row[MemoryMeasureCol.MEASURE].replace("_", " "), fmt_bytes(row[MemoryMeasureCol.A_BYTES]),
                  fmt_bytes(row[MemoryMeasureCol.B_BYTES]), _signed(row[MemoryMeasureCol.GROWTH]))
    grown = g.sites.filter(g.sites.get_column(GrowthCol.BEYOND_NOISE))
    if grown.height == 0:
        return Group(head, t, Text(f"live at the peak: no allocation site changed beyond the noise "
                                   f"({g.sites.height} sites)"), *_findings(findings))
    sites = GROWTH_TABLE.table(f"live at the peak: the sites that changed beyond the noise ({grown.height} of "
                               f"{g.sites.height})")
    for row in grown.head(top).iter_rows(named=True):
        sites.add_row(_site(row[GrowthCol.OP], row[GrowthCol.FRAME], row[GrowthCol.SIZE_CLASS]),
                      fmt_bytes(row[GrowthCol.A_BYTES]), fmt_bytes(row[GrowthCol.B_BYTES]),
                      _signed(row[GrowthCol.GROWTH]))
    parts: list[RenderableType] = [head, t, sites]
    ops = g.ops.filter(g.ops.get_column(GrowthCol.BEYOND_NOISE))
    if ops.height:
        by_op = OPS_TABLE.table("the same, summed per op")
        for row in ops.head(top).iter_rows(named=True):
            by_op.add_row(row[GrowthCol.OP], fmt_bytes(row[GrowthCol.A_BYTES]), fmt_bytes(row[GrowthCol.B_BYTES]),
                          _signed(row[GrowthCol.GROWTH]))
        parts.append(by_op)
    return Group(*parts, *_findings(findings))


def _findings(findings: list[Finding]) -> list[RenderableType]:
    from rich.text import Text

    if not findings:
        return [Text("no finding: nothing stands out beyond the noise")]
    return [Text(f"[{f.code}] {printable(f.statement)} {printable(f.next_step)}") for f in findings]


def memory_ranks_output(r: MemoryRanksReport, top: int) -> tuple[MemoryRanksPayload, View]:
    result, found = r.result, r.findings
    return memory_ranks_payload(result, found), lambda: render_memory_ranks(result, found, top)


def memory_growth_output(r: MemoryGrowthReport, top: int) -> tuple[MemoryGrowthPayload, View]:
    result, found = r.result, r.findings
    return memory_growth_payload(result, found), lambda: render_memory_growth(result, found, top)
