"""Synchronization points: every blocking call, the op and Python line that made it, and how
long the host was blocked; and device-to-host scalar reads (``.item()``) that really waited."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses import compile_markers as cm
from tracewhy.analyses.host_activity import Flag, HostIndex
from tracewhy.analyses.host_tree import nearest_marked
from tracewhy.analyses.name_codes import decide
from tracewhy.analyses.steps import StepCol, StepsResult
from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import Trace


@dataclass(frozen=True)
class SyncsResult:
    """``calls``: one row per blocking call: id, name, ts_ns, blocked_ns, op (innermost CPU op),
    annotation, python (innermost Python frame; needs with_stack), step.
    ``per_step``: step, steady, syncs, blocked_ns. ``scalar_reads``: outermost reads (aten::item,
    nonzero, ...; the _local_scalar_dense inside an item is the same read) per op name, whether
    the optimizer's step was on the stack, the innermost annotation and Python frame: calls and
    how many of them had a synchronize (or synchronous copy) inside."""

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
    ends = st.get_column(StepCol.WINDOW_END).to_numpy() if st.height else np.zeros(0, dtype=np.int64)
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
        st.with_row_index("step").select(pl.col("step").cast(pl.Int64), StepCol.STEADY)
        .join(calls.group_by("step").agg(pl.len().cast(pl.Int64).alias("syncs"), pl.col("blocked_ns").sum()),
              on="step", how="left")
        .with_columns(pl.col("syncs").fill_null(0), pl.col("blocked_ns").fill_null(0))
    )
    # Scalar reads, one per outermost call (aten::item wraps aten::_local_scalar_dense: one read,
    # not two). Names are tested once each (hundreds of names over millions of host slices).
    host_names = name_col.gather(host.ids)
    texts = host_names.unique().drop_nulls().cast(pl.String).to_list()
    is_read_name = decide(texts, api_names.is_scalar_read, api_names.PRETESTS[api_names.is_scalar_read], False)
    read_names = [n for n, yes in zip(texts, is_read_name, strict=True) if yes]
    is_read = host_names.is_in(read_names).to_numpy() if read_names else np.zeros(host.ids.size, dtype=bool)
    if is_read.any():
        is_read &= ~compiler_rows(host_names, host)
    has_read_below = _ancestors_of(host.parent, np.flatnonzero(is_read), host.ids.size)
    read_rows = _split_pairs(s, host, np.flatnonzero(is_read & ~_under(host.parent, is_read)), has_read_below)
    # A read blocked only when a synchronize (or a synchronous copy) ran somewhere inside it.
    holds_sync = _ancestors_of(host.parent, rows, host.ids.size)
    scalar = pl.DataFrame({
        Col.NAME: name_of(host.ids[read_rows]),
        "blocked": holds_sync[read_rows],
        "optimizer": host.on_stack[Flag.OPTIMIZER][read_rows],
        **_read_context(s, host, read_rows, set(st.get_column(Col.NAME).to_list()) if st.height else set()),
    }, schema={Col.NAME: pl.String, "blocked": pl.Boolean, "optimizer": pl.Boolean, "annotation": pl.String,
               "python": pl.String})
    scalar_reads = scalar.group_by(Col.NAME, "optimizer", "annotation", "python").agg(
        pl.len().cast(pl.Int64).alias("calls"), pl.col("blocked").sum().cast(pl.Int64).alias("blocking_calls"))
    return SyncsResult(calls=calls, per_step=per_step, scalar_reads=scalar_reads.sort(
        "calls", Col.NAME, "annotation", "python", descending=[True, False, False, False], nulls_last=True))


def compiler_rows(host_names: pl.Series, host: HostIndex) -> npt.NDArray[np.bool_]:
    """Host rows inside torch.compile's compile work (``(dynamo_timed)`` phases): Dynamo and
    AOT autograd run the model's ops while they trace it, so an ``.item()`` there is the
    compiler's, once per compile, not a read the loop makes every step. ``host_names``: the
    name of each host row."""
    names = [n for n in host_names.unique().to_list() if n is not None]
    owners = frozenset(m.group(1) for n in names if (m := cm.compile_data(n)))
    phases = [n for n in names if cm.is_compile_phase(n, owners)]
    if not phases:
        return np.zeros(host.ids.size, dtype=bool)
    is_phase = host_names.is_in(phases).to_numpy()
    return is_phase | _under(host.parent, is_phase)


#: A Python frame of user code: "file.py(line): function", outside torch and installed packages
#: (torch 2.x writes frames relative to sys.path: torch/optim/adam.py(...), site-packages/...).
_USER_FRAME = re.compile(r"^(?!torch/|.*site-packages/|.*dist-packages/|<).*\.py\(\d+\): ")


def _read_context(s: pl.DataFrame, host: HostIndex, rows: npt.NDArray[np.int64],
                  step_names: set[str]) -> dict[str, list[str | None]]:
    """Per read: the innermost annotation that is not a step marker, and the innermost Python
    frame of user code (the line that asked for the value; None without with_stack)."""
    names = s.get_column(Col.NAME)
    annotation = host.is_kind(Kind.ANNOTATION)
    python = host.is_kind(Kind.PYTHON)
    out: dict[str, list[str | None]] = {"annotation": [], "python": []}
    for row in rows.tolist():
        found_annotation: str | None = None
        found_line: str | None = None
        cur = int(host.parent[row])
        while cur >= 0 and (found_annotation is None or found_line is None):
            if annotation[cur] and found_annotation is None:
                name = str(names[int(host.ids[cur])])
                found_annotation = None if name in step_names else name
                if name in step_names:
                    break  # the step marker is the loop: nothing above it is this read's context
            elif python[cur] and found_line is None:
                name = str(names[int(host.ids[cur])])
                if _USER_FRAME.match(name):
                    found_line = name
            cur = int(host.parent[cur])
        out["annotation"].append(found_annotation)
        out["python"].append(found_line)
    return out


def _split_pairs(s: pl.DataFrame, host: HostIndex, rows: npt.NDArray[np.int64],
                 has_read_below: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
    """``rows`` (outermost reads, in host order) less the second of each pair that containment
    could not nest: two reads on one thread, neither holding a read, the second starting before
    or as the first ends. Integer-µs traces (PyTorch <= 2.3) round aten::item and its
    aten::_local_scalar_dense to 0 µs, at one instant or at the item's end: one read, not two."""
    if rows.size < 2:
        return rows
    ids = host.ids[rows]
    pid = s.get_column(Col.PID).to_numpy()[ids]
    tid = s.get_column(Col.TID).to_numpy()[ids]
    leaf = ~has_read_below[rows]
    second = np.zeros(rows.size, dtype=bool)
    second[1:] = ((pid[1:] == pid[:-1]) & (tid[1:] == tid[:-1]) & leaf[1:] & leaf[:-1]
                  & (host.ts[rows[1:]] <= host.end[rows[:-1]]))
    # A chain a-b-c of touching leaves is a-b one read and c another: drop b only.
    for i in np.flatnonzero(second):
        if second[i - 1]:
            second[i] = False
    return rows[~second]


def _under(parent: npt.NDArray[np.int64], marked: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """Rows with a marked ancestor (strictly above them). Every row walking its parents took
    depth squared steps (1e5 nested ops: minutes); ``nearest_marked`` takes log2(depth) rounds."""
    above = nearest_marked(parent, marked)
    out: npt.NDArray[np.bool_] = np.where(parent >= 0, above[np.maximum(parent, 0)] >= 0, False)
    return out


def _ancestors_of(parent: npt.NDArray[np.int64], rows: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.bool_]:
    """Rows that are an ancestor of one of ``rows``."""
    out = np.zeros(n, dtype=bool)
    cur = parent[rows]
    while cur.size:
        cur = cur[cur >= 0]
        cur = cur[~out[cur]]  # a row already marked has its ancestors marked too
        out[cur] = True
        cur = parent[cur]
    return out
