"""Synchronization points: every blocking call, the op and Python line that made it, and how
long the host was blocked; and device-to-host scalar reads (``.item()``) that really waited."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.host_activity import Flag, HostIndex
from tracewhy.analyses.steps import StepsResult
from tracewhy.model.schema import Col
from tracewhy.model.trace import Trace


@dataclass(frozen=True)
class SyncsResult:
    """``calls``: one row per blocking call: id, name, ts_ns, blocked_ns, op (innermost CPU op),
    annotation, python (innermost Python frame; needs with_stack), step.
    ``per_step``: step, steady, syncs, blocked_ns. ``scalar_reads``: per op name (aten::item,
    _local_scalar_dense, nonzero...) calls and how many of them contained a blocking call."""

    calls: pl.DataFrame
    per_step: pl.DataFrame
    scalar_reads: pl.DataFrame


def syncs(trace: Trace, steps: StepsResult, host: HostIndex) -> SyncsResult:
    trace.require_whole()
    s = trace.slices
    name_col = s.get_column(Col.NAME)
    rows = np.flatnonzero(host.self_flag[Flag.SYNC])
    ids = host.ids[rows]

    def name_of(ctx: npt.NDArray[np.int64]) -> list[str | None]:
        """Names of these slice ids (-1: None), looked up only for them."""
        out: list[str | None] = [None] * ctx.size
        has = np.flatnonzero(ctx >= 0)
        for pos, name in zip(has.tolist(), name_col.gather(ctx[has]).cast(pl.String).to_list(), strict=True):
            out[pos] = name
        return out

    st = steps.table
    starts = st.get_column(Col.TS).to_numpy() if st.height else np.zeros(0, dtype=np.int64)
    ends = st.get_column("window_end_ns").to_numpy() if st.height else np.zeros(0, dtype=np.int64)
    ts = host.ts[rows]
    step = np.searchsorted(starts, ts, side="right") - 1
    in_step = (step >= 0) & (ts < ends[np.maximum(step, 0)]) if starts.size else np.zeros(ts.size, dtype=bool)
    calls = pl.DataFrame({
        Col.ID: ids,
        Col.NAME: name_of(ids),
        Col.TS: ts,
        "blocked_ns": host.end[rows] - ts,
        "op": name_of(host.op_ctx[rows]),
        "annotation": name_of(host.annotation_ctx[rows]),
        "python": name_of(host.python_ctx[rows]),
        "step": pl.Series(np.where(in_step, step, -1)).replace(-1, None).cast(pl.Int64),
    }, schema_overrides={"op": pl.String, "annotation": pl.String, "python": pl.String})
    per_step = (
        st.with_row_index("step").select(pl.col("step").cast(pl.Int64), "steady")
        .join(calls.group_by("step").agg(pl.len().cast(pl.Int64).alias("syncs"), pl.col("blocked_ns").sum()),
              on="step", how="left")
        .with_columns(pl.col("syncs").fill_null(0), pl.col("blocked_ns").fill_null(0))
    )
    # Scalar reads: the op blocked only if a synchronize ran inside it. Names are tested once
    # each (a trace has hundreds of names over millions of host slices).
    host_names = name_col.gather(host.ids)
    read_names = [n for n in host_names.unique().to_list() if n is not None and api_names.is_scalar_read(n)]
    read_rows = np.flatnonzero(host_names.is_in(read_names).to_numpy()) if read_names else np.zeros(0, np.int64)
    sync_ops = set(host.op_ctx[rows].tolist())
    scalar = pl.DataFrame({
        Col.NAME: name_of(host.ids[read_rows]),
        "blocked": [int(host.ids[r]) in sync_ops for r in read_rows],
    }, schema={Col.NAME: pl.String, "blocked": pl.Boolean})
    scalar_reads = scalar.group_by(Col.NAME).agg(pl.len().cast(pl.Int64).alias("calls"),
                                                 pl.col("blocked").sum().cast(pl.Int64).alias("blocking_calls"))
    return SyncsResult(calls=calls, per_step=per_step, scalar_reads=scalar_reads.sort(Col.NAME))
