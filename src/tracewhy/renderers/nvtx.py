"""``nvtx``: the table and JSON of ranges: per range name, CPU-side time beside GPU projection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final, TypedDict

from tracewhy.renderers.layout import Layout, label, name, number
from tracewhy.units import fmt_ns, fmt_pct

if TYPE_CHECKING:  # types only: importing the analyses here would load them
    import polars as pl
    from rich.console import RenderableType

    from tracewhy.analyses.nvtx_ranges import NVTX_RANGES_SCHEMA, NvtxRangesResult
    from tracewhy.analyses.nvtx_work import Unattributed
    from tracewhy.renderers.json_schema import rows


def empty_note(r: NvtxRangesResult, path: str) -> str | None:
    """What to say when the trace holds no ranges (None when it holds some)."""
    if r.table.height:
        return None
    if r.source == "nvtx":
        return f"no NVTX ranges in {path}"
    return f"no user annotations (record_function ranges) in {path}"


class NvtxPayload(TypedDict):
    """``nvtx``: per range name, its time as nsys nvtx_sum and its GPU projection as nvtx_gpu_proj_sum."""

    #: "nvtx" (nsys input) or "user annotations" (Kineto: record_function ranges).
    source: str
    range_count: int
    total_ns: int
    ranges: Annotated[pl.DataFrame, rows(NVTX_RANGES_SCHEMA, "per (name, style), most time first")]
    #: GPU work launched outside every range; null when there is none.
    unattributed: Unattributed | None
    #: GPU operations with no launching call in the trace.
    ops_without_launch: int
    #: Why there are no ranges; null when there are.
    note: str | None


def nvtx_payload(r: NvtxRangesResult, path: str) -> NvtxPayload:
    """The JSON of ``nvtx``; ``path``: the trace, named in the note of an empty result."""
    return {
        "source": r.source,
        "range_count": r.range_count,
        "total_ns": r.total_ns,
        "ranges": r.table,
        "unattributed": r.unattributed,
        "ops_without_launch": r.ops_without_launch,
        "note": empty_note(r, path),
    }


#: ``nvtx``: a range's total, share and GPU projection stay; the spread and the style leave a
#: narrow terminal first. (Median and stddev are in --json: with them the table no longer fit
#: 160 columns.)
NVTX_TABLE: Final = Layout(
    (name("range"), label("style"), number("count"), number("total"), number("avg"), number("min"), number("max"),
     number("share"), number("GPU proj"), number("GPU ops"), number("GPU time")),
    drop=("min", "max", "style", "GPU ops", "avg", "count", "GPU time"))


def render_nvtx(r: NvtxRangesResult, top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    what = "NVTX ranges" if r.source == "nvtx" else "user annotations"
    t = NVTX_TABLE.table(f"{r.range_count} {what} under {r.table.height} names, {fmt_ns(r.total_ns)} in all "
                         "(nested ranges each count in full)")
    for row in r.table.head(top).iter_rows(named=True):
        ops = row["total_gpu_ops"]
        t.add_row(row["name"], row["style"], str(row["count"]), fmt_ns(row["total_ns"]),
                  fmt_ns(row["mean_ns"]), fmt_ns(row["min_ns"]), fmt_ns(row["max_ns"]), fmt_pct(row["share"]),
                  fmt_ns(row["total_proj_ns"]), "-" if ops is None else str(ops), fmt_ns(row["total_gpu_time_ns"]))
    parts: list[RenderableType] = [t]
    if r.table.height > top:
        parts.append(Text(f"{r.table.height - top} more names (--top N, or --json for all)", style="dim"))
    parts.append(Text("GPU proj: span from the first to the last GPU operation launched inside the range "
                      "(nsys nvtx_gpu_proj_sum), summed over instances; GPU time: those operations' own "
                      "time. Median and stddev: --json.", style="dim"))
    if r.unattributed is not None:
        parts.append(Text(f"{r.unattributed.num_ops} GPU operations were launched outside every range "
                          f"(span {fmt_ns(r.unattributed.dur_ns)}).", style="dim"))
    return Group(*parts)
