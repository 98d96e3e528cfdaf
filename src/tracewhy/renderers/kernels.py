"""``kernels``: GPU kernel time per name and per family, as terminal tables and as JSON; with
``--ncu``, each kernel with its Nsight Compute verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final, TypedDict

from tracewhy.renderers import View
from tracewhy.renderers.layout import Layout, label, name, number
from tracewhy.units import fmt_ns, fmt_pct

if TYPE_CHECKING:  # types only: the result comes from the analysis, which the report has loaded
    import polars as pl
    from rich.console import RenderableType

    from tracewhy.analyses.kernels import KERNELS_BY_FAMILY_SCHEMA, KERNELS_BY_NAME_SCHEMA, KernelsResult
    from tracewhy.findings.roofline import NCU_JOIN_SCHEMA
    from tracewhy.renderers.json_schema import rows
    from tracewhy.reports.kernels import KernelsReport


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
#: ``kernels --ncu``: the trace's kernels with ncu's verdict; how the name matched leaves first.
NCU_JOIN_TABLE: Final = Layout(
    (name("kernel"), number("time"), label("bound"), number("SM"), number("mem"), number("roof"), label("match")),
    drop=("match", "SM", "mem"), look="simple")


def render_kernels(r: KernelsResult, top: int) -> RenderableType:
    from rich.console import Group

    from tracewhy.analyses.kernels import KernelCol  # loaded already: ``r`` comes from it

    t = KERNEL_TABLE.table(f"{r.total_count} kernels, {fmt_ns(r.total_time_ns)} total",
                           notes={"by": "by: what decided the family (collective args or op, comm-only stream, "
                                         "library, name)"})
    for row in r.by_name.head(top).iter_rows(named=True):
        t.add_row(row[KernelCol.NAME], row[KernelCol.FAMILY], row[KernelCol.RULE], str(row[KernelCol.COUNT]),
                  fmt_ns(row[KernelCol.TOTAL]), fmt_ns(row[KernelCol.MEAN]), fmt_ns(row[KernelCol.P50]),
                  fmt_ns(row[KernelCol.MAX]), fmt_pct(row[KernelCol.SHARE]))
    f = KERNEL_FAMILY_TABLE.table("by family")
    for row in r.by_family.iter_rows(named=True):
        f.add_row(row[KernelCol.FAMILY], str(row[KernelCol.COUNT]), fmt_ns(row[KernelCol.TOTAL]),
                  fmt_pct(row[KernelCol.SHARE]))
    return Group(t, f)


def render_ncu_join(joined: pl.DataFrame, top: int) -> RenderableType:
    """The trace's kernels with the verdict ncu's report gives the same kernel."""
    import polars as pl
    from rich.console import Group
    from rich.text import Text

    from tracewhy.renderers.roofline_cells import bound_cell, pct_cell, plain, share_cell

    matched = joined.filter(pl.col("ncu_bound").is_not_null())
    t = NCU_JOIN_TABLE.table("ncu verdicts for the trace's kernels")
    for row in matched.head(top).iter_rows(named=True):
        t.add_row(plain(row["name"]), fmt_ns(row["total_ns"]), bound_cell(row["ncu_bound"]),
                  pct_cell(row["ncu_sm_pct"]), pct_cell(row["ncu_memory_pct"]), share_cell(row["ncu_roof_fraction"]),
                  row["ncu_match"] or "-")
    counts = joined.get_column("ncu_match").value_counts()
    by = {r["ncu_match"]: r["count"] for r in counts.iter_rows(named=True)}
    summary = (f"{matched.height} of {joined.height} trace kernels matched ncu kernels "
               f"({by.get('exact', 0)} by full name, {by.get('base name', 0)} by base name"
               + (f"; {by['ambiguous']} ambiguous base names left unmatched" if by.get("ambiguous") else "")
               + ")")
    return Group(t, Text(summary, style="yellow"))


def kernels_output(r: KernelsReport, top: int) -> tuple[KernelsPayload | KernelsNcuPayload, View]:
    """The payload and the view of ``kernels``: with ``--ncu``, the verdicts' table under the kernels."""
    if r.joined is None:
        return kernels_payload(r.result), lambda: render_kernels(r.result, top)
    joined = r.joined

    def view() -> RenderableType:
        from rich.console import Group

        return Group(render_kernels(r.result, top), render_ncu_join(joined, top))

    return kernels_payload(r.result, joined), view
