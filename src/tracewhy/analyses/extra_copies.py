"""Copies a step makes that the math after them does not need: ``.contiguous()`` calls that
copied (a copy op under them, or a copy they launched) before an op that reads strided inputs
itself, and dtype casts back and forth (A to B on a tensor of one shape, then B back to A on a
tensor of that shape, with only elementwise work between them). Measured per step window:
which copies, how many, the bytes they wrote and the slices a replay removes to price them
(``findings/extra_copies.py`` judges).

What decides is nesting (the copy op under ``aten::contiguous``, the ``aten::copy_`` under a
cast, whose recorded input types are the destination's and the source's dtypes), the recorded
shapes (the consumer is the next op on the thread that takes a tensor of the copy's shape; a
cast pairs with a later one of the same shape), ``shapes.estimate``'s category of the ops in
between and of the consumer, and the step windows. Names only find the ops, listed below with
their source.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.host_tree import HostTree
from tracewhy.analyses.op_inputs import InputsById
from tracewhy.analyses.shapes import (
    COPY,
    ELEMENTWISE,
    GEMM,
    NORMALIZATION,
    REDUCTION,
    estimate,
)
from tracewhy.analyses.tensor_sizes import nbytes
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, OpAttrCol
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]

#: ``Tensor.contiguous()`` (aten/src/ATen/native/TensorProperties.cpp): returns the tensor itself
#: when it already is contiguous, else ``clone(memory_format=contiguous)``.
CONTIGUOUS_OP: Final = "aten::contiguous"
#: What a contiguous call that copies runs (clone -> empty_like + copy_, TensorFactories.cpp, Copy.cpp).
COPYING_OPS: Final = frozenset({"aten::clone", "aten::copy_", "aten::empty_like"})
#: ``Tensor.to(dtype)``/``.half()``/``.float()`` record ``aten::to`` over ``aten::_to_copy``
#: (aten/src/ATen/native/TensorConversions.cpp); a cast to the same dtype returns the tensor, no child.
CAST_OPS: Final = frozenset({"aten::to", "aten::_to_copy"})
#: The write under a cast: ``copy_(self=destination, src)``, so its recorded input types are the
#: destination's dtype then the source's, and its first input dims the copied shape.
WRITE_OP: Final = "aten::copy_"
#: ``shapes.estimate`` categories of the work a round trip may have between its casts: element by
#: element on a tensor of the cast's shape. Anything else (a matmul, a reduction, a view, an op
#: estimate does not model, work on other shapes) makes a cast on each side of it each side's
#: own precision choice, or about another tensor.
ELEMENTWISE_WORK: Final = frozenset({ELEMENTWISE, COPY})
#: ``shapes.estimate`` categories of consumers that read strided tensors as they are (BLAS takes
#: a transposed operand, TensorIterator any strides). Not fused attention (its kernels require a
#: unit stride on the last dim) nor a copy or cast (it keeps the strides it is given, so the
#: contiguous call sets the layout of what it makes).
READS_STRIDED: Final = frozenset({GEMM, ELEMENTWISE, REDUCTION, NORMALIZATION})
#: Contiguous round trips and copies: what ``ExtraCopy.kind`` says.
CONTIGUOUS: Final = "contiguous"
ROUND_TRIP: Final = "cast round trip"


class ExtraCopy(msgspec.Struct, frozen=True):
    """Copies of one kind, shape and dtype(s) in the step windows."""

    kind: str  # CONTIGUOUS or ROUND_TRIP
    shape: tuple[int, ...]
    dtypes: tuple[str, ...]  # (dtype,) for a contiguous copy; (A, B) for A -> B -> A
    consumer: str  # the op that read the contiguous copy; the first cast's op for a round trip
    ids: tuple[int, ...]  # the copy ops (both casts of each round trip)
    calls: int  # contiguous copies, or round trips
    bytes: int  # bytes all of them wrote (a round trip: both casts' outputs)
    host_ns: int  # the copy ops' time on the host, all calls


@dataclass(frozen=True)
class ExtraCopiesResult:
    copies: tuple[ExtraCopy, ...]
    #: Every slice a replay without the copies takes out: the copy ops, all under them, and the
    #: GPU work they launched.
    removed: tuple[int, ...]
    has_shapes: bool


def extra_copies(trace: Trace, starts: I64, ends: I64, tree: HostTree | None = None) -> ExtraCopiesResult:
    """The extra copies inside the windows [starts, ends) (one per step); ``tree``: the trace's
    ``HostTree``, when the caller has it."""
    s = trace.slices
    tree = tree if tree is not None else HostTree.of(trace)
    attrs = trace.op_attrs.select(OpAttrCol.ID, OpAttrCol.INPUT_DIMS, OpAttrCol.INPUT_TYPES)
    inputs = InputsById(*(attrs.get_column(c).to_list() for c in attrs.columns))
    has_shapes = inputs.any()
    if not has_shapes or starts.size == 0:
        return ExtraCopiesResult((), (), has_shapes)
    # (Every slice's name as a string, once there are shapes to read: an nsys export has none,
    # and its 8 M names were 0.5 GB.)
    names = s.get_column(Col.NAME).cast(pl.String).fill_null("").to_list()
    step = np.searchsorted(starts, tree.ts, side="right") - 1
    inside = (step >= 0) & (tree.ts < ends[np.maximum(step, 0)])
    tid = s.get_column(Col.TID).fill_null(-1).to_numpy()
    above_op = tree.nearest(tree.is_op, strict=True)
    # What a Python line called, or backward ran for an autograd node: the op right under the
    # node's range or under the node's own function range (``ToCopyBackward0``) in it.
    node = np.array([api_names.is_autograd_node(n) for n in names], dtype=bool)
    body = (above_op >= 0) & node[np.maximum(above_op, 0)]
    top = [i for i in np.flatnonzero(tree.is_op & inside).tolist()
           if above_op[i] < 0 or node[above_op[i]] or body[above_op[i]]]
    children: dict[int, list[int]] = defaultdict(list)
    for child in np.flatnonzero(tree.is_op & (tree.parent >= 0)).tolist():
        children[int(tree.parent[child])].append(child)
    gpu_launched = tree.inclusive(tree.gpu_self)
    # Ops in time order per (step, thread): the consumer and the work between two casts are read there.
    ops = np.flatnonzero(tree.is_op & inside)
    ops = ops[np.lexsort((tree.ts[ops], tid[ops], step[ops]))]
    lane = {int(i): k for k, i in enumerate(ops.tolist())}
    found: dict[tuple[str, tuple[int, ...], tuple[str, ...], str], list[int]] = defaultdict(list)
    for op in top:
        if names[op] == CONTIGUOUS_OP and _copied(op, children, names, gpu_launched):
            x = inputs.get(op)
            got = x.tensor(0) if x is not None else None
            consumer = _consumer(op, got[0] if got else None, ops, lane, step, tid, tree, names, inputs)
            if got is not None and consumer is not None:
                found[(CONTIGUOUS, tuple(got[0]), (got[1],), consumer)].append(op)
    wrappers = set(np.flatnonzero(node | body).tolist())
    for first, second in _round_trips(top, ops, lane, step, tid, tree, names, inputs, children, wrappers):
        cast = _cast(first, children, names, inputs)
        if cast is not None:
            found[(ROUND_TRIP, cast[0], (cast[1], cast[2]), names[first])] += [first, second]
    copies = []
    for (kind, shape, dtypes, consumer), ids in found.items():
        per = 2 if kind == ROUND_TRIP else 1
        written = nbytes(list(shape), dtypes[0]) + (nbytes(list(shape), dtypes[1]) if kind == ROUND_TRIP else 0)
        copies.append(ExtraCopy(kind=kind, shape=shape, dtypes=dtypes, consumer=consumer, ids=tuple(sorted(ids)),
                                calls=len(ids) // per, bytes=written * (len(ids) // per),
                                host_ns=int(tree.dur[ids].sum())))
    copies.sort(key=lambda c: (-c.host_ns, c.kind, c.shape))
    return ExtraCopiesResult(tuple(copies), _removed(trace, tree, [i for c in copies for i in c.ids]), True)


def _copied(op: int, children: dict[int, list[int]], names: list[str], gpu_launched: I64) -> bool:
    """A copy op under ``op`` (any depth), or GPU work launched under it."""
    stack = list(children.get(op, ()))
    while stack:
        c = stack.pop()
        if names[c] in COPYING_OPS:
            return True
        stack += children.get(c, ())
    return bool(gpu_launched[op] > 0)


def _consumer(op: int, shape: list[int] | None, ops: I64, lane: dict[int, int], step: I64, tid: I64,
              tree: HostTree, names: list[str], inputs: InputsById) -> str | None:
    """The op that read the copy when it reads strided tensors as well (READS_STRIDED: a matmul,
    an elementwise op), else None: the first op after ``op`` ends, in its step on its thread,
    that takes a tensor of the copy's shape. A view, fused attention, a custom kernel or a
    collective may need the contiguous layout: the copy is essential there."""
    if shape is None:
        return None
    end = tree.ts[op] + tree.dur[op]
    for k in range(lane[op] + 1, ops.size):
        nxt = int(ops[k])
        if (step[nxt], tid[nxt]) != (step[op], tid[op]):
            return None
        x = inputs.get(nxt)
        if tree.ts[nxt] < end or x is None or not any(
                (t := x.tensor(i)) is not None and t[0] == shape for i in range(len(x.dims))):
            continue
        if names[nxt] == CONTIGUOUS_OP:  # the next tensor's own copy (q, k, v made contiguous in a row)
            continue
        cost = estimate(names[nxt], x)
        return names[nxt] if cost is not None and cost.category in READS_STRIDED else None
    return None


def _cast(op: int, children: dict[int, list[int]], names: list[str],
          inputs: InputsById) -> tuple[tuple[int, ...], str, str] | None:
    """(shape, source dtype, destination dtype) of the write under a cast; None: it copied nothing."""
    stack = list(children.get(op, ()))
    while stack:
        c = stack.pop()
        x = inputs.get(c)
        if names[c] == WRITE_OP and x is not None:
            dst, src = x.tensor(0), x.tensor(1)
            if dst is not None and src is not None and dst[0] == src[0] and dst[1] != src[1]:
                return tuple(src[0]), src[1], dst[1]
        stack += children.get(c, ())
    return None


def _round_trips(top: list[int], ops: I64, lane: dict[int, int], step: I64, tid: I64, tree: HostTree,
                 names: list[str], inputs: InputsById,
                 children: dict[int, list[int]], wrappers: set[int]) -> list[tuple[int, int]]:
    """Pairs of casts A -> B then B -> A of one shape in a step on a thread, the second the next
    cast back after the first with only ELEMENTWISE_WORK in between (an autograd node's ranges,
    ``wrappers``, hold backward's work and are looked into); each cast pairs once."""
    casts = {op: c for op in top if names[op] in CAST_OPS and (c := _cast(op, children, names, inputs))}
    paired: set[int] = set()
    out = []
    for first in sorted(casts, key=lambda i: lane[i]):
        if first in paired:
            continue
        shape, a, b = casts[first]
        end = tree.ts[first] + tree.dur[first]
        for k in range(lane[first] + 1, ops.size):
            nxt = int(ops[k])
            if (step[nxt], tid[nxt]) != (step[first], tid[first]):
                break
            if tree.ts[nxt] < end:
                continue
            if nxt in casts and nxt not in paired and casts[nxt] == (shape, b, a):
                paired |= {first, nxt}
                out.append((first, nxt))
                break
            if nxt in wrappers:
                continue
            if not _elementwise_on(nxt, list(shape), names, inputs):
                break
            end = max(end, tree.ts[nxt] + tree.dur[nxt])  # what runs inside it is its own work
    return out


def _elementwise_on(op: int, shape: list[int], names: list[str], inputs: InputsById) -> bool:
    """``op`` takes no tensor (an autograd node's range, a factory) or is elementwise work
    (ELEMENTWISE_WORK) on a tensor of ``shape``: what may sit between the two casts of a round trip."""
    x = inputs.get(op)
    tensors = x.tensors() if x is not None else []
    if not tensors or x is None:
        return True
    cost = estimate(names[op], x)
    return cost is not None and cost.category in ELEMENTWISE_WORK and any(s == shape for s, _ in tensors)


def _removed(trace: Trace, tree: HostTree, ids: list[int]) -> tuple[int, ...]:
    if not ids:
        return ()
    mark = np.zeros(tree.parent.size, dtype=bool)
    mark[ids] = True
    host = np.flatnonzero(tree.nearest(mark) >= 0)
    s = trace.slices
    gpu = s.filter(pl.col(Col.KIND).is_in([k.value for k in GPU_ACTIVITY_KINDS])
                   & pl.col(Col.LAUNCH).is_in(host.tolist()))
    return tuple(sorted({*host.tolist(), *gpu.get_column(Col.ID).to_list()}))
