"""What encloses each host slice, for the step account to name the host time spent in it: the
context that decides its part (compilation, data loading, communication, optimizer, backward,
forward, or none of them), its outermost op, its outermost named block, and the scalar reads
and block boundaries on its thread. Structure decides (nesting, threads, autograd sequence
numbers); names only find the slices it reasons about (``api_names``, ``compile_markers``).
"""

from __future__ import annotations

import bisect
import posixpath
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.autograd_threads import backward_threads
from tracewhy.analyses.compile_slices import ROLE, Role, marked_slices
from tracewhy.analyses.families import collective_op, collective_range
from tracewhy.analyses.host_tree import HostTree, chain_top
from tracewhy.analyses.id_arrays import Ids, narrow
from tracewhy.analyses.name_codes import NameCodes, decide, distinct_names
from tracewhy.analyses.source_lines import parse_frame, running_at_start
from tracewhy.model.schema import HOST_KINDS, KIND_CODE, LAUNCH_KINDS, Col, FlowCol, Kind, OpAttrCol
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


class HostPurpose(IntEnum):
    """What a host slice's time is spent for, by what encloses it; the first that holds wins."""

    COMPILATION = 0  # a torch.compile compile phase (Dynamo, AOT autograd, inductor) at or above
    DATA_LOADING = 1  # a DataLoader fetch at or above
    COMMUNICATION = 2  # a collective op or range at or above (not the runtime calls it makes)
    OPTIMIZER = 3  # Optimizer.step / zero_grad, or an optimizer block
    BACKWARD = 4  # an autograd engine node above, a backward block, or a backward thread
    FORWARD = 5  # a forward block, or an op autograd records (it has a sequence number)
    NONE = 6


PHASE_CONTEXTS: Final = (HostPurpose.OPTIMIZER, HostPurpose.BACKWARD, HostPurpose.FORWARD)


class Collectives(dict[int, str | None]):
    """The collective's name of each slice id in a COMMUNICATION context, None for every other
    slice, indexed like a list of them all (a negative id counts from the end). A list held a
    pointer per slice: 64 MB on the 8 M slices of a large export, for 0.4 M names."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def __missing__(self, slice_id: int) -> str | None:
        return self.get(self.n + slice_id) if -self.n <= slice_id < 0 else None


@dataclass(frozen=True)
class HostContext:
    """Arrays indexed by slice id (-1: none); the slice ids in them are int32 where they fit
    (``id_arrays.narrow``: the five take 0.15 GB less on an 8 M-slice export)."""

    context: npt.NDArray[np.int8]  # a HostPurpose value (host slices; NONE elsewhere)
    outer_op: Ids  # outermost op at or above (a CPU op, or an emit_nvtx op range)
    outer_block: Ids  # outermost annotation at or above that is no step marker, phase, fetch or op
    user_frame: Ids  # innermost user-code Python frame at or above
    running_at_start: B  # Python frames already open when the profiler started (their line is its start)
    recorded: Ids  # the slice itself, or for a Python frame the nearest slice above it that is none
    #: Forward ops run again by the autograd engine (activation checkpointing's recompute): the
    #: nearest op at or above that autograd records (a sequence number) under an engine node or
    #: on a backward thread (a user's "backward" block may hold the loss: not the engine's).
    recompute: Ids
    in_backward: B  # a backward mark at or above, or on a backward thread (whatever decided the context)
    collective: Collectives  # per slice id with COMMUNICATION context: the collective's name
    has_frames: bool
    has_phases: bool  # some slice of the trace opens a phase
    names: pl.Series  # slice names, categorical as the model holds them, looked up one at a time (``name``)
    reads: dict[tuple[int, int], tuple[list[int], list[str]]]  # per thread: scalar-read ops' starts, names
    barriers: dict[tuple[int, int], list[int]]  # per thread: starts of the blocks that end a run of ops
    pid: Ids  # (int32 where they fit, as the ids above: 61 MB each less on an 8 M-slice export)
    tid: Ids

    def name(self, slice_id: int) -> str:
        value = self.names[slice_id]
        return api_names.op_range_name(str(value)) if value is not None else "?"

    def read_after(self, op: int, ts: I64, end: I64) -> str | None:
        """The scalar read (an outermost op that is or holds ``aten::item`` and the like) that
        the outermost op ``op`` leads to on its thread: the first one starting at or after it,
        with no block starting in between. None without one."""
        key = (int(self.pid[op]), int(self.tid[op]))
        reads = self.reads.get(key)
        if reads is None:
            return None
        i = bisect.bisect_left(reads[0], int(ts[op]))
        if i >= len(reads[0]):
            return None
        barriers = self.barriers.get(key, [])
        j = bisect.bisect_left(barriers, int(end[op]))
        return reads[1][i] if j >= len(barriers) or barriers[j] > reads[0][i] else None


def host_context(trace: Trace, markers: I64, tree: HostTree | None = None,
                 marked: pl.DataFrame | None = None) -> HostContext:
    """The context arrays of every slice; ``markers``: the step markers' slice ids (never a block);
    ``tree`` and ``marked``: the trace's ``HostTree`` and ``marked_slices``, when the caller has them."""
    s = trace.slices
    n = s.height
    tree = tree if tree is not None else HostTree.of(trace)
    kind = s.get_column(Col.KIND).to_physical().to_numpy()
    host = np.isin(kind, [KIND_CODE[k.value] for k in HOST_KINDS])
    runtime = np.isin(kind, [KIND_CODE[k.value] for k in LAUNCH_KINDS])
    annotation = kind == KIND_CODE[Kind.ANNOTATION.value]
    flags = _name_flags(s.get_column(Col.NAME), host)
    op_range = flags["op_range"] & annotation
    op_like = (kind == KIND_CODE[Kind.CPU_OP.value]) | op_range
    phase = {p: flags[p] & annotation & ~op_range for p in (api_names.Phase.FORWARD, api_names.Phase.BACKWARD,
                                                             api_names.Phase.OPTIMIZER)}
    autograd = flags["autograd"] & host
    seq = np.zeros(n, dtype=bool)
    with_seq = trace.op_attrs.filter(pl.col(OpAttrCol.SEQUENCE).is_not_null()).get_column(OpAttrCol.ID).to_numpy()
    seq[with_seq] = True
    # A backward function recorded for a forward on another thread (PyTorch < 1.9 names nodes so).
    foreign = np.zeros(n, dtype=bool)
    foreign[trace.op_attrs.filter(pl.col(OpAttrCol.FWD_TID) > 0).get_column(OpAttrCol.ID).to_numpy()] = True
    seq |= flags["seq_range"] & op_range  # emit_nvtx: "aten::mul, seq = 3, op_id = 7"
    marked = marked if marked is not None else marked_slices(trace)
    compile_ids = marked.filter(pl.col(ROLE) == Role.COMPILE).get_column(Col.ID).to_numpy()
    compiling = np.zeros(n, dtype=bool)
    compiling[compile_ids] = True
    pid = s.get_column(Col.PID).fill_null(-1).to_numpy()
    tid = s.get_column(Col.TID).fill_null(-1).to_numpy()
    # The autograd engine's own threads (a CUDA device's backward runs there); on CPU the engine
    # runs nodes on the calling thread, so a thread with blocks or forward ops at its top level
    # (the step, the loop's own code) is the caller, not a backward thread.
    recorded = host & ~tree.is_python
    recorded_at = tree.nearest(recorded)
    # (Python frames above aside; ``tree.nearest(recorded, strict=True)``, from ``recorded_at``.)
    top_level = recorded & (np.where(tree.parent >= 0, recorded_at[np.maximum(tree.parent, 0)], -1) < 0)
    callers_work = top_level & (annotation | (op_like & seq & ~autograd & ~foreign))
    on_backward_thread = np.zeros(n, dtype=bool)
    for p, t in backward_threads(trace):
        thread = host & (pid == p) & (tid == t)
        if not (callers_work & thread).any():
            on_backward_thread |= thread
    recorded_op = op_like & seq & ~autograd & ~foreign
    # record_param_comms names its collective in an attribute ("allreduce"): an op whose args
    # record one is a collective call whatever it is called (a custom op, a renamed build).
    named_collective = dict(trace.op_attrs.filter(pl.col(OpAttrCol.COLLECTIVE).is_not_null()).select(
        OpAttrCol.ID, OpAttrCol.COLLECTIVE).iter_rows())
    comm_by_args = np.zeros(n, dtype=bool)
    comm_by_args[list(named_collective)] = True
    # A block (a user annotation) that runs ops in grad mode but makes no autograd node, in a
    # trace whose forward ops link to their backward ones (fwdbwd flows), is not the model's
    # forward: a per-sample preprocessing loop, metrics on detached outputs.
    quiet = annotation & ~op_range & ~_makes_nodes(trace, tree)
    forward_op = recorded_op & ~(tree.nearest(quiet) >= 0) if quiet.any() else recorded_op
    marks = [
        (HostPurpose.COMPILATION, compiling),
        (HostPurpose.DATA_LOADING, flags["dataloader"] & host),
        (HostPurpose.COMMUNICATION, (flags["comm"] | comm_by_args) & host & ~runtime),
        (HostPurpose.OPTIMIZER, (flags["optimizer"] & host) | phase[api_names.Phase.OPTIMIZER]),
        (HostPurpose.BACKWARD, autograd | foreign | phase[api_names.Phase.BACKWARD]),
        (HostPurpose.FORWARD, phase[api_names.Phase.FORWARD] | forward_op),
    ]
    context = np.full(n, int(HostPurpose.NONE), dtype=np.int8)
    undecided = host.copy()
    comm_at = np.full(n, -1, dtype=np.int64)
    in_backward = np.zeros(n, dtype=bool)
    for ctx, mark in marks:
        at = tree.nearest(mark)
        hit = undecided & ((at >= 0) | ((ctx == HostPurpose.BACKWARD) & on_backward_thread))
        context[hit] = int(ctx)
        undecided &= ~hit
        if ctx == HostPurpose.COMMUNICATION:
            comm_at = at
        if ctx == HostPurpose.BACKWARD:
            in_backward = host & ((at >= 0) | on_backward_thread)
    names = s.get_column(Col.NAME)
    collective = Collectives(n)
    # Each slice in a collective's context takes the name of the slice that set it, named once
    # (a name read per slice was 380 k Series lookups on a large export).
    rows = np.flatnonzero(context == int(HostPurpose.COMMUNICATION))
    owners, inverse = np.unique(comm_at[rows], return_inverse=True)
    # (The owners' names gathered at once, each distinct one parsed once: 165 k Series lookups
    # and parses took 0.33 s on a large export.)
    texts = names.gather(owners).cast(pl.String).to_list() if owners.size else []
    parsed: dict[str, str] = {}
    owner_names = []
    for o, text in zip(owners.tolist(), texts, strict=True):
        text = named_collective.get(o) or str(text)
        if text not in parsed:
            parsed[text] = collective_name(text)
        owner_names.append(parsed[text])
    for i, k in zip(rows.tolist(), inverse.reshape(-1).tolist(), strict=True):
        collective[i] = owner_names[k]
    marker = np.zeros(n, dtype=bool)
    marker[markers[markers >= 0]] = True
    block = annotation & ~op_range & ~marker & ~flags["dataloader"] & ~flags["optimizer"] & ~np.logical_or.reduce(
        list(phase.values()))
    ts = tree.ts
    outer_op = _outermost(tree, op_like)
    reads, barriers = _reads_and_barriers(names, outer_op, flags["scalar_read"] & op_like, annotation & ~op_range,
                                          pid, tid, ts)
    user = np.zeros(n, dtype=bool)
    if tree.is_python.any():
        py = np.flatnonzero(tree.is_python)
        frames = names.gather(py)  # (strings are made of the distinct frame names only)
        user_names = [u for u in distinct_names(frames)[1] if parse_frame(u)[3]]
        user[py[frames.is_in(user_names).to_numpy()]] = True
    return HostContext(
        context=context, outer_op=narrow(outer_op), outer_block=narrow(_outermost(tree, block)),
        user_frame=narrow(tree.nearest(user)), running_at_start=running_at_start(trace, tree),
        recorded=narrow(recorded_at),
        recompute=narrow(tree.nearest(recorded_op & ((tree.nearest(autograd | foreign) >= 0) | on_backward_thread))),
        in_backward=in_backward,
        collective=collective, has_frames=bool(tree.is_python.any()),
        has_phases=bool(np.logical_or.reduce([*phase.values(), flags["optimizer"] & host, autograd]).any()),
        names=names, reads=reads, barriers=barriers, pid=narrow(pid), tid=narrow(tid),
    )


def _makes_nodes(trace: Trace, tree: HostTree) -> B:
    """Per slice, whether it or a slice inside it is a forward op that made an autograd node:
    where a fwdbwd flow starts (Kineto links such an op to its backward node; the flow starts at
    the op's own start on its thread). Every slice, where the trace has no such flow (older or
    non-Kineto traces): nothing is told apart there."""
    s = trace.slices
    flows = trace.flows.filter((pl.col(FlowCol.KIND) == "fwdbwd") & (pl.col(FlowCol.PHASE) == "s"))
    if flows.height == 0:
        return np.ones(s.height, dtype=bool)
    ops = trace.kind_columns((Kind.CPU_OP,), Col.ID, Col.PID, Col.TID, Col.TS)
    linked = ops.join(flows.select(pl.col(FlowCol.PID).alias(Col.PID), pl.col(FlowCol.TID).alias(Col.TID),
                                   pl.col(FlowCol.TS).alias(Col.TS)).unique(), on=[Col.PID, Col.TID, Col.TS])
    makes = np.zeros(s.height, dtype=bool)
    at = linked.get_column(Col.ID).to_numpy()
    while at.size:  # each linked op and every slice above it
        makes[at] = True
        at = tree.parent[at]
        at = np.unique(at[at >= 0])
        at = at[~makes[at]]
    return makes


def collective_name(text: str) -> str:
    """The collective a host op or range stands for ("all_reduce"), else its name."""
    ranged = collective_range(text)
    return ranged[1] if ranged else collective_op(api_names.op_range_name(text)) or api_names.op_range_name(text)


def _outermost(tree: HostTree, mark: B) -> I64:
    """Per slice, the outermost slice with ``mark`` at or above it (-1: none): the top of the
    chain of marked slices above its nearest one (one whole-array step per marked level took
    depth squared steps on deeply nested ops; ``chain_top`` jumps). A tree whose depths count
    its parent chains settles it a level at a time (``HostTree.outermost``)."""
    outer_by_level = tree.outermost(mark)
    if outer_by_level is not None:
        return outer_by_level
    at = tree.nearest(mark)
    above = np.where(tree.parent >= 0, at[np.maximum(tree.parent, 0)], -1)  # nearest(mark, strict=True), from ``at``
    top = chain_top(np.where(mark, above, -1))
    outer: I64 = np.where(at >= 0, top[np.maximum(at, 0)], -1)
    return outer


Reads = dict[tuple[int, int], tuple[list[int], list[str]]]


def _reads_and_barriers(names: pl.Series, outer_op: I64, read: B, blocks: B, pid: I64, tid: I64, ts: I64
                        ) -> tuple[Reads, dict[tuple[int, int], list[int]]]:
    """Per thread: the outermost ops that are or hold a scalar read (start times, read names) and
    the start times of the blocks (annotations) that end a run of ops."""
    rows = np.flatnonzero(read)
    holders, first = np.unique(outer_op[rows], return_index=True)
    keep = holders >= 0
    holders, inner = holders[keep], rows[first[keep]]
    reads: Reads = {}
    texts = names.gather(inner).cast(pl.String).to_list()
    for i in np.argsort(ts[holders], kind="stable").tolist():
        op = int(holders[i])
        got = reads.setdefault((int(pid[op]), int(tid[op])), ([], []))
        got[0].append(int(ts[op]))
        got[1].append(api_names.op_range_name(str(texts[i])))
    barriers: dict[tuple[int, int], list[int]] = {}
    rows = np.flatnonzero(blocks)
    for p, t, start in sorted(zip(pid[rows].tolist(), tid[rows].tolist(), ts[rows].tolist(), strict=True)):
        barriers.setdefault((p, t), []).append(start)
    return reads, barriers


def _name_flags(names: pl.Series, host: B) -> dict[str, B]:
    """Per row, what its name says: each distinct name of a host slice tested once, rows mapped by
    their code (every use ands a flag with a host kind, so other slices' names, the kernels', are
    left out: False there). Each name's op range and phase are parsed once, and each test runs on
    the names its literal pre-test passes (``api_names.PRETESTS``; 16 k distinct names in an
    emit_nvtx export: ten generator-and-lambda tests of them took 0.08 s, a list comprehension of
    direct calls per test 0.03 s)."""
    unique_codes, texts = distinct_names(names, host)
    op_names = api_names.op_range_names(texts)
    phases = decide(texts, api_names.annotation_phase, api_names.PRETESTS[api_names.annotation_phase], None)
    pretests = api_names.PRETESTS
    answers: dict[str, list[bool]] = {
        # (No is_optimizer answer: its key, "optimizer", is Phase.OPTIMIZER's too, and the phase's
        # answer, which replaced it in this table, is what every use reads.)
        "dataloader": decide(texts, api_names.is_dataloader, pretests[api_names.is_dataloader], False),
        "comm": decide(texts, api_names.is_comm, pretests[api_names.is_comm], False),
        "autograd": decide(texts, api_names.is_autograd_node, pretests[api_names.is_autograd_node], False),
        "scalar_read": decide(op_names, api_names.is_scalar_read, pretests[api_names.is_scalar_read], False),
        "op_range": [o != t for o, t in zip(op_names, texts, strict=True)],
        "seq_range": [_SEQ_RANGE in t for t in texts],
        **{phase: [p == phase for p in phases] for phase in (api_names.Phase.FORWARD, api_names.Phase.BACKWARD,
                                                               api_names.Phase.OPTIMIZER)},
    }
    rows = NameCodes.of(names)
    return {key: rows.spread(unique_codes, values, False, bool) for key, values in answers.items()}


#: emit_nvtx writes "seq = N" into the range of an op autograd records.
_SEQ_RANGE: Final = "seq = "


def top_collective(trace: Trace, context: npt.NDArray[np.int8], ids: I64) -> I64:
    """Per slice id: the outermost slice at or above it whose context is communication (the
    collective call it belongs to; -1: none)."""
    parent = trace.slices.get_column(Col.PARENT).fill_null(-1).to_numpy()
    comm = int(HostPurpose.COMMUNICATION)
    cur = np.asarray(ids, dtype=np.int64)
    top = np.where((cur >= 0) & (context[np.maximum(cur, 0)] == comm), cur, -1)
    up = parent[np.maximum(cur, 0)]
    up[cur < 0] = -1
    while (up >= 0).any():
        top = np.where((up >= 0) & (context[np.maximum(up, 0)] == comm), up, top)
        up = np.where(up >= 0, parent[np.maximum(up, 0)], -1)
    return top


def frame_line(ctx: HostContext, frame: int) -> str:
    """A user frame as "file.py:52 function" (the file's base name: the path is in the frame). A
    frame already running when the profiler started is named without its line, which is the
    profiler's start (a prof.step() line), where none of the frame's own time is."""
    file, line, function, _ = parse_frame(ctx.name(frame))
    if not file:
        return function
    if ctx.running_at_start[frame]:
        return f"{posixpath.basename(file)} {function} (running at start)"
    return f"{posixpath.basename(file)}:{line} {function}"
