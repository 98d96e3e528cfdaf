"""The ``nvtx`` command's table and JSON: per range name, CPU-side time beside GPU projection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tracewhy.units import fmt_ns, fmt_pct, name_cells

if TYPE_CHECKING:  # types only: importing the analyses here would load them
    from rich.console import RenderableType

    from tracewhy.analyses.nvtx_ranges import NvtxRangesResult


def empty_note(r: NvtxRangesResult, path: str) -> str | None:
    """What to say when the trace holds no ranges (None when it holds some)."""
    if r.table.height:
        return None
    if r.source == "nvtx":
        return f"no NVTX ranges in {path}"
    return f"no user annotations (record_function ranges) in {path}"


def nvtx_payload(r: NvtxRangesResult, path: str) -> dict[str, Any]:
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


def render_nvtx(r: NvtxRangesResult, top: int) -> RenderableType:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    what = "NVTX ranges" if r.source == "nvtx" else "user annotations"
    t = Table(title=f"{r.range_count} {what} under {r.table.height} names, {fmt_ns(r.total_ns)} in all "
                    "(nested ranges each count in full)")
    # Median and stddev are in --json; with them the table no longer fits 160 columns.
    for col in ("range", "style", "count", "total", "avg", "min", "max", "share", "GPU proj", "GPU ops", "GPU time"):
        t.add_column(col, justify="left" if col in ("range", "style") else "right", no_wrap=col != "range")
    rows = list(r.table.head(top).iter_rows(named=True))
    for row, name in zip(rows, name_cells([row["name"] for row in rows]), strict=True):
        ops = row["total_gpu_ops"]
        t.add_row(name, row["style"], str(row["count"]), fmt_ns(row["total_ns"]),
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
