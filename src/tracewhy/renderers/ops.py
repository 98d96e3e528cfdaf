"""``ops``: per operator (and input shapes), calls, CPU and GPU time, as a terminal table and as
JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final, TypedDict

from tracewhy.renderers.layout import Layout, name, number
from tracewhy.units import fmt_ns

if TYPE_CHECKING:  # types only: the result comes from the analysis, which the report has loaded
    import polars as pl
    from rich.console import RenderableType

    from tracewhy.analyses.ops import OPS_BY_SHAPES_SCHEMA, OPS_SCHEMA, OpsResult
    from tracewhy.renderers.json_schema import rows


class _OpsTotals(TypedDict):
    #: The column the rows are in order of (largest first).
    sort_by: str
    gpu_time_ns: int
    #: GPU time launched outside any op.
    gpu_unattributed_ns: int
    #: GPU time replayed from CUDA/HIP graphs whose launch no op encloses: charged to the
    #: annotation (or launch call) around the launch, which then appears among the ops.
    gpu_graph_outside_op_ns: int


class OpsPayload(_OpsTotals):
    """``ops``: per operator, calls, CPU total and self time, and the GPU time it launched."""

    ops: Annotated[pl.DataFrame, rows(OPS_SCHEMA, "one row per operator")]


class OpsByShapesPayload(_OpsTotals):
    """``ops --shapes``: the same per operator and input shapes."""

    ops: Annotated[pl.DataFrame, rows(OPS_BY_SHAPES_SCHEMA, "one row per operator and input shapes")]


def ops_payload(r: OpsResult) -> OpsPayload | OpsByShapesPayload:
    """The JSON of ``ops``."""
    return {"sort_by": r.sort_by, "gpu_time_ns": r.gpu_time_ns, "gpu_unattributed_ns": r.gpu_unattributed_ns,
            "gpu_graph_outside_op_ns": r.gpu_graph_outside_op_ns, "ops": r.table}


#: ``ops``: the self times tell where an op's own time goes, the totals include its children;
#: CPU totals leave first (GPU time is what the table is sorted by most often).
OPS_TABLE: Final = Layout(
    (name("operator"), name("input shapes"), number("calls"), number("CPU total"), number("CPU self"),
     number("GPU total"), number("GPU self")),
    drop=("CPU total", "GPU total", "calls"))


def render_ops(r: OpsResult, top: int) -> RenderableType:
    from tracewhy.analyses.ops import OpCol  # loaded already: ``r`` comes from it

    graphs = (f", {fmt_ns(r.gpu_graph_outside_op_ns)} replayed from CUDA/HIP graphs launched outside any op "
              "(charged to the annotation around the launch)" if r.gpu_graph_outside_op_ns else "")
    t = OPS_TABLE.table(f"operators by {r.sort_by}; GPU time {fmt_ns(r.gpu_time_ns)}, "
                        f"{fmt_ns(r.gpu_unattributed_ns)} of it launched outside any op{graphs}",
                        omit=() if r.by_shapes else ("input shapes",))
    for row in r.table.head(top).iter_rows(named=True):
        shapes = (row[OpCol.INPUT_DIMS],) if r.by_shapes else ()
        t.add_row(row[OpCol.NAME], *shapes, str(row[OpCol.CALLS]), fmt_ns(row[OpCol.CPU_TOTAL]),
                  fmt_ns(row[OpCol.CPU_SELF]), fmt_ns(row[OpCol.GPU_TOTAL]), fmt_ns(row[OpCol.GPU_SELF]))
    return t
