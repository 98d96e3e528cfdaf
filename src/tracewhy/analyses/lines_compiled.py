"""``lines`` with compiled kernels (``--logs``): each kernel run's time moved from the frame it ran
under to rows for the source lines it fuses (``kernel_lines`` finds the runs and their lines)."""

from __future__ import annotations

import polars as pl

from tracewhy.analyses.host_tree import HostTree
from tracewhy.analyses.kernel_lines import KernelRunCol
from tracewhy.analyses.lines import LineCol, steady_ns
from tracewhy.analyses.source_lines import I64, LineKind, is_library


def with_compiled(table: pl.DataFrame, runs: pl.DataFrame, owner_frame: I64, include_library: bool,
                   span: tuple[int, int] | None, tree: HostTree) -> pl.DataFrame:
    """The rows with compiled kernel time moved from the frame each kernel ran under (a ``def
    forward`` line, or the output code's ``call``) to rows for the source lines it fuses
    (LineKind.COMPILED). A run's host time is host self time of those lines; totals, calls and
    steady time follow the same shares."""
    ids = runs.get_column(KernelRunCol.ID).to_numpy()
    end = tree.ts + tree.dur
    runs = runs.with_columns(pl.col(KernelRunCol.FILE).replace(_as_traced(runs, table)))
    runs = runs.with_columns(pl.Series("_frame", owner_frame[ids]),
                             pl.Series("_steady", steady_ns(tree.ts[ids], end[ids], span)))
    whole = runs.unique(KernelRunCol.ID).filter(pl.col("_frame") >= 0).group_by("_frame").agg(
        pl.col(KernelRunCol.RUN_HOST).sum().alias("_host"), pl.col(KernelRunCol.RUN_GPU).sum().alias("_gpu"))
    table = table.join(whole, left_on=LineCol.FRAME, right_on="_frame", how="left").with_columns(
        *((pl.col(c) - pl.col(f).fill_null(0)).clip(0).alias(c) for c, f in (
            (LineCol.HOST_SELF, "_host"), (LineCol.GPU_SELF, "_gpu")))).drop("_host", "_gpu")
    share = pl.col(KernelRunCol.HOST) / pl.col(KernelRunCol.RUN_HOST).cast(pl.Float64)
    added = runs.group_by(KernelRunCol.FILE, KernelRunCol.LINE, KernelRunCol.FUNCTION).agg(
        pl.col(KernelRunCol.ID).n_unique().cast(pl.Int64).alias(LineCol.CALLS),
        pl.col(KernelRunCol.HOST).sum().round().cast(pl.Int64).alias(LineCol.HOST_SELF),
        pl.col(KernelRunCol.GPU).sum().round().cast(pl.Int64).alias(LineCol.GPU_SELF),
        (pl.col("_steady") * share.fill_nan(0.0)).sum().round().cast(pl.Int64).alias(LineCol.HOST_STEADY),
    ).with_columns(pl.col(LineCol.HOST_SELF).alias(LineCol.HOST_TOTAL), pl.col(LineCol.GPU_SELF).alias(LineCol.GPU),
                   pl.lit(0, pl.Int64).alias(LineCol.SYNCS), pl.lit(0, pl.Int64).alias(LineCol.OPS),
                   pl.lit(LineKind.COMPILED).alias(LineCol.LINE_KIND),
                   pl.col(KernelRunCol.FILE).map_elements(lambda f: not is_library(f), return_dtype=pl.Boolean)
                   .alias(LineCol.USER)).sort(KernelRunCol.FILE, KernelRunCol.LINE, KernelRunCol.FUNCTION)
    if not include_library:
        added = added.filter(pl.col(LineCol.USER))
    first = int(table.get_column(LineCol.FRAME).cast(pl.Int64).max() or 0) + 1 if table.height else 0
    added = added.with_columns((pl.int_range(pl.len()) + first).cast(pl.Int64).alias(LineCol.FRAME))
    return pl.concat([table, added.select(table.columns)], how="vertical_relaxed")


def _as_traced(runs: pl.DataFrame, table: pl.DataFrame) -> dict[str, str]:
    """The FX graph's spelling of each compiled line's file (as Dynamo saw it: often absolute)
    mapped to the trace's (torch's Python tracer writes paths relative to sys.path), where the
    trace's is a trailing part of it: one file, one name in the table."""
    traced = [f for f in table.get_column(LineCol.FILE).unique().to_list() if f]
    out = {}
    for file in runs.get_column(KernelRunCol.FILE).unique().to_list():
        tails = [t for t in traced if file == t or file.endswith("/" + t)]
        if tails:
            out[file] = max(tails, key=len)
    return out
