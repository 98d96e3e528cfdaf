"""The step account: each analysed step's time split along its critical path into named parts
that add up to the step, averaged over the steady steps, with the evidence behind each part.

The windows are the steps, else iterations found from the loop's structure, else the whole
trace (``iterations``). Each window's path is walked back through the dependency graph
(``critical_path_walk``); every edge on it goes to exactly one part (``account_parts``), and the
part of the window the path does not cover (it starts after the window's start: an instant
nothing recorded released) is ``unexplained``, with what was open there. So the parts of a step
add up to its window exactly. ``step_model`` keeps the graph and the walks, for the what-if
predictions (``what_if``) to edit and replay.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.account_names import PartKind, PartName
from tracewhy.analyses.account_one_time import OneTimeCompileStep, one_time_compile_steps, one_time_note
from tracewhy.analyses.account_parts import PartRules
from tracewhy.analyses.collectives import call_messages
from tracewhy.analyses.critical_path_graph import Graph, build_graph
from tracewhy.analyses.critical_path_replay import Replay
from tracewhy.analyses.critical_path_walk import EdgeLabels, nodes_by_pid, walk
from tracewhy.analyses.edge_parts import EdgeParts
from tracewhy.analyses.host_activity import HostIndex
from tracewhy.analyses.host_tree import HostTree
from tracewhy.analyses.id_arrays import Ids, narrow
from tracewhy.analyses.iterations import AccountWindows, account_windows
from tracewhy.analyses.kernel_lines import compiled_frame_lines
from tracewhy.analyses.step_units import spread_picks
from tracewhy.analyses.steps import StepsOptions, StepsResult, WindowCol, steps
from tracewhy.model.kernel_provenance import KernelProvenance
from tracewhy.model.schema import HOST_KINDS, Col
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows
from tracewhy.units import fmt_ns

I64 = npt.NDArray[np.int64]


class AccountCol:
    """Column names of the account's tables."""

    STEP: Final = "step"  # the window's index among all found (warm-up included)
    NUMBER: Final = WindowCol.NUMBER
    STEADY: Final = WindowCol.STEADY
    WINDOW_START: Final = WindowCol.WINDOW_START
    WINDOW_END: Final = WindowCol.WINDOW_END
    WINDOW: Final = WindowCol.WINDOW
    PID: Final = WindowCol.PID  # the process whose loop the window is
    COVERED: Final = "covered_ns"  # the time the path covers (the window less ``unexplained``)
    PART: Final = "part"
    KIND: Final = "kind"  # a PartKind value
    NS_PER_STEP: Final = "ns_per_step"  # mean over the analysed steps
    SHARE: Final = "share"  # of the mean step
    ESSENTIAL: Final = "essential"
    NS: Final = "ns"
    ITEM: Final = "item"  # a slice, line, op or call behind a part
    COUNT_PER_STEP: Final = "count_per_step"  # distinct slices per step
    BYTES_PER_STEP: Final = "bytes_per_step"  # copies: bytes moved per step (null for other parts)
    GB_PER_S: Final = "gb_per_s"  # copies: achieved over their durations; communication: bus bandwidth


ACCOUNT_WINDOWS_SCHEMA: Final = pl.Schema({
    AccountCol.STEP: pl.Int64(), AccountCol.NUMBER: pl.Int64(), AccountCol.STEADY: pl.Boolean(),
    AccountCol.WINDOW_START: pl.Int64(), AccountCol.WINDOW_END: pl.Int64(), AccountCol.WINDOW: pl.Int64(),
    AccountCol.PID: pl.Int64(), AccountCol.COVERED: pl.Int64(),
})
ACCOUNT_PARTS_SCHEMA: Final = pl.Schema({
    AccountCol.PART: pl.String(), AccountCol.KIND: pl.String(), AccountCol.NS_PER_STEP: pl.Int64(),
    AccountCol.SHARE: pl.Float64(), AccountCol.ESSENTIAL: pl.Boolean(),
})
ACCOUNT_PER_STEP_SCHEMA: Final = pl.Schema({
    AccountCol.STEP: pl.Int64(), AccountCol.PART: pl.String(), AccountCol.NS: pl.Int64(),
})
ACCOUNT_EVIDENCE_SCHEMA: Final = pl.Schema({
    AccountCol.PART: pl.String(), AccountCol.ITEM: pl.String(), AccountCol.NS_PER_STEP: pl.Int64(),
    AccountCol.COUNT_PER_STEP: pl.Float64(), AccountCol.BYTES_PER_STEP: pl.Int64(), AccountCol.GB_PER_S: pl.Float64(),
})


@dataclass(frozen=True)
class AccountOptions:
    marker: str | None = None  # step marker (None: what ``steps`` picks)
    #: At most this many steady steps are analysed, spread evenly over the run: each costs a walk
    #: (and, for predictions, a replay per edit).
    max_steps: int = 16
    evidence_items: int = 5  # per part, the items shown
    #: Where compiled kernels come from (--logs): a compiled kernel's host time is a part named
    #: by the source line with the largest share of it.
    provenance: KernelProvenance | None = None


class WindowPath(msgspec.Struct, frozen=True):
    """One analysed window and its critical path: ``edges`` in time order, ``start`` the instant
    the path begins (after ``window_start`` when the path does not cover the window), ``sink``
    its last node (-1: no node of the process in the window)."""

    step: int
    window_start: int
    window_end: int
    pid: int
    edges: Ids  # (int32 where they fit: ``id_arrays.narrow``)
    start: int
    sink: int


@dataclass(frozen=True)
class StepModel:
    """What the account and the predictions share: the graph, its labels and part rules, and the
    analysed windows with their paths."""

    trace: Trace
    graph: Graph
    labels: EdgeLabels
    rules: PartRules
    replay: Replay
    found: AccountWindows
    paths: tuple[WindowPath, ...]
    #: Analysed steps left out of the account and the predictions: one-time compiles.
    one_time: tuple[OneTimeCompileStep, ...] = ()

    @cached_property
    def edge_parts(self) -> EdgeParts:
        """Each edge's part, decided once for the account and the predictions."""
        return EdgeParts(self.rules, self.graph)


def step_model(trace: Trace, options: AccountOptions = AccountOptions(), steps_result: StepsResult | None = None,
               graph: Graph | None = None, host: HostIndex | None = None, tree: HostTree | None = None,
               marked: pl.DataFrame | None = None) -> StepModel:
    """``steps_result``, ``graph`` (``build_graph``), ``host`` (``build_host_index``), ``tree``
    (``HostTree.of``) and ``marked`` (``marked_slices``): what the caller has computed already (a
    diagnosis has the steps, the host index and tree and the compile markers, a report the graph)."""
    trace.require_whole()
    graph = graph if graph is not None else build_graph(trace)
    steps_result = steps_result or steps(trace, StepsOptions(marker=options.marker))
    found = account_windows(trace, steps_result, graph)
    labels = EdgeLabels(trace, graph)
    markers = found.windows.get_column(WindowCol.STEP_ID).drop_nulls().to_numpy()
    rules = PartRules(trace, graph, labels, markers, host,
                      None if options.provenance is None else compiled_frame_lines(trace, options.provenance),
                      tree, marked)
    by_pid = nodes_by_pid(graph)
    paths = []
    for i, ws, we, pid in _analysed(found.windows, options.max_steps).iter_rows():
        path, start, sink = walk(graph, by_pid.get(pid), ws, we)
        paths.append(WindowPath(i, ws, we, pid, narrow(np.asarray(path[::-1], dtype=np.int64)), start, sink))
    names = found.windows.get_column(WindowCol.STEP).cast(pl.String).to_list()
    one_time = one_time_compile_steps(rules, graph, [(p.step, p.window_start, p.window_end, p.edges) for p in paths],
                                      names)
    left_out = {s.step for s in one_time}
    kept = tuple(p for p in paths if p.step not in left_out)
    return StepModel(trace, graph, labels, rules, Replay(graph), found, kept, tuple(one_time))


def _analysed(windows: pl.DataFrame, max_steps: int) -> pl.DataFrame:
    """(index, start, end, pid) of the windows to analyse: the steady ones (all, if none is), at
    most ``max_steps`` of them spread evenly over the run."""
    w = windows.with_row_index("_i").with_columns(pl.col("_i").cast(pl.Int64))
    steady = w.filter(pl.col(WindowCol.STEADY))
    chosen = steady if steady.height else w
    if chosen.height > max_steps:
        chosen = chosen[spread_picks(chosen.height, max_steps)]
    return chosen.select("_i", WindowCol.WINDOW_START, WindowCol.WINDOW_END, WindowCol.PID)


@dataclass(frozen=True)
class UnrecordedGpu:
    """The first launch on an analysed path that waited on a device recording no GPU work
    (``account_unrecorded``): the launch call's start, how long it waited, and the device's first
    recorded work."""

    device: int
    launch_ns: int
    waited_ns: int
    first_gpu_ns: int
    window_end_ns: int
    call: str


@dataclass(frozen=True)
class AccountResult(Rows, rows="parts", key="part"):
    """``windows`` (ACCOUNT_WINDOWS_SCHEMA): the analysed steps. ``parts`` (ACCOUNT_PARTS_SCHEMA):
    one row per part, by time per step, largest first; they add up to ``mean_step_ns``.
    ``per_step`` (ACCOUNT_PER_STEP_SCHEMA): each analysed step's parts (for a bar per step).
    ``evidence`` (ACCOUNT_EVIDENCE_SCHEMA): per part its top items. ``steps_found`` windows were
    found, ``steps_steady`` of them steady; ``steps_analysed`` were walked."""

    source: str  # an iterations.WindowSource value
    marker: str
    windows: pl.DataFrame
    parts: pl.DataFrame
    per_step: pl.DataFrame
    evidence: pl.DataFrame
    mean_step_ns: int
    steps_found: int
    steps_steady: int
    steps_analysed: int
    note: str | None
    #: A launch delay the trace cannot explain (None: no path has one): GPU work queued before
    #: the capture, or a clock offset; the GPU-side figures run from ``first_gpu_ns``.
    unrecorded: UnrecordedGpu | None = None
    #: Steps left out as one-time compiles (``account_one_time``).
    one_time: tuple[OneTimeCompileStep, ...] = ()

    @property
    def named_share(self) -> float:
        """The share of the mean step the account names (everything but ``unexplained``)."""
        unexplained = self.parts.filter(pl.col(AccountCol.PART) == PartName.UNEXPLAINED)
        return 1.0 - float(unexplained.get_column(AccountCol.SHARE).sum()) if self.mean_step_ns else 0.0

    def largest_avoidable(self) -> dict[str, object] | None:
        """The part (a ``parts`` row) the diagnosis leads with: the largest one not essential."""
        rows = self.avoidable_parts()
        return rows.row(0, named=True) if rows.height else None

    def avoidable_parts(self) -> pl.DataFrame:
        """The ``parts`` rows a fix could shorten (``account_names.avoidable``), largest first."""
        return self.parts.filter(~pl.col(AccountCol.ESSENTIAL) & (pl.col(AccountCol.KIND) != PartKind.UNEXPLAINED)
                                 & (pl.col(AccountCol.PART) != PartName.UNRECORDED_GPU))


def step_account(trace: Trace, options: AccountOptions = AccountOptions(), model: StepModel | None = None,
                 steps_result: StepsResult | None = None) -> AccountResult:
    m = model or step_model(trace, options, steps_result)
    rules, g = m.rules, m.graph
    frames: list[pl.DataFrame] = []
    window_rows = []
    unexplained = rules.part(PartName.UNEXPLAINED, PartKind.UNEXPLAINED)
    steady = m.found.windows.get_column(WindowCol.STEADY).to_list()
    numbers = m.found.windows.get_column(WindowCol.NUMBER).to_list()
    found_unrecorded: UnrecordedGpu | None = None
    for p in m.paths:
        e = p.edges
        part, item, owner = rules.of_edges(g.kind[e].astype(np.int64), g.attr[e], rules.category[e], g.src[e], g.dst[e])
        m.edge_parts.remember(e, part)
        found_unrecorded = found_unrecorded or _unrecorded(m, p, part)
        start = np.maximum(g.node_ts[g.src[e]], p.window_start)
        dur = g.node_ts[g.dst[e]] - start
        covered = int(dur.sum())
        uncovered = _uncovered(m, p)
        frames.append(pl.DataFrame({
            AccountCol.STEP: np.full(e.size + len(uncovered), p.step, dtype=np.int64),
            "_part": np.r_[part, np.full(len(uncovered), unexplained)],
            "_item": np.r_[item, [rules.item(text) for text, _ in uncovered]].astype(np.int64),
            "_slice": np.r_[owner, np.full(len(uncovered), -1)],
            AccountCol.NS: np.r_[dur, [ns for _, ns in uncovered]].astype(np.int64),
        }))
        window_rows.append((p.step, numbers[p.step], steady[p.step], p.window_start, p.window_end,
                            p.window_end - p.window_start, p.pid, covered))
    windows = pl.DataFrame(window_rows, schema=ACCOUNT_WINDOWS_SCHEMA, orient="row")
    result = _tables(m, windows, pl.concat(frames) if frames else None, options.evidence_items)
    if found_unrecorded is None:
        return result
    return replace(result, unrecorded=found_unrecorded,
                   note="; ".join(n for n in (result.note, _unrecorded_note(found_unrecorded)) if n))


def _unrecorded(m: StepModel, p: WindowPath, part: I64) -> UnrecordedGpu | None:
    """The path's first launch edge in the unrecorded-GPU part (None: none)."""
    rules, g = m.rules, m.graph
    index = rules.index_of(PartName.UNRECORDED_GPU)
    at = np.flatnonzero(part == index) if index is not None else np.zeros(0, np.int64)
    if at.size == 0:
        return None
    e = int(p.edges[int(at[0])])
    activity = int(g.node_slice[g.dst[e]])
    device = int(rules.first_gpu.device[activity])
    lo, hi = max(int(g.node_ts[g.src[e]]), p.window_start), int(g.node_ts[g.dst[e]])
    return UnrecordedGpu(device=device, launch_ns=lo, waited_ns=hi - lo,
                         first_gpu_ns=rules.first_gpu.first_ns(device) or hi, window_end_ns=p.window_end,
                         call=rules.ctx.name(int(g.attr[e])))


def _unrecorded_note(u: UnrecordedGpu) -> str:
    return (f"the window begins with GPU work the trace did not record: {u.call or 'a launch'} was issued "
            f"{fmt_ns(u.first_gpu_ns - u.launch_ns)} before GPU {u.device}'s first recorded work (work queued "
            "before the capture, or a host-GPU clock offset); GPU-side figures run from its first recorded work")


def _uncovered(m: StepModel, p: WindowPath) -> list[tuple[str, int]]:
    """The stretches of the window the path does not reach (before its start; after its end, when
    it stops short of the window's), each with what was open there longest on the window's
    process (a top-level slice other than the step marker), else "nothing recorded"."""
    g = m.graph
    if p.sink < 0:
        stretches = [(p.window_start, p.window_end)]
    else:
        stretches = [(p.window_start, max(p.start, p.window_start)), (int(g.node_ts[p.sink]), p.window_end)]
    markers = m.found.windows.get_column(WindowCol.STEP_ID).drop_nulls().to_list()
    out: list[tuple[str, int]] = []
    for lo, hi in stretches:
        if hi <= lo:
            continue
        open_there = m.trace.slices_where(
            pl.col(Col.KIND).is_in([k.value for k in HOST_KINDS]) & (pl.col(Col.PID) == p.pid)
            & (pl.col(Col.TS) < hi) & (pl.col(Col.TS) + pl.col(Col.DUR) > lo) & ~pl.col(Col.ID).is_in(markers)
            & (pl.col(Col.PARENT).is_null() | pl.col(Col.PARENT).is_in(markers)),
            pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR)
        ts = open_there.get_column(Col.TS).to_numpy()
        overlap = np.minimum(ts + open_there.get_column(Col.DUR).to_numpy(), hi) - np.maximum(ts, lo)
        names = open_there.get_column(Col.NAME).to_list()
        longest = f"open: {names[int(np.argmax(overlap))]}" if names else "nothing recorded"
        out.append((longest, hi - lo))
    return out


def _tables(m: StepModel, windows: pl.DataFrame, rows: pl.DataFrame | None, top: int) -> AccountResult:
    found = m.found
    n = windows.height

    def result(parts: pl.DataFrame, per_step: pl.DataFrame, evidence: pl.DataFrame, mean_step_ns: int) -> AccountResult:
        return AccountResult(
            source=found.source, marker=found.marker, windows=windows, parts=parts, per_step=per_step,
            evidence=evidence, mean_step_ns=mean_step_ns, steps_found=found.windows.height,
            steps_steady=int(found.windows.get_column(WindowCol.STEADY).sum()), steps_analysed=n,
            note=_note(found.note, int(found.windows.get_column(WindowCol.STEADY).sum()), n + len(m.one_time),
                       one_time_note(list(m.one_time))), one_time=m.one_time)

    if rows is None or n == 0:
        return result(pl.DataFrame(schema=ACCOUNT_PARTS_SCHEMA), pl.DataFrame(schema=ACCOUNT_PER_STEP_SCHEMA),
                      pl.DataFrame(schema=ACCOUNT_EVIDENCE_SCHEMA), 0)
    rules = m.rules
    # Grouped by the parts' codes, then named (a name per edge: 0.3 GB on a large export's path).
    names = pl.Series([p.name for p in rules.parts], dtype=pl.String)
    per_step = _named(rows.group_by(AccountCol.STEP, "_part").agg(pl.col(AccountCol.NS).sum()), names).sort(
        AccountCol.STEP, AccountCol.NS, AccountCol.PART, descending=[False, True, False])
    mean_step = round(windows.get_column(AccountCol.WINDOW).sum() / n)
    parts = _named(rows.group_by("_part").agg(pl.col(AccountCol.NS).sum()), names).with_columns(
        (pl.col(AccountCol.NS) / n).round().cast(pl.Int64).alias(AccountCol.NS_PER_STEP))
    kinds = {i: (p.kind, p.essential) for i, p in enumerate(rules.parts)}
    parts = parts.with_columns(
        pl.col("_part").replace_strict({k: v[0] for k, v in kinds.items()}, return_dtype=pl.String).alias(
            AccountCol.KIND),
        (pl.col(AccountCol.NS_PER_STEP) / max(mean_step, 1)).alias(AccountCol.SHARE),
        pl.col("_part").replace_strict({k: v[1] for k, v in kinds.items()}, return_dtype=pl.Boolean).alias(
            AccountCol.ESSENTIAL),
    ).filter(pl.col(AccountCol.NS) > 0).sort(AccountCol.NS, AccountCol.PART, descending=[True, False])
    return result(parts.select(*ACCOUNT_PARTS_SCHEMA), per_step.select(*ACCOUNT_PER_STEP_SCHEMA),
                  _evidence(m, rows, names, n, top), mean_step)


def _evidence(m: StepModel, rows: pl.DataFrame, names: pl.Series, n: int, top: int) -> pl.DataFrame:
    """Per part its ``top`` items by time; copies with the bytes they moved and their bandwidth,
    communication kernels with their calls' messages and bus bandwidth (``collective_bandwidth``);
    ``names``: the parts' by code."""
    rules = m.rules
    items = pl.Series([t for t in rules.items], dtype=pl.String)
    s = m.trace.slices
    # By codes, then named (an item's text per edge was 0.7 GB on a large export's path).
    per = _named(rows.group_by("_part", "_item").agg(
        pl.col(AccountCol.NS).sum(), pl.col("_slice").filter(pl.col("_slice") >= 0).unique().alias("_slices")), names)
    per = per.with_columns(items.gather(per.get_column("_item")).alias(AccountCol.ITEM))
    copy_parts = {p.name for p in rules.parts if p.kind == PartKind.COPIES}
    comm_parts = {p.name for p in rules.parts if p.kind == PartKind.COMMUNICATION}
    call_of, sized = call_messages(m.trace) if comm_parts & set(per.get_column(AccountCol.PART)) else ({}, None)
    bytes_col, bandwidth, counts = [], [], []
    for part, slices in per.select(AccountCol.PART, "_slices").iter_rows():
        counts.append(len(slices) / n)
        if part in copy_parts and slices:
            moved = rules.copies.bytes_of(np.asarray(slices, dtype=np.int64))
            busy = int(s.get_column(Col.DUR).gather(slices).sum())
            bytes_col.append(round(moved / n) if moved else None)
            bandwidth.append(moved / busy if moved and busy else None)  # bytes per ns is GB/s
        elif part in comm_parts and sized is not None and (calls := {call_of[i] for i in slices if i in call_of}):
            # Communication kernels: their calls' messages, and bus bandwidth (NCCL's formula).
            moved, bus, busy = sized.filter(pl.col("call").is_in(sorted(calls))).select(
                pl.col("msg_bytes").sum(), pl.col("bus_bytes").sum(), pl.col(Col.DUR).sum()).row(0)
            bytes_col.append(round(moved / n) if moved else None)
            bandwidth.append(bus / busy if bus and busy else None)
        else:
            bytes_col.append(None)
            bandwidth.append(None)
    return per.with_columns(
        (pl.col(AccountCol.NS) / n).round().cast(pl.Int64).alias(AccountCol.NS_PER_STEP),
        pl.Series(AccountCol.COUNT_PER_STEP, counts, dtype=pl.Float64),
        pl.Series(AccountCol.BYTES_PER_STEP, bytes_col, dtype=pl.Int64),
        pl.Series(AccountCol.GB_PER_S, bandwidth, dtype=pl.Float64),
    ).filter(pl.col(AccountCol.NS) > 0).sort(AccountCol.PART, AccountCol.NS, AccountCol.ITEM,
                                             descending=[False, True, False]).group_by(
        AccountCol.PART, maintain_order=True).head(top).select(*ACCOUNT_EVIDENCE_SCHEMA)


def _named(groups: pl.DataFrame, names: pl.Series) -> pl.DataFrame:
    return groups.with_columns(names.gather(groups.get_column("_part")).alias(AccountCol.PART))


def _note(found: str | None, steady: int, analysed: int, one_time: str | None) -> str | None:
    bounded = (f"{analysed} of the {steady} steady steps analysed, spread evenly over the run"
               if analysed < steady else None)
    parts = [p for p in (found, bounded, one_time) if p]
    return "; ".join(parts) if parts else None
