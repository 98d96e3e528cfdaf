"""Known training-loop mistakes read off one trace's structure: an optimizer that runs its
update once per parameter (no multi-tensor op under ``Optimizer.step``), gradients zeroed
rather than set to None (zeroing ops under ``Optimizer.zero_grad``), a convolution whose
bias feeds a batch norm directly (the norm's mean subtraction cancels it), a tensor made on the
host only to be copied to the device (a factory op whose output the next op copies HtoD), and
half-precision GEMMs whose K or N is not a multiple of 8. Each is measured here (calls,
per-call repetition, shapes, the slices involved); ``findings/anti_patterns.py`` judges and
prices them with the step account's prediction.

What decides is nesting (the ops an optimizer block holds, the outermost op a Python line
called), repetition counts per block call, the ops' recorded input types and shapes (a
``TensorList`` input is a multi-tensor op; a bias is a convolution's third input with a
shape), and program order on a thread (the op that directly follows). Names only find the
blocks and ops it reasons about, each list below with its source.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import dataclass
from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.host_tree import HostTree
from tracewhy.analyses.name_codes import NameCodes, decide, distinct_names
from tracewhy.analyses.op_inputs import OpInputs
from tracewhy.analyses.shapes import GEMM, estimate
from tracewhy.analyses.tensor_sizes import matmul_precision
from tracewhy.analyses.what_if_host_edits import ZEROING_OPS
from tracewhy.model.schema import Col, CopyAttrCol, Kind, OpAttrCol
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]

#: The input type the profiler records for a list of tensors (record_shapes): a multi-tensor
#: (``torch._foreach_*``) or fused (``torch._fused_adam_``) op takes all parameters in one.
TENSOR_LIST: Final = "TensorList"
#: Name parts of the multi-tensor and fused optimizer ops (aten/src/ATen/native/ForeachOpsKernels.cpp,
#: FusedAdam.cpp), for traces captured without record_shapes (no input types to read).
MULTI_TENSOR_NAMES: Final = ("_foreach_", "_fused_")
#: The kernel every multi-tensor update launches: PyTorch's aten/src/ATen/native/cuda/
#: MultiTensorApply.cuh and apex's csrc/multi_tensor_apply.cuh (apex and DeepSpeed FusedAdam,
#: which call it from an extension, with no aten op around it) both name it so.
MULTI_TENSOR_KERNEL: Final = "multi_tensor_apply_kernel"
#: The convolution ops a Python line calls (torch/nn/modules/conv.py calls F.conv1d/2d/3d;
#: ``aten::convolution`` where a model calls it itself). Their third input is the bias.
CONV_OPS: Final = frozenset({"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution",
                             "aten::_convolution"})
#: The batch norm a Python line calls (torch/nn/functional.py's batch_norm -> ``torch.batch_norm``).
BATCH_NORM_OPS: Final = frozenset({"aten::batch_norm"})
#: torch's creation ops that give a tensor values (the "Creation Ops" of torch's docs;
#: ``torch.tensor(data)`` records ``aten::lift_fresh`` since PyTorch 1.13, ``aten::tensor``
#: before): what a step builds a fresh host tensor with. ``torch.empty`` is not one: an empty
#: tensor next to a copy is the copy's destination (a device buffer), not data made on the host.
FACTORY_OPS: Final = frozenset({
    "aten::tensor", "aten::lift_fresh", "aten::scalar_tensor", "aten::ones", "aten::zeros", "aten::full",
    "aten::rand", "aten::randn", "aten::randint", "aten::randperm", "aten::normal", "aten::arange",
    "aten::linspace", "aten::logspace", "aten::eye", "aten::ones_like", "aten::zeros_like", "aten::full_like",
    "aten::rand_like", "aten::randn_like", "aten::randint_like"})
#: The GEMM ops that launch the matrix-multiply kernels (``aten::linear`` and ``aten::matmul``
#: call them, so each GEMM is counted once, where its shapes are read by ``shapes.estimate``).
LAUNCHING_GEMMS: Final = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
#: The peak ``tensor_sizes.matmul_precision`` gives a 16-bit (fp16, bf16) matrix multiply.
HALF_PRECISION: Final = "fp16_tensor"
#: cuBLAS's tensor-core GEMMs want every leading dimension a multiple of 16 bytes: 8 elements of
#: 16 bits (cuBLAS docs, "Tensor Core Usage"; NVIDIA's Deep Learning Performance guide, "Matrix
#: Multiplication Background"). K and N are the leading dimensions of row-major A[M,K], B[K,N], C[M,N].
GEMM_ALIGN_ELEMENTS: Final = 8
#: Bias index of CONV_OPS' inputs (input, weight, bias, ...).
_BIAS_INPUT: Final = 2


class OptimizerBlock(msgspec.Struct, frozen=True):
    """One kind of optimizer call (``Optimizer.step#Adam.step``) and what its calls hold."""

    name: str
    calls: int
    ids: tuple[int, ...]  # the block slices
    ops: tuple[int, ...]  # the outermost ops inside them
    #: Per op name, its calls per block call (the ops repeated most first).
    per_call: tuple[tuple[str, float], ...]
    #: Some op inside takes a TensorList (or is named a multi-tensor or fused op).
    multi_tensor: bool
    #: Per block call, what the ops that zero gradients write (ZEROING_OPS outermost): tensors zeroed.
    zeroed_per_call: float

    @property
    def repeated_per_call(self) -> float:
        """The most calls per block call of any one op: one per parameter on a per-parameter loop."""
        return self.per_call[0][1] if self.per_call else 0.0

    @property
    def is_step(self) -> bool:
        return api_names.is_optimizer_step(self.name)


class ConvBias(msgspec.Struct, frozen=True):
    """Convolutions with a bias whose next op on their thread is a batch norm over their output."""

    conv: str
    norm: str
    calls: int
    channels: int
    conv_ids: tuple[int, ...]
    norm_ids: tuple[int, ...]


class HostBuiltCopy(msgspec.Struct, frozen=True):
    """A host tensor a factory op makes whose next op on its thread copies it to the device
    (an HtoD copy launched under that op), the copy's input shaped as the factory's fill wrote
    it where the trace records shapes."""

    factory: str
    copy_op: str
    shape: tuple[int, ...] | None  # None: the trace records no shape to match
    factory_ids: tuple[int, ...]
    copy_ids: tuple[int, ...]  # the outermost copy ops
    bytes: int  # the HtoD copies' bytes, all calls


class UnalignedGemm(msgspec.Struct, frozen=True):
    """Half-precision GEMM calls of one op and shape whose K or N is not a multiple of 8."""

    op: str
    dtype: str
    m: int
    k: int
    n: int
    ids: tuple[int, ...]
    kernel_ns: int  # the GPU time of the kernels they launched, all calls


@dataclass(frozen=True)
class AntiPatternsResult:
    optimizer: tuple[OptimizerBlock, ...]
    conv_bias: tuple[ConvBias, ...]
    host_built: tuple[HostBuiltCopy, ...]
    unaligned_gemms: tuple[UnalignedGemm, ...]
    #: The trace records input shapes and types (record_shapes): without them no conv-bias verdict.
    has_shapes: bool


def anti_patterns(trace: Trace, tree: HostTree | None = None) -> AntiPatternsResult:
    """``tree``: the trace's ``HostTree``, when the caller has it (a diagnosis does)."""
    s = trace.slices
    tree = tree if tree is not None else HostTree.of(trace)
    # A string per distinct name, shared by its rows (a string per slice was 0.6 GB for the 8 M
    # slices of a large export).
    column = s.get_column(Col.NAME)
    names: list[str] = NameCodes.of(column).spread(*distinct_names(column), None, object).tolist()
    attrs = trace.op_attrs
    types = dict(attrs.select(OpAttrCol.ID, OpAttrCol.INPUT_TYPES).drop_nulls().iter_rows())
    dims = dict(attrs.select(OpAttrCol.ID, OpAttrCol.INPUT_DIMS).drop_nulls().iter_rows())
    return AntiPatternsResult(optimizer=_optimizer_blocks(trace, tree, names, types, dims),
                              conv_bias=_conv_bias(trace, tree, names, dims),
                              host_built=_host_built(trace, tree, names, dims),
                              unaligned_gemms=_unaligned_gemms(trace, tree, names, types, dims), has_shapes=bool(types))


def _optimizer_blocks(trace: Trace, tree: HostTree, names: list[str], types: dict[int, str],
                      dims: dict[int, str]) -> tuple[OptimizerBlock, ...]:
    # Each distinct annotation name tested once (a test per row was 0.03 s on an nsys export of
    # 17 k ranges, nearly all of them distinct op ranges).
    s = trace.slices
    is_annotation = s.get_column(Col.KIND) == Kind.ANNOTATION.value
    annotation_names = s.get_column(Col.NAME).filter(is_annotation).unique().drop_nulls().cast(pl.String)
    texts = annotation_names.to_list()
    is_block = decide(texts, api_names.is_optimizer, api_names.PRETESTS[api_names.is_optimizer], False)
    block_names = [n for n, yes in zip(texts, is_block, strict=True) if yes]
    if not block_names:
        return ()
    block = (is_annotation & s.get_column(Col.NAME).is_in(block_names)).fill_null(False).to_numpy()
    kind = s.get_column(Col.KIND).to_numpy()
    at = tree.nearest(block, strict=True)
    outermost = tree.outermost_op
    launch = trace.slices.get_column(Col.LAUNCH).fill_null(-1).to_numpy()
    kernels = np.flatnonzero((kind == Kind.KERNEL.value) & (launch >= 0))
    out = []
    for name in sorted({names[i] for i in np.flatnonzero(block).tolist()}):
        ids = np.array([i for i in np.flatnonzero(block).tolist() if names[i] == name], dtype=np.int64)
        inside_ops = np.flatnonzero(tree.is_op & np.isin(at, ids))
        ops = inside_ops[outermost[inside_ops]]
        counts = Counter(names[i] for i in ops.tolist())
        per_call = tuple(sorted(((n, c / ids.size) for n, c in counts.items()), key=lambda kv: (-kv[1], kv[0])))
        multi = any(TENSOR_LIST in types.get(i, "") or any(p in names[i] for p in MULTI_TENSOR_NAMES)
                    for i in inside_ops.tolist()) or any(MULTI_TENSOR_KERNEL in names[k] for k in
                                                         kernels[np.isin(at[launch[kernels]], ids)].tolist())
        zeroed = sum(_tensors(dims.get(i)) for i in ops.tolist() if names[i] in ZEROING_OPS)
        out.append(OptimizerBlock(name=name, calls=int(ids.size), ids=tuple(ids.tolist()), ops=tuple(ops.tolist()),
                                  per_call=per_call, multi_tensor=multi, zeroed_per_call=zeroed / ids.size))
    return tuple(out)


def _tensors(dims: str | None) -> int:
    """Tensors an op's first input holds: a TensorList's length, else one."""
    first = _parse(dims)[0] if _parse(dims) else []
    return len(first) if first and isinstance(first[0], list) else 1


def _parse(dims: str | None) -> list[list[object]]:
    if not dims:
        return []
    try:
        value = json.loads(dims)
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _conv_bias(trace: Trace, tree: HostTree, names: list[str], dims: dict[int, str]) -> tuple[ConvBias, ...]:
    """Each convolution (outermost op) with a shaped bias input whose output next goes to a batch
    norm: the first later outermost op on its thread whose first input is shaped like that output
    (the input's rank and batch size, the bias's channels) is a batch norm. (BatchNorm2d's own
    ``num_batches_tracked.add_(1)`` runs in between: an op on a 0-d tensor, not on the output.)"""
    s = trace.slices
    outer = np.flatnonzero(tree.outermost_op)
    if outer.size == 0 or not dims:
        return ()
    pid = s.get_column(Col.PID).fill_null(-1).to_numpy()[outer]
    tid = s.get_column(Col.TID).fill_null(-1).to_numpy()[outer]
    order = np.lexsort((tree.ts[outer], tid, pid))
    outer, pid, tid = outer[order], pid[order], tid[order]
    found: dict[tuple[str, str, int], tuple[list[int], list[int]]] = {}
    for k in np.flatnonzero([names[i] in CONV_OPS for i in outer.tolist()]).tolist():
        conv = int(outer[k])
        conv_in = _parse(dims.get(conv))
        if len(conv_in) <= _BIAS_INPUT or len(conv_in[_BIAS_INPUT]) != 1 or len(conv_in[0]) < 2:
            continue
        x, channels = conv_in[0], conv_in[_BIAS_INPUT][0]
        j = k + 1
        while j < outer.size and (pid[j], tid[j]) == (pid[k], tid[k]):
            first = (_parse(dims.get(int(outer[j]))) or [[]])[0]
            if len(first) == len(x) and first[0] == x[0] and first[1] == channels:
                break
            j += 1
        if j >= outer.size or (pid[j], tid[j]) != (pid[k], tid[k]) or names[int(outer[j])] not in BATCH_NORM_OPS:
            continue
        got = found.setdefault((names[conv], names[int(outer[j])], int(str(channels))), ([], []))
        got[0].append(conv)
        got[1].append(int(outer[j]))
    return tuple(ConvBias(conv=c, norm=n, calls=len(v[0]), channels=ch, conv_ids=tuple(v[0]), norm_ids=tuple(v[1]))
                 for (c, n, ch), v in sorted(found.items()))


def _host_built(trace: Trace, tree: HostTree, names: list[str], dims: dict[int, str]) -> tuple[HostBuiltCopy, ...]:
    """Each outermost op that launched an HtoD copy and directly follows, on its thread, a factory
    op (FACTORY_OPS) whose fill (the op inside it with the largest recorded first input) has the
    shape of the copy op's input; without recorded shapes, the order alone decides."""
    s = trace.slices
    copies = trace.copy_attrs.filter(pl.col(CopyAttrCol.COPY_KIND) == "HtoD")
    if copies.height == 0:
        return ()
    moved = dict(copies.select(CopyAttrCol.ID, CopyAttrCol.BYTES).iter_rows())
    launch = s.get_column(Col.LAUNCH).fill_null(-1).to_numpy()
    outermost = tree.outermost_op
    top = tree.nearest(outermost)
    by_op: dict[int, int] = {}
    for copy in moved:
        call = int(launch[copy])
        op = int(top[call]) if call >= 0 else -1
        if op >= 0:
            by_op[op] = by_op.get(op, 0) + int(moved[copy] or 0)
    if not by_op:
        return ()
    pid = s.get_column(Col.PID).fill_null(-1).to_numpy()
    tid = s.get_column(Col.TID).fill_null(-1).to_numpy()
    outer = np.flatnonzero(outermost)
    outer = outer[np.lexsort((tree.ts[outer], tid[outer], pid[outer]))]
    before = {int(b): int(a) for a, b in itertools.pairwise(outer)
              if (pid[a], tid[a]) == (pid[b], tid[b])}
    fills = _fill_shapes(tree, dims)
    inclusive = tree.inclusive(tree.gpu_self)
    found: dict[tuple[str, str, tuple[int, ...] | None], tuple[list[int], list[int], int]] = {}
    for op, nbytes in sorted(by_op.items()):
        factory = before.get(op, -1)
        # A factory that launched GPU work made its tensor on the device.
        if factory < 0 or names[factory] not in FACTORY_OPS or inclusive[factory] > 0:
            continue
        copied = (_parse(dims.get(op)) or [[]])[0]
        made = fills.get(factory)
        if copied and made is not None and list(made) != copied:
            continue
        shape = tuple(int(str(d)) for d in copied) if copied else None
        got = found.setdefault((names[factory], names[op], shape), ([], [], 0))
        got[0].append(factory)
        got[1].append(op)
        found[(names[factory], names[op], shape)] = (got[0], got[1], got[2] + nbytes)
    return tuple(HostBuiltCopy(factory=f, copy_op=c, shape=shape, factory_ids=tuple(v[0]), copy_ids=tuple(v[1]),
                               bytes=v[2]) for (f, c, shape), v in sorted(found.items(), key=lambda kv: str(kv[0])))


def _fill_shapes(tree: HostTree, dims: dict[int, str]) -> dict[int, tuple[int, ...]]:
    """Per outermost op, the largest first input recorded on an op inside it (a factory's fill:
    ``aten::normal_`` under ``aten::randn``, ``aten::fill_`` under ``aten::ones``)."""
    owner = tree.nearest(tree.outermost_op, strict=True)
    out: dict[int, tuple[int, ...]] = {}
    shapes: dict[str, tuple[int, ...] | None] = {}  # (a text once: most ops repeat another's dims)
    for op, text in dims.items():
        above = int(owner[op]) if op < owner.size else -1
        if above < 0:
            continue
        if text not in shapes:
            first = (_parse(text) or [[]])[0]
            shapes[text] = tuple(int(str(d)) for d in first) \
                if first and all(isinstance(d, int) for d in first) else None
        shape = shapes[text]
        if shape is not None and len(shape) > len(out.get(above, ())):
            out[above] = shape
    return out


def _unaligned_gemms(trace: Trace, tree: HostTree, names: list[str], types: dict[int, str],
                     dims: dict[int, str]) -> tuple[UnalignedGemm, ...]:
    """GEMM calls (LAUNCHING_GEMMS, shapes read by ``shapes.estimate``) on 16-bit inputs that
    launched GPU work, whose K or N is not a multiple of GEMM_ALIGN_ELEMENTS; M, the rows of the
    batch, sets no leading dimension and is left alone; a matrix-vector product (M or N of 1) has
    no tile to align."""
    inclusive = tree.inclusive(tree.gpu_self)  # GPU time of the work each slice launched, nested included
    found: dict[tuple[str, str, int, int, int], tuple[list[int], int]] = {}
    for op, text in types.items():
        if op >= len(names) or names[op] not in LAUNCHING_GEMMS or inclusive[op] <= 0:
            continue
        inputs = OpInputs.parse(dims.get(op), text)
        cost = estimate(names[op], inputs) if inputs is not None else None
        if cost is None or cost.category != GEMM or matmul_precision(cost.dtype) != HALF_PRECISION:
            continue
        m, k, n = (int(cost.params[key]) for key in ("M", "K", "N"))
        if (k % GEMM_ALIGN_ELEMENTS == 0 and n % GEMM_ALIGN_ELEMENTS == 0) or 1 in (m, n):
            continue
        key = (names[op], cost.dtype, m, k, n)
        ids, ns = found.get(key, ([], 0))
        found[key] = ([*ids, op], ns + int(inclusive[op]))
    return tuple(UnalignedGemm(op=o, dtype=d, m=m, k=k, n=n, ids=tuple(v[0]), kernel_ns=v[1])
                 for (o, d, m, k, n), v in sorted(found.items(), key=lambda kv: -kv[1][1]))
