"""The parts of a step account, and the rules that put each stretch of a critical path in one.

A stretch is an edge of the dependency graph (``critical_path_graph``); its part is decided by
what its time was spent in, first by the edge and its category (``critical_path_walk``):

- a GPU activity running: kernels by family (``families``), copies by direction and host memory
  kind (the copy's own attributes), communication by collective;
- a launch call or launch latency: launch overhead; a stream's queue gap: GPU queue gaps, or, past
  KERNEL_GAP_MAX_NS, a wait on another stream the trace did not record (idle);
- a blocking call returning after its GPU work, a stream waiting on another's event, a thread
  handing back to the one waiting on it: sync, by the blocking call and the op it is under;
- host time in a slice: by what encloses the slice (``account_host.HostPurpose``): compilation, data
  loading, communication, optimizer, backward, forward; else by the innermost user source line
  open at that instant (with Python frames), the outermost named block, or the outermost op (ops
  that lead up to a scalar read grouped under it); a thread with nothing open is untraced Python.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.account_compiled import CompiledFrames
from tracewhy.analyses.account_host import HostContext, HostPurpose, frame_line, host_context
from tracewhy.analyses.account_names import Part, PartKind, PartName
from tracewhy.analyses.account_slices import CopyAttrs, KernelFamilies, KindNames, copy_label, label_copies
from tracewhy.analyses.account_unrecorded import FirstGpuWork
from tracewhy.analyses.account_waits import waits_on_collectives
from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.critical_path_graph import Graph
from tracewhy.analyses.critical_path_walk import CATEGORIES, Category, EdgeLabels
from tracewhy.analyses.distinct_rows import distinct_rows
from tracewhy.analyses.families import Family, classify_kernels, collective_op
from tracewhy.analyses.host_activity import HostIndex, build_host_index
from tracewhy.analyses.host_tree import HostTree
from tracewhy.analyses.id_arrays import narrow
from tracewhy.analyses.name_codes import NameCodes, distinct_names
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, Kind
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]


#: Copies a step does on the device itself; host transfers (HtoD, DtoH) could overlap compute.
_DEVICE_COPIES: Final = frozenset({"DtoD", "memset", "copy kernels"})
_PHASE_PARTS: Final = {HostPurpose.OPTIMIZER: PartName.OPTIMIZER, HostPurpose.BACKWARD: PartName.BACKWARD,
                       HostPurpose.FORWARD: PartName.FORWARD}
CATEGORY_CODE: Final = {c: i for i, c in enumerate(CATEGORIES)}
#: Edges decided at once (``PartRules.of_edges``): thirteen int64 key columns of 256 k edges are
#: 27 MB, and a chunk decides its few hundred keys in milliseconds.
DECIDE_CHUNK = 1 << 18


class PartRules:
    """Parts and evidence items of edges, for the account's paths and for edited graphs' paths."""

    def __init__(self, trace: Trace, graph: Graph, labels: EdgeLabels, markers: I64,
                 host: HostIndex | None = None, compiled: dict[int, str] | None = None,
                 tree: HostTree | None = None, marked: pl.DataFrame | None = None) -> None:
        self.graph = graph
        self.compiled = CompiledFrames(compiled)
        self.ctx: HostContext = host_context(trace, markers, tree, marked)
        #: Each edge's category code (CATEGORY_CODE), one byte an edge.
        self.category = labels.category_code
        s = trace.slices
        # Kind names through their codes (``account_slices``), a byte each; ids and codes int32 (``narrow``).
        self.kind_code = s.get_column(Col.KIND).to_physical().to_numpy().astype(np.int8)
        self.kind = KindNames(self.kind_code)
        self.slice_ts = s.get_column(Col.TS).to_numpy()
        self.launch = narrow(s.get_column(Col.LAUNCH).fill_null(-1).to_numpy())
        self.slice_end = self.slice_ts + np.maximum(s.get_column(Col.DUR).to_numpy(), 0)
        self.cpu_only = trace.kind_columns(GPU_ACTIVITY_KINDS, Col.ID).height == 0
        self.host: HostIndex = host if host is not None else build_host_index(trace)
        classes = classify_kernels(trace)
        self.family = KernelFamilies(classes)
        self.copies = CopyAttrs(trace.copy_attrs)
        self.parts: list[Part] = []
        # Each key decided once (predictions walk the same edges again); each op's scalar read found once.
        self._decided: dict[tuple[int, ...], tuple[int, int]] = {}
        self._reads: dict[int, int] = {}
        self.items: list[str] = []
        self._part_index: dict[str, int] = {}
        self._item_index: dict[str, int] = {}
        self.gpu_label = narrow(self._gpu_labels(trace, classes))
        self.first_gpu = FirstGpuWork(trace)
        self.name_code = narrow(self._display_codes(s.get_column(Col.NAME)))

    # --- vocabulary ------------------------------------------------------------------------------

    def part(self, name: str, kind: str, essential: bool = False) -> int:
        i = self._part_index.get(name)
        if i is None:
            i = self._part_index[name] = len(self.parts)
            self.parts.append(Part(name, kind, essential))
        return i

    def index_of(self, name: str) -> int | None:
        """A part's index, None when no edge has gone to it yet."""
        return self._part_index.get(name)

    def item(self, text: str) -> int:
        i = self._item_index.get(text)
        if i is None:
            i = self._item_index[text] = len(self.items)
            self.items.append(text)
        return i

    # --- edges -----------------------------------------------------------------------------------

    def of_edges(self, kind: I64, attr: I64, category: npt.NDArray[np.integer[Any]], src: I64, dst: I64
                 ) -> tuple[I64, I64, I64]:
        """Part, evidence item and the item's slice (-1: none) of each edge (kind: an Edge value;
        category: CATEGORY_CODE): the slices tell how many of an item a step holds."""
        if kind.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        kind, attr, category = self._handoffs_as_host(kind, attr, category.astype(np.int64), src, dst)
        frame = self._user_frames(kind, attr, src, dst)
        # A launch call that waited: for its own copy (cudaMemcpyAsync from pageable memory), or
        # for a free slot in a full launch queue (another activity's end released it).
        own = ((kind == int(Edge.SYNC)) & (self.launch[self.graph.node_slice[src]] == attr)).astype(np.int64)
        # The keys' thirteen columns are alive at once: decided a chunk of edges at a time (17 M
        # edges of a large export's whole-trace window held 2 GB of them). The items the
        # features name are numbered first, over all edges, and each key is decided at its
        # first edge, so every part and item gets the number one pass would give it.
        self._feature_items(kind, attr)
        part, item = np.empty(kind.size, np.int64), np.empty(kind.size, np.int64)
        for lo in range(0, kind.size, DECIDE_CHUNK):
            at = slice(lo, lo + DECIDE_CHUNK)
            part[at], item[at] = self._decided_parts(kind[at], attr[at], category[at], frame[at], own[at])
        part, item = waits_on_collectives(self, kind, src, dst, *self._unrecorded(kind, attr, src, dst, part, item))
        host = (kind == int(Edge.HOST)) & (attr >= 0)
        outer = np.where(host, self.ctx.outer_op[np.maximum(attr, 0)], -1)
        owner = np.where(frame >= 0, frame, np.where(outer >= 0, outer, attr))
        return part, item, owner

    def _decided_parts(self, kind: I64, attr: I64, category: I64, frame: I64, own: I64) -> tuple[I64, I64]:
        """Part and item of each edge, through keys: edges whose part and item are decided alike
        share a key (what the rules read of the slice: its kind, name, context, outer op, block,
        scalar read, collective, GPU label; not the slice itself); each key is decided once, on
        its first edge's slice."""
        columns = [kind.astype(np.int64), category, own, self._frame_codes(frame), *self._features(kind, attr)]
        first, inverse = distinct_rows(columns)
        decided = []
        for at, row in zip(first.tolist(), np.stack([c[first] for c in columns], axis=1).tolist(), strict=True):
            key = tuple(row)
            got = self._decided.get(key)
            if got is None:
                got = self._decided[key] = self._decide(int(kind[at]), int(attr[at]), int(category[at]),
                                                        int(frame[at]), int(own[at]))
            decided.append(got)
        del columns
        part = np.array([d[0] for d in decided], dtype=np.int64)[inverse.reshape(-1)]
        item = np.array([d[1] for d in decided], dtype=np.int64)[inverse.reshape(-1)]
        return part, item

    def _unrecorded(self, kind: I64, attr: I64, src: I64, dst: I64, part: I64, item: I64) -> tuple[I64, I64]:
        """Launch edges issued long before their device's first recorded work (``account_unrecorded``)
        go to their own part, whatever their launch call's context: no host change shortens them."""
        g = self.graph
        unrecorded = self.first_gpu.unrecorded_launches(kind == int(Edge.LAUNCH), g.node_slice[dst], g.node_ts[src])
        if not unrecorded.any():
            return part, item
        part, item = part.copy(), item.copy()
        part[unrecorded] = self.part(PartName.UNRECORDED_GPU, PartKind.IDLE)
        for i in np.flatnonzero(unrecorded).tolist():
            item[i] = self.item(f"{self.ctx.name(int(attr[i])) or 'launch'} before the GPU's first recorded work")
        return part, item

    def _codes(self, ids: I64) -> I64:
        """Each slice's name code (-1: no slice)."""
        return np.where(ids >= 0, self.name_code[np.maximum(ids, 0)], np.int64(-1))

    def _frame_codes(self, frames: I64) -> I64:
        """Name codes of frames; a compiled kernel frame's is its source line's (below -1)."""
        return self.compiled.codes(frames, self._codes(frames))

    def _frame_line(self, frame: int) -> str:
        label = self.compiled.lines_of.get(frame)
        return label if label is not None else frame_line(self.ctx, frame)

    def _features(self, kind: I64, attr: I64) -> list[I64]:
        """What the rules read of each edge's slice, as codes (see ``of_edges``)."""
        has = attr >= 0
        safe = np.maximum(attr, 0)
        gpu = kind == int(Edge.GPU)
        context, outer, block, alone, comm = self._contexts(kind, attr)
        reads = np.full(attr.size, -1, dtype=np.int64)
        ops, at = np.unique(outer[alone], return_inverse=True)
        reads[alone] = np.array([self._read_code(op) for op in ops.tolist()], dtype=np.int64)[at.reshape(-1)]
        collective = np.full(attr.size, -1, dtype=np.int64)
        slices, at = np.unique(attr[comm], return_inverse=True)
        collective[comm] = np.array([self.item(self.ctx.collective[s] or "") for s in slices.tolist()],
                                    dtype=np.int64)[at.reshape(-1)]
        return [np.where(has, self.kind_code[safe], np.int64(-1)), self._codes(attr), context, self._codes(outer),
                (outer == attr).astype(np.int64), self._codes(block), reads, collective,
                np.where(gpu & has, self.gpu_label[safe], np.int64(-1))]

    def _contexts(self, kind: I64, attr: I64) -> tuple[I64, I64, I64, npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """Per edge: its slice's context, outer op and block, and whether a scalar read (ops
        alone, outside the phases) or a collective (communication) names it."""
        ctx = self.ctx
        has = attr >= 0
        safe = np.maximum(attr, 0)
        context = np.where(has & (kind != int(Edge.GPU)), ctx.context[safe], int(HostPurpose.NONE)).astype(np.int64)
        outer = np.where(has, ctx.outer_op[safe], -1)
        block = np.where(has, ctx.outer_block[safe], -1)
        alone = (context == int(HostPurpose.NONE)) & (outer >= 0) & (block < 0)
        return context, outer, block, alone, context == int(HostPurpose.COMMUNICATION)

    def _feature_items(self, kind: I64, attr: I64) -> None:
        """Numbers the items these edges' features name (scalar reads, then collectives, each in
        slice order) as ``_features`` over all of them at once would, a chunk at a time."""
        ops, slices = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for lo in range(0, kind.size, DECIDE_CHUNK):
            at = slice(lo, lo + DECIDE_CHUNK)
            _, outer, _, alone, comm = self._contexts(kind[at], attr[at])
            ops.append(np.unique(outer[alone]))
            slices.append(np.unique(attr[at][comm]))
        for op in np.unique(np.concatenate(ops)).tolist():
            self._read_code(op)
        for s in np.unique(np.concatenate(slices)).tolist():
            self.item(self.ctx.collective[s] or "")

    def _read_code(self, op: int) -> int:
        """The scalar read an op outside the phases leads up to, as an item code (-1: none)."""
        code = self._reads.get(op)
        if code is None:
            read = self.ctx.read_after(op, self.slice_ts, self.slice_end)
            code = self._reads[op] = self.item(read) if read is not None else -1
        return code

    def _handoffs_as_host(self, kind: I64, attr: I64, category: I64, src: I64, dst: I64) -> tuple[I64, I64, I64]:
        """A hand-off between the thread that called backward() and the autograd thread is time
        the caller spent waiting (from a start on it, handing work over; or from the autograd
        thread's last top-level end, into its own waiting stretch): host time on the caller, in
        what was open there at the hand-off's midpoint."""
        hand = np.flatnonzero(kind == int(Edge.HANDOFF))
        if hand.size == 0:
            return kind, attr, category
        kind, attr, category = kind.copy(), attr.copy(), category.copy()
        g = self.graph
        caller = np.where(src[hand] % 2 == 0, g.node_slice[src[hand]], g.node_slice[dst[hand]])
        mid = (g.node_ts[src[hand]] + g.node_ts[dst[hand]]) // 2
        attr[hand] = self._open_at(caller, mid)
        kind[hand] = int(Edge.HOST)
        category[hand] = np.where(attr[hand] >= 0, CATEGORY_CODE[Category.HOST_OPS], CATEGORY_CODE[Category.IDLE])
        return kind, attr, category

    def innermost_open(self, on_thread_of: I64, times: I64) -> I64:
        """The innermost host slice open at each instant on the thread of each given slice; -1
        where nothing is."""
        out = np.full(times.size, -1, dtype=np.int64)
        pid, tid = self.ctx.pid[on_thread_of], self.ctx.tid[on_thread_of]
        for p, t in set(zip(pid.tolist(), tid.tolist(), strict=True)):
            sel = np.flatnonzero((pid == p) & (tid == t))
            pos = self.host.innermost(p, t, times[sel])
            out[sel] = np.where(pos >= 0, self.host.ids[np.maximum(pos, 0)], -1)
        return out

    def _open_at(self, on_thread_of: I64, times: I64) -> I64:
        """The innermost recorded slice (Python frames aside) open at each instant on the thread
        of each given slice; -1 where nothing is."""
        inner = self.innermost_open(on_thread_of, times)
        return np.where(inner >= 0, self.ctx.recorded[np.maximum(inner, 0)], -1)

    def _user_frames(self, kind: I64, attr: I64, src: I64, dst: I64) -> I64:
        """The innermost user frame open at each host edge's midpoint (-1: none, or not a host edge)."""
        out = np.full(kind.size, -1, dtype=np.int64)
        if not self.ctx.has_frames:
            return out
        host_rows = np.flatnonzero(kind == int(Edge.HOST))
        g = self.graph
        # The thread: the attributed slice's, else the later instant's (a hand-off's caller).
        owner = np.where(attr[host_rows] >= 0, attr[host_rows], g.node_slice[dst[host_rows]])
        inner = self.innermost_open(owner, (g.node_ts[src[host_rows]] + g.node_ts[dst[host_rows]]) // 2)
        frame = np.where(inner >= 0, self.ctx.user_frame[np.maximum(inner, 0)], -1)
        out[host_rows] = self.compiled.frame_or(inner, frame)
        return out

    def _decide(self, kind: int, attr: int, category: int, frame: int, own: int) -> tuple[int, int]:
        cat = CATEGORIES[category]
        name = self.ctx.name(attr) if attr >= 0 else ""
        if kind == Edge.GPU:
            return self.gpu_part(attr, cat), self.item(name)
        if kind == Edge.GAP:
            if cat == Category.KERNEL_GAP:
                return self.part(PartName.GPU_GAP, PartKind.GPU_GAP), self.item("stream order")
            return self.part(PartName.GPU_WAIT, PartKind.IDLE), self.item("queued work waiting")
        if kind == Edge.EVENT_WAIT:
            return self.part(PartName.STREAM_WAIT, PartKind.SYNC), self.item(name or "unrecorded wait")
        if attr < 0:  # a host thread with nothing open
            if frame >= 0:
                line = self._frame_line(frame)
                return self.part(f"host: {line}", PartKind.HOST), self.item(line)
            return self.part(PartName.UNTRACED, PartKind.IDLE), self.item("nothing open")
        context = HostPurpose(int(self.ctx.context[attr])) if self.kind[attr] != Kind.KERNEL.value else HostPurpose.NONE
        if context == HostPurpose.COMPILATION:
            return self.part(PartName.COMPILATION, PartKind.COMPILATION), self._host_item(attr, frame)
        if context == HostPurpose.DATA_LOADING:
            return self.part(PartName.DATA_LOADING, PartKind.DATA_LOADING), self._host_item(attr, frame)
        if kind == Edge.LAUNCH or cat == Category.LAUNCH:
            return self.part(PartName.LAUNCH, PartKind.LAUNCH), self.item(name)
        if kind == Edge.SYNC or cat == Category.SYNC:
            return self._sync(attr, name, bool(own))
        if api_names.is_alloc_call(name):
            return self.part(f"allocator: {name}", PartKind.HOST), self.item(name)
        if context == HostPurpose.COMMUNICATION:
            collective = self.ctx.collective[attr] or "collective"
            return self.part(f"communication: {collective}", PartKind.COMMUNICATION), self._host_item(attr, frame)
        if context in _PHASE_PARTS:
            return (self.part(_PHASE_PARTS[context], PartKind.HOST, essential=self.cpu_only),
                    self._host_item(attr, frame))
        return self._other_host(attr, frame)

    def _display_codes(self, names: pl.Series) -> I64:
        """Per slice, a code of its name as shown (emit_nvtx's "aten::mul, op_id = 7" ranges,
        one name per call, as "aten::mul"); -1 without a name."""
        codes, texts = distinct_names(names)
        out: I64 = NameCodes.of(names).spread(codes, [self.item(t) for t in api_names.op_range_names(texts)], -1,
                                                np.int64)
        return out

    def _gpu_labels(self, trace: Trace, classes: pl.DataFrame) -> I64:
        """Per GPU activity, a code for what names its part: a kernel's family (a collective's
        name for communication), a copy's direction and host memory."""
        s = trace.slices
        out = np.full(s.height, -1, dtype=np.int64)
        for family, ids in classes.group_by("family", maintain_order=True).agg(pl.col(Col.ID)).iter_rows():
            if family == Family.COMMUNICATION.value:
                for i in ids:
                    out[i] = self.item(self._collective(i))
            else:
                out[np.asarray(ids, dtype=np.int64)] = self.item(str(family))
        copies = trace.kind_columns((Kind.MEMCPY, Kind.MEMSET), Col.ID).get_column(Col.ID).to_numpy()
        label_copies(out, copies, self.kind, self.copies, self.item)
        return out

    def gpu_part(self, activity: int, cat: str) -> int:
        if cat == Category.KERNELS:
            family = self.family.of(activity)
            return self.part(f"kernels: {family}", PartKind.KERNELS, essential=True)
        if cat == Category.COMMUNICATION:
            return self.part(f"communication: {self._collective(activity)}", PartKind.COMMUNICATION)
        what = self._copy(activity)
        return self.part(f"copies: {what}", PartKind.COPIES, essential=what in _DEVICE_COPIES)

    def _collective(self, activity: int) -> str:
        """The kernel's name ("ncclDevKernel_AllReduce_..."), else the collective it was launched
        under (RCCL's ncclDevKernel_Generic names none)."""
        launch = int(self.launch[activity])
        return (collective_op(self.ctx.name(activity)) or (self.ctx.collective[launch] if launch >= 0 else None)
                or "collective")

    def _copy(self, activity: int) -> str:
        return copy_label(self.kind[activity], self.copies.get(activity))

    def _sync(self, call: int, name: str, own_copy: bool) -> tuple[int, int]:
        if api_names.is_launch_call(name) and not own_copy:
            return self.part(PartName.QUEUE_FULL, PartKind.SYNC), self.item(name)
        op = int(self.ctx.outer_op[call])
        where = f"{name} under {self.ctx.name(op)}" if op >= 0 and op != call else name
        return self.part(f"sync: {where}", PartKind.SYNC), self.item(where)

    def _host_item(self, slice_id: int, frame: int) -> int:
        """What to show as evidence for host time: the user line, else the outermost op, else the slice."""
        if frame >= 0:
            return self.item(self._frame_line(frame))
        op = int(self.ctx.outer_op[slice_id])
        return self.item(self.ctx.name(op if op >= 0 else slice_id))

    def _other_host(self, slice_id: int, frame: int) -> tuple[int, int]:
        """Host work in no phase: by user line, named block, or outermost op (ops leading up to a
        scalar read under it); a step marker with nothing else open is untraced Python."""
        ctx = self.ctx
        op = int(ctx.outer_op[slice_id])
        essential = self.cpu_only and not ctx.has_phases and op >= 0
        item = self._host_item(slice_id, frame)
        if frame >= 0:
            return self.part(f"host: {self._frame_line(frame)}", PartKind.HOST, essential), item
        block = int(ctx.outer_block[slice_id])
        if block >= 0:
            return self.part(f"host: {ctx.name(block)}", PartKind.HOST, essential), item
        if op >= 0:
            read = ctx.read_after(op, self.slice_ts, self.slice_end)
            name = f"{PartName.READ_PREFIX}{read}" if read is not None else f"host: {ctx.name(op)}"
            return self.part(name, PartKind.HOST, essential), item
        if self.kind[slice_id] in (Kind.RUNTIME.value, Kind.DRIVER.value):
            return self.part(f"host: {ctx.name(slice_id)}", PartKind.HOST), item
        return self.part(PartName.UNTRACED, PartKind.IDLE), self.item("nothing but the step open")

