"""Which Python line is slow: calls, host and GPU time per source frame, and the stacks a flame
graph draws, from ``python_function`` frames (PyTorch >= 1.10, nested over the ops they call) or,
in older traces, the ``Call stack`` text on each op. Names and nesting: ``source_lines``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.host_tree import HostTree
from tracewhy.analyses.kernel_lines import CompiledLines, compiled_lines
from tracewhy.analyses.source_lines import (
    I64,
    B,
    LineKind,
    call_stacks,
    parse_frame,
    running_at_start,
)
from tracewhy.analyses.steps import StepsResult, steady_span, steps
from tracewhy.model.kernel_provenance import KernelProvenance
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, OpAttrCol
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows


class LineCol:
    """Columns of ``LinesResult.table``: one row per source frame (file, line, function)."""

    FRAME: Final = "frame"  # the row's index in ``LinesResult.frames``; stacks refer to it
    FILE: Final = "file"
    LINE: Final = "line"
    FUNCTION: Final = "function"
    LINE_KIND: Final = "line_kind"  # what LINE is (source_lines.LineKind): "def", "at_start" or "call"
    USER: Final = "user"  # user code, not site-packages, torch, the standard library or a builtin
    CALLS: Final = "calls"
    HOST_SELF: Final = "host_self_ns"
    HOST_TOTAL: Final = "host_total_ns"
    GPU_SELF: Final = "gpu_self_ns"
    GPU: Final = "gpu_ns"  # GPU time of the work launched under the frame, at any depth
    SYNCS: Final = "syncs"  # sync points (scalar reads, synchronize calls) made from the frame itself
    OPS: Final = "ops"  # outermost CPU ops called from the frame itself
    HOST_STEADY: Final = "host_steady_ns"  # host total inside the steady steps' windows
    STEP_SHARE: Final = "step_share"  # host_steady_ns over the steady windows' length; null without steps


LINES_SCHEMA: Final = pl.Schema({
    LineCol.FRAME: pl.Int64(), LineCol.FILE: pl.String(), LineCol.LINE: pl.Int64(), LineCol.FUNCTION: pl.String(),
    LineCol.LINE_KIND: pl.String(), LineCol.USER: pl.Boolean(), LineCol.CALLS: pl.Int64(),
    LineCol.HOST_SELF: pl.Int64(), LineCol.HOST_TOTAL: pl.Int64(), LineCol.GPU_SELF: pl.Int64(),
    LineCol.GPU: pl.Int64(), LineCol.SYNCS: pl.Int64(), LineCol.OPS: pl.Int64(), LineCol.HOST_STEADY: pl.Int64(),
    LineCol.STEP_SHARE: pl.Float64(),
})
#: The table as ``lines --json`` lists it: without the frame index (which only stacks refer to).
LINE_ROWS_SCHEMA: Final = pl.Schema({k: v for k, v in LINES_SCHEMA.items() if k != LineCol.FRAME})


class StackCol:
    """Columns of ``LinesResult.stacks``: each distinct stack of listed frames, root first, with
    the self time of its innermost frame (the folded format's weights)."""

    FRAMES: Final = "frames"  # LineCol.FRAME values, root first
    HOST: Final = "host_ns"
    GPU: Final = "gpu_ns"


STACKS_SCHEMA: Final = pl.Schema({StackCol.FRAMES: pl.List(pl.Int64()), StackCol.HOST: pl.Int64(),
                                  StackCol.GPU: pl.Int64()})

#: A stack lists at most this many frames, root first; a deeper frame's self time goes to the
#: stack of its ancestor at this depth. Every distinct stack is a list of its frames, so a
#: recursion N deep made N stacks of up to N frames: 10,000 nested frames (2 MB) took 2 GB.
#: Real stacks here are under 150 frames deep; flame-graph tools show no more anyway.
MAX_STACK_FRAMES: Final = 512

SORT_KEYS: Final = (LineCol.HOST_SELF, LineCol.HOST_TOTAL, LineCol.GPU, LineCol.GPU_SELF, LineCol.SYNCS,
                    LineCol.OPS, LineCol.CALLS)
#: Where the frames came from.
SOURCE_FRAMES: Final = "python_function"
SOURCE_CALL_STACK: Final = "call_stack"
SOURCE_NONE: Final = "none"


@dataclass(frozen=True)
class LinesOptions:
    include_library: bool = False  # --all: list library frames (torch, site-packages, stdlib) as rows too
    sort_by: str | None = None  # one of SORT_KEYS; None: gpu_self_ns when there is GPU time, else host_self_ns
    #: Where compiled kernels come from (--logs): their time goes to the source lines they fuse.
    provenance: KernelProvenance | None = None


@dataclass(frozen=True)
class LinesResult(Rows, rows="table", key="function"):
    """``table`` (LINES_SCHEMA) in ``sort_by`` order; ``stacks`` (STACKS_SCHEMA).

    Self time is a frame's time less the listed frames below it. Builtin calls (``.item()``,
    ``time.sleep``) and module scopes are never listed: their time is their caller's. Without
    ``include_library`` only user frames are listed, so the time of the library code a user line
    calls is that line's self time too (where the user can act). Totals count a recursive
    function once. ``note`` says why the table is empty.
    """

    table: pl.DataFrame
    stacks: pl.DataFrame
    source: str
    include_library: bool
    sort_by: str
    gpu_time_ns: int
    steady_window_ns: int | None
    note: str | None
    #: With ``provenance``: compiled kernel runs seen, and how many got source lines (None without).
    compiled_kernel_runs: int | None = None
    compiled_attributed: int | None = None


def lines(trace: Trace, options: LinesOptions = LinesOptions(), steps_result: StepsResult | None = None) -> LinesResult:
    """Per source frame: calls, host self/total, GPU self/total, syncs, ops and step share."""
    trace.require_whole()
    s = trace.slices
    gpu_time = int(s.filter(pl.col(Col.KIND).is_in([k.value for k in GPU_ACTIVITY_KINDS])).get_column(Col.DUR).sum())
    tree = HostTree.of(trace)
    span = steady_span(steps_result.table if steps_result is not None else steps(trace).table, start=Col.TS)
    compiled = None if options.provenance is None else compiled_lines(trace, tree, options.provenance)
    parts: tuple[pl.DataFrame, pl.DataFrame] | None
    if tree.is_python.any():
        parts = _from_frames(trace, tree, options.include_library, span, compiled)
        source = SOURCE_FRAMES
    else:
        parts = _from_call_stacks(trace, tree, options.include_library, span)
        source = SOURCE_CALL_STACK if parts is not None else SOURCE_NONE
    sort_by = options.sort_by or (LineCol.GPU_SELF if gpu_time else LineCol.HOST_SELF)
    if sort_by not in SORT_KEYS:
        raise ValueError(f"sort key must be one of {', '.join(SORT_KEYS)}")
    note = None
    if parts is None:
        table, stacks = pl.DataFrame(schema=LINES_SCHEMA), pl.DataFrame(schema=STACKS_SCHEMA)
        note = ("no Python frames in this trace: capture with torch.profiler.profile(with_stack=True) "
                "to see which line is slow")
    else:
        table, stacks = parts
        window = None if span is None else span[1] - span[0]
        table = table.with_columns(
            (pl.col(LineCol.HOST_STEADY) / window if window else pl.lit(None, pl.Float64)).alias(LineCol.STEP_SHARE)
        ).select(LINES_SCHEMA.names()).sort(
            [sort_by, LineCol.HOST_TOTAL, LineCol.FILE, LineCol.LINE, LineCol.FUNCTION],
            descending=[True, True, False, False, False])
        if table.height == 0:
            note = "no user-code frames in this trace; --all lists library frames too"
    return LinesResult(table=table, stacks=stacks, source=source, include_library=options.include_library,
                       sort_by=sort_by, gpu_time_ns=gpu_time,
                       steady_window_ns=None if span is None else span[1] - span[0], note=note,
                       compiled_kernel_runs=None if compiled is None else compiled.kernel_runs,
                       compiled_attributed=None if compiled is None else compiled.attributed)


def steady_ns(ts: I64, end: I64, span: tuple[int, int] | None) -> I64:
    if span is None:
        return np.zeros(ts.size, dtype=np.int64)
    inside: I64 = np.maximum(np.minimum(end, span[1]) - np.maximum(ts, span[0]), 0)
    return inside


def _frame_names(trace: Trace, ids: I64) -> tuple[pl.DataFrame, I64]:
    """The distinct frame names among these slices, parsed, and each slice's index among them."""
    names = trace.slices.get_column(Col.NAME).gather(ids).cast(pl.String)
    return _parse_names(names)


def _parse_names(names: pl.Series) -> tuple[pl.DataFrame, I64]:
    """Names that parse alike (a builtin bound to two objects) share one frame."""
    distinct = names.unique(maintain_order=True)
    index_of: dict[tuple[str, int, str, bool], int] = {}
    frame_of_name = [index_of.setdefault(parse_frame(name), len(index_of)) for name in distinct.to_list()]
    parsed = list(index_of)
    frames = pl.DataFrame({
        LineCol.FRAME: np.arange(len(parsed), dtype=np.int64),
        LineCol.FILE: [p[0] for p in parsed], LineCol.LINE: [p[1] for p in parsed],
        LineCol.FUNCTION: [p[2] for p in parsed], LineCol.LINE_KIND: [LineKind.CALL] * len(parsed),
        LineCol.USER: [p[3] for p in parsed],
    }, schema={k: LINES_SCHEMA[k] for k in (LineCol.FRAME, LineCol.FILE, LineCol.LINE, LineCol.FUNCTION,
                                            LineCol.LINE_KIND, LineCol.USER)})
    index = pl.DataFrame({"name": names}).join(
        pl.DataFrame({"name": distinct, LineCol.FRAME: pl.Series(frame_of_name, dtype=pl.Int64)}), on="name",
        how="left", maintain_order="left").get_column(LineCol.FRAME).to_numpy()
    return frames, index


def _from_frames(trace: Trace, tree: HostTree, include_library: bool, span: tuple[int, int] | None,
                 compiled: CompiledLines | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Rows and stacks from python_function frames: each listed frame owns the slices below it
    up to the next listed frame (builtin calls and ops included)."""
    py = np.flatnonzero(tree.is_python)
    frames, frame_of_py = _frame_names(trace, py)
    # A frame's name gives where its function starts, or for a frame already running when the
    # profiler started the line it ran then: never the line of a call (source_lines.LineKind).
    at_start = np.zeros(frames.height, dtype=bool)
    at_start[frame_of_py[running_at_start(trace, tree)[py]]] = True
    frames = frames.with_columns(pl.Series(LineCol.LINE_KIND, np.where(at_start, LineKind.AT_START, LineKind.DEF),
                                           dtype=pl.String))
    # A builtin call or module scope is what the line calling it does: never a row of its own.
    source = (frames.get_column(LineCol.LINE) > 0).to_numpy()
    listed_py = (source if include_library else frames.get_column(LineCol.USER).to_numpy())[frame_of_py]
    n = tree.parent.size
    listed = np.zeros(n, dtype=bool)
    listed[py[listed_py]] = True
    frame_of = np.full(n, -1, dtype=np.int64)
    frame_of[py] = frame_of_py
    owner = tree.nearest(listed)
    up = np.where(tree.parent >= 0, owner[np.maximum(tree.parent, 0)], -1)  # nearest listed frame above
    rows = np.flatnonzero(listed)
    end = tree.ts + tree.dur

    def owned(weights: npt.NDArray[np.int64] | B, mask: B | None = None) -> I64:
        """Sum of ``weights`` over the slices each listed frame owns (mask: only those slices)."""
        at = owner if mask is None else np.where(mask, owner, -1)
        keep = at >= 0
        return np.bincount(at[keep], weights=np.asarray(weights)[keep], minlength=n).astype(np.int64)

    inner_frames = np.bincount(up[rows][up[rows] >= 0], weights=tree.dur[rows][up[rows] >= 0], minlength=n)
    gpu_self = owned(tree.gpu_self)
    per_slice = pl.DataFrame({
        "id": rows, LineCol.FRAME: frame_of[rows], "pid_tid": _thread_keys(trace, rows),
        Col.TS: tree.ts[rows], "end": end[rows],
        LineCol.HOST_SELF: np.maximum(tree.dur[rows] - inner_frames[rows].astype(np.int64), 0),
        LineCol.HOST_TOTAL: tree.dur[rows], LineCol.GPU_SELF: gpu_self[rows],
        LineCol.GPU: tree.inclusive(tree.gpu_self)[rows], LineCol.SYNCS: owned(tree.is_sync)[rows],
        LineCol.OPS: owned(tree.outermost_op)[rows], LineCol.HOST_STEADY: steady_ns(tree.ts[rows], end[rows], span),
    })
    # A recursive call inside an open call of the same frame is already in that call's totals.
    per_slice = per_slice.sort([LineCol.FRAME, "pid_tid", Col.TS]).with_columns(
        (pl.col(Col.TS) < pl.col("end").cum_max().shift(1).over(LineCol.FRAME, "pid_tid")).fill_null(False)
        .alias("nested"))
    outer = ~pl.col("nested")
    table = per_slice.group_by(LineCol.FRAME).agg(
        pl.len().cast(pl.Int64).alias(LineCol.CALLS),
        pl.col(LineCol.HOST_SELF, LineCol.GPU_SELF, LineCol.SYNCS, LineCol.OPS).sum(),
        *(pl.col(c).filter(outer).sum() for c in (LineCol.HOST_TOTAL, LineCol.GPU, LineCol.HOST_STEADY)),
    )
    stacks = _frame_stacks(tree, rows, up, frame_of, per_slice)
    table = frames.join(table, on=LineCol.FRAME, how="inner")
    if compiled is not None and compiled.runs.height:
        owner_frame = np.where(owner >= 0, frame_of[np.maximum(owner, 0)], -1)
        from tracewhy.analyses.lines_compiled import with_compiled  # (it reads this module's columns)

        table = with_compiled(table, compiled.runs, owner_frame, include_library, span, tree)
    return table, stacks


def _thread_keys(trace: Trace, rows: I64) -> I64:
    s = trace.slices
    pid = s.get_column(Col.PID).gather(rows).fill_null(-1).to_numpy()
    tid = s.get_column(Col.TID).gather(rows).fill_null(-1).to_numpy()
    keys: I64 = (pid.astype(np.int64) << 32) ^ tid.astype(np.int64)
    return keys


def _frame_stacks(tree: HostTree, rows: I64, up: I64, frame_of: I64, per_slice: pl.DataFrame) -> pl.DataFrame:
    """Each listed frame's stack of listed frames (root first) and its self times, summed per
    stack. Stacks are numbered level by level, a stack being (the stack above, this frame)."""
    n_frames = int(frame_of.max()) + 1
    stack_of = np.full(up.size, -1, dtype=np.int64)
    known_keys = np.zeros(0, dtype=np.int64)  # sorted (stack above + 1) * n_frames + frame
    known_ids = np.zeros(0, dtype=np.int64)
    parent_stack: list[I64] = []
    leaf_frame: list[I64] = []
    by_depth = rows[np.argsort(tree.depth[rows], kind="stable")]
    for level in np.split(by_depth, np.flatnonzero(np.diff(tree.depth[by_depth])) + 1) if rows.size else []:
        above = np.where(up[level] >= 0, stack_of[np.maximum(up[level], 0)], -1)
        keys = (above + 1) * n_frames + frame_of[level]
        at = np.searchsorted(known_keys, keys)
        found = at < known_keys.size
        found[found] = known_keys[at[found]] == keys[found]
        fresh = np.unique(keys[~found])
        fresh_ids = known_ids.size + np.arange(fresh.size, dtype=np.int64)
        parent_stack.append(fresh // n_frames - 1)
        leaf_frame.append(fresh % n_frames)
        order = np.argsort(np.concatenate([known_keys, fresh]), kind="stable")
        known_keys = np.concatenate([known_keys, fresh])[order]
        known_ids = np.concatenate([known_ids, fresh_ids])[order]
        stack_of[level] = known_ids[np.searchsorted(known_keys, keys)]
    parents = np.concatenate(parent_stack) if parent_stack else np.zeros(0, dtype=np.int64)
    leaves = np.concatenate(leaf_frame) if leaf_frame else np.zeros(0, dtype=np.int64)
    paths: list[list[int]] = []
    kept = np.zeros(parents.size, dtype=np.int64)  # each stack's row in paths (its cut one if too deep)
    for i, (parent, leaf) in enumerate(zip(parents.tolist(), leaves.tolist(), strict=True)):  # parents first
        prefix = paths[kept[parent]] if parent >= 0 else []
        if len(prefix) >= MAX_STACK_FRAMES:
            kept[i] = kept[parent]
            continue
        kept[i] = len(paths)
        paths.append([*prefix, leaf])
    ids = kept[stack_of[per_slice.get_column("id").to_numpy()]]
    host = np.bincount(ids, weights=per_slice.get_column(LineCol.HOST_SELF).to_numpy(), minlength=len(paths))
    gpu = np.bincount(ids, weights=per_slice.get_column(LineCol.GPU_SELF).to_numpy(), minlength=len(paths))
    return _stacks_frame(paths, pl.Series(host.astype(np.int64)), pl.Series(gpu.astype(np.int64)))


def _stacks_frame(paths: list[list[int]], host: pl.Series, gpu: pl.Series) -> pl.DataFrame:
    """Weights summed per distinct stack, in stack order."""
    return (pl.DataFrame({StackCol.FRAMES: pl.Series(paths, dtype=pl.List(pl.Int64)), StackCol.HOST: host,
                          StackCol.GPU: gpu}, schema=STACKS_SCHEMA)
            .group_by(StackCol.FRAMES).agg(pl.col(StackCol.HOST, StackCol.GPU).sum())
            .sort(StackCol.FRAMES).select(STACKS_SCHEMA.names()))


def _from_call_stacks(trace: Trace, tree: HostTree, include_library: bool,
                      span: tuple[int, int] | None) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """Rows and stacks from legacy ``Call stack`` args. Each slice carrying one owns its time
    less that of the slices with a stack inside it: that time is its innermost listed entry's
    self time and every listed entry's total. A call of an entry is a slice whose stack holds
    it while the stack of the slice it is in does not."""
    stacked = call_stacks(trace)
    if stacked.height == 0:
        return None
    n = tree.parent.size
    has = np.zeros(n, dtype=bool)
    ids = stacked.get_column(OpAttrCol.ID).to_numpy()
    has[ids] = True
    owner = tree.nearest(has)
    above = tree.nearest(has, strict=True)
    inner = np.bincount(above[ids][above[ids] >= 0], weights=tree.dur[ids][above[ids] >= 0], minlength=n)
    end = tree.ts + tree.dur
    steady = steady_ns(tree.ts, end, span)
    inner_steady = np.bincount(above[ids][above[ids] >= 0], weights=steady[ids][above[ids] >= 0], minlength=n)
    keep = owner >= 0
    gpu = np.bincount(owner[keep], weights=tree.gpu_self[keep], minlength=n).astype(np.int64)
    syncs = np.bincount(owner[keep & tree.is_sync], minlength=n)
    per_slice = pl.DataFrame({
        OpAttrCol.ID: ids, "above": above[ids], "own": np.maximum(tree.dur[ids] - inner[ids].astype(np.int64), 0),
        "gpu": gpu[ids], "syncs": syncs[ids].astype(np.int64), "op": tree.outermost_op[ids].astype(np.int64),
        "in_steady": np.maximum(steady[ids] - inner_steady[ids].astype(np.int64), 0),
    })
    entries = stacked.select(OpAttrCol.ID,
                             pl.col(OpAttrCol.CALL_STACK).str.split(";").alias("entry")).explode("entry") \
        .with_columns(pl.int_range(pl.len()).over(OpAttrCol.ID).alias("pos"))
    frames, frame_of_entry = _parse_names(entries.get_column("entry"))
    entries = entries.with_columns(pl.Series(LineCol.FRAME, frame_of_entry))
    if not include_library:
        entries = entries.filter(pl.col(LineCol.FRAME).is_in(
            frames.filter(pl.col(LineCol.USER)).get_column(LineCol.FRAME).implode()))
    leaf = entries.sort(OpAttrCol.ID, "pos").group_by(OpAttrCol.ID, maintain_order=True).agg(
        pl.col(LineCol.FRAME).first(), pl.col(LineCol.FRAME).reverse().alias("path")).join(per_slice, on=OpAttrCol.ID)
    members = entries.unique([OpAttrCol.ID, LineCol.FRAME]).select(OpAttrCol.ID, LineCol.FRAME).join(per_slice,
                                                                                                     on=OpAttrCol.ID)
    entered = members.join(members.select(pl.col(OpAttrCol.ID).alias("above"), LineCol.FRAME),
                           on=["above", LineCol.FRAME], how="anti")
    selfs = leaf.group_by(LineCol.FRAME).agg(
        pl.col("own").sum().alias(LineCol.HOST_SELF), pl.col("gpu").sum().alias(LineCol.GPU_SELF),
        pl.col("syncs").sum().alias(LineCol.SYNCS), pl.col("op").sum().alias(LineCol.OPS))
    totals = members.group_by(LineCol.FRAME).agg(
        pl.col("own").sum().alias(LineCol.HOST_TOTAL), pl.col("gpu").sum().alias(LineCol.GPU),
        pl.col("in_steady").sum().alias(LineCol.HOST_STEADY))
    calls = entered.group_by(LineCol.FRAME).agg(pl.len().cast(pl.Int64).alias(LineCol.CALLS))
    table = frames.join(totals, on=LineCol.FRAME).join(selfs, on=LineCol.FRAME, how="left") \
        .join(calls, on=LineCol.FRAME, how="left").with_columns(
            pl.col(LineCol.HOST_SELF, LineCol.GPU_SELF, LineCol.SYNCS, LineCol.OPS, LineCol.CALLS)
            .fill_null(0).cast(pl.Int64))
    stacks = _stacks_frame(leaf.get_column("path").to_list(), leaf.get_column("own"), leaf.get_column("gpu"))
    return table, stacks


