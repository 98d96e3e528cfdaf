"""FLOPs and minimum memory traffic of PyTorch operators from their recorded input shapes.

``record_shapes`` gives each op's input dims and dtypes (and, in newer PyTorch, the concrete
values of scalar arguments). From them: FLOPs of the math the op must do, and the fewest
bytes it must move (every input read once, every output written once). Those two numbers
place an op on the roofline without any hardware counter. Conventions, stated once:

- A multiply-add is 2 FLOPs. GEMM ``[M,K] @ [K,N]`` is ``2*M*N*K``; ``addmm`` adds ``M*N``
  for the bias.
- Attention forward is ``2*B*H*Nq*Nk*(d_qk + d_v)`` (QK^T then PV); causal masking halves
  it. Backward is 2.5x forward (five matmuls against two).
- Convolution is ``2 * N * C_out * prod(out_spatial) * C_in/groups * prod(kernel)``; its backward
  one convolution per gradient it computes (input, weight).
- Elementwise ops count one FLOP per output element (copies none); reductions one per
  input element; softmax 5 and normalizations 8 per element. These ops are memory-bound by
  orders of magnitude, so the FLOP count only has to be the right size.

Which operators are modelled, and where each keeps the arguments read here, is ``op_families``;
dtype sizes and shape arithmetic are ``tensor_sizes``.
"""

from __future__ import annotations

import math
from typing import Any, Final

import msgspec

from tracewhy.analyses.op_families import (
    CAUSAL_ARG,
    CONV_ARGS,
    CONV_OPS,
    COPY_FLOPS,
    COPY_OPS,
    ELEMENTWISE_OPS,
    FLASH_BNHD,
    FLASH_BNHD_BWD,
    GEMM_OPS,
    NORM_OPS,
    REDUCE_OPS,
    SDPA_BHND,
    SDPA_BHND_BWD,
    SOFTMAX_OPS,
    base_name,
    causal_from_kernel,
)
from tracewhy.analyses.op_inputs import OpInputs
from tracewhy.analyses.tensor_sizes import DTYPE_BYTES, broadcast, matmul_precision, nbytes, numel, vector_precision

SOFTMAX_FLOPS_PER_ELEMENT: Final = 5  # max, subtract, exp, sum, divide
NORM_FLOPS_PER_ELEMENT: Final = 8  # mean, variance, normalize, scale, shift (order of size)
ATTENTION_BACKWARD_FACTOR: Final = 2.5  # five matmuls (dQ, dK, dV, dP, recomputed S) vs two

GEMM: Final = "gemm"
ATTENTION: Final = "attention"
CONVOLUTION: Final = "convolution"
ELEMENTWISE: Final = "elementwise"
REDUCTION: Final = "reduction"
NORMALIZATION: Final = "normalization"
COPY: Final = "copy"


class OpCost(msgspec.Struct, frozen=True):
    """What an op must compute and move, and which peak bounds its math."""

    category: str
    flops: float
    min_bytes: float
    precision: str  # key into DevicePeaks.flop_per_s
    dtype: str
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    note: str | None = None  # an assumption the estimate had to make


def gemm_cost(m: int, n: int, k: int, dtype: str, *, batch: int = 1, bias_elems: int = 0,
              out_dtype: str | None = None) -> OpCost:
    """``batch`` GEMMs of ``[m,k] @ [k,n]``, plus a bias of ``bias_elems`` added to the output."""
    size = DTYPE_BYTES.get(dtype, 4)
    out_size = DTYPE_BYTES.get(out_dtype or dtype, size)
    flops = 2.0 * batch * m * n * k + (batch * m * n if bias_elems else 0)
    moved = batch * (m * k + k * n) * size + batch * m * n * out_size + bias_elems * size
    return OpCost(GEMM, flops, float(moved), matmul_precision(dtype), dtype,
                  {"B": batch, "M": m, "N": n, "K": k, "bias": bool(bias_elems)})


def attention_cost(batch: int, heads_q: int, seq_q: int, seq_k: int, d_qk: int, d_v: int,
                   dtype: str, *, heads_kv: int | None = None, causal: bool | None = False,
                   backward: bool = False) -> OpCost:
    """Scaled dot-product attention; ``causal=None`` means unknown and is costed as full."""
    heads_kv = heads_kv or heads_q
    flops = 2.0 * batch * heads_q * seq_q * seq_k * (d_qk + d_v)
    if causal:
        flops /= 2.0
    size = DTYPE_BYTES.get(dtype, 2)
    q = batch * heads_q * seq_q * d_qk
    kv = batch * heads_kv * seq_k * (d_qk + d_v)
    out = batch * heads_q * seq_q * d_v
    moved = (q + kv + out) * size
    if backward:
        flops *= ATTENTION_BACKWARD_FACTOR
        moved = (2 * q + 2 * kv + 2 * out) * size  # read q,k,v,o,dO; write dq,dk,dv
    note = "causal flag not recorded: costed as full attention (an upper bound)" if causal is None else None
    return OpCost(ATTENTION, flops, float(moved), matmul_precision(dtype), dtype,
                  {"B": batch, "H": heads_q, "H_kv": heads_kv, "N_q": seq_q, "N_kv": seq_k,
                   "d_qk": d_qk, "d_v": d_v, "causal": causal, "backward": backward}, note)


def conv_output(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def conv_cost(input_shape: list[int], weight_shape: list[int], dtype: str, *, stride: int | list[int],
              padding: int | list[int], dilation: int | list[int], groups: int = 1, bias: bool = False,
              transposed: bool = False) -> OpCost:
    """Convolution of ``input [N, C, *spatial]`` with ``weight [O, C/groups, *kernel]``."""
    n, c, *spatial = input_shape
    o, c_per_group, *kernel = weight_shape
    nd = len(kernel)
    stride, padding, dilation = (_expand(v, nd) for v in (stride, padding, dilation))
    if transposed:
        # weight is [C_in, C_out/groups, *k]; output = (in-1)*s - 2p + d(k-1) + 1
        o = c_per_group * groups
        c_per_group = c // groups
        out = [(x - 1) * s - 2 * p + d * (k - 1) + 1
               for x, k, s, p, d in zip(spatial, kernel, stride, padding, dilation, strict=True)]
        work = math.prod(spatial)  # each input pixel scatters into a kernel window
        flops = 2.0 * n * c * work * (o // groups) * math.prod(kernel)
    else:
        out = [conv_output(x, k, s, p, d)
               for x, k, s, p, d in zip(spatial, kernel, stride, padding, dilation, strict=True)]
        flops = 2.0 * n * o * math.prod(out) * c_per_group * math.prod(kernel)
    if bias:
        flops += n * o * math.prod(out)
    size = DTYPE_BYTES.get(dtype, 4)
    moved = (numel(input_shape) + numel(weight_shape) + n * o * math.prod(out) + (o if bias else 0)) * size
    return OpCost(CONVOLUTION, flops, float(moved), matmul_precision(dtype), dtype,
                  {"N": n, "C_in": c, "C_out": o, "in": spatial, "out": out, "kernel": kernel,
                   "stride": stride, "padding": padding, "dilation": dilation, "groups": groups})


def _expand(value: Any, n: int) -> list[int]:
    if isinstance(value, int):
        return [value] * n
    values = [int(v) for v in value] if isinstance(value, (list, tuple)) else [1]
    return values * n if len(values) == 1 else values


def estimate(op_name: str, inputs: OpInputs, *, kernel_name: str | None = None) -> OpCost | None:
    """FLOPs and minimum bytes of one op call, or None when the op or its shapes are not modelled."""
    base = base_name(op_name)
    try:
        if base in GEMM_OPS:
            return _gemm(base, inputs)
        if base in FLASH_BNHD or base in SDPA_BHND or base in FLASH_BNHD_BWD or base in SDPA_BHND_BWD:
            return _attention(base, inputs, kernel_name)
        if base in CONV_OPS:
            return _conv(base, inputs)
        if base == "convolution_backward":
            return _conv_backward(inputs)
        if base in NORM_OPS:
            return _pointwise(inputs, NORMALIZATION, NORM_FLOPS_PER_ELEMENT, same_shape_out=True)
        if base in SOFTMAX_OPS:
            return _pointwise(inputs, REDUCTION, SOFTMAX_FLOPS_PER_ELEMENT, same_shape_out=True)
        if base in REDUCE_OPS:
            return _reduction(inputs)
        if base == "cat" or base == "stack":
            return _cat(inputs)
        if base in ("index_select", "embedding"):
            return _gather(base, inputs)
        if base in COPY_OPS or base in ELEMENTWISE_OPS:
            return _elementwise(base, op_name, inputs)
    except (ValueError, IndexError, TypeError, ZeroDivisionError):
        return None
    return None


def _gemm(base: str, x: OpInputs) -> OpCost | None:
    if base in ("mm", "_scaled_mm"):
        a, b = x.tensor(0), x.tensor(1)
        if a and b and len(a[0]) == 2 and len(b[0]) == 2:
            (m, k), (_, n) = a[0], b[0]
            return gemm_cost(m, n, k, a[1])
        return None
    if base in ("addmm", "baddbmm", "addbmm"):
        bias, a, b = x.tensor(0), x.tensor(1), x.tensor(2)
        if not (a and b):
            return None
        bias_elems = numel(bias[0]) if bias else 0
        if base == "addmm" and len(a[0]) == 2 and len(b[0]) == 2:
            (m, k), (_, n) = a[0], b[0]
            return gemm_cost(m, n, k, a[1], bias_elems=max(bias_elems, 1) if bias else 0)
        if len(a[0]) == 3 and len(b[0]) == 3:
            (bt, m, k), (_, _, n) = a[0], b[0]
            return gemm_cost(m, n, k, a[1], batch=bt, bias_elems=bias_elems)
        return None
    if base == "bmm":
        a, b = x.tensor(0), x.tensor(1)
        if a and b and len(a[0]) == 3 and len(b[0]) == 3:
            (bt, m, k), (_, _, n) = a[0], b[0]
            return gemm_cost(m, n, k, a[1], batch=bt)
        return None
    if base in ("mv", "addmv"):
        off = 1 if base == "addmv" else 0
        a = x.tensor(off)
        if a and len(a[0]) == 2:
            m, k = a[0]
            return gemm_cost(m, 1, k, a[1])
        return None
    if base == "linear":
        a, w, bias = x.tensor(0), x.tensor(1), x.tensor(2)
        if a and w and len(w[0]) == 2:
            n, k = w[0]
            m = numel(a[0][:-1])
            return gemm_cost(m, n, k, a[1], bias_elems=numel(bias[0]) if bias else 0)
        return None
    if base == "matmul":
        a, b = x.tensor(0), x.tensor(1)
        if not (a and b) or len(a[0]) < 2 or len(b[0]) < 1:
            return None
        if len(b[0]) == 1:
            return gemm_cost(numel(a[0][:-1]), 1, a[0][-1], a[1])
        if len(b[0]) == 2:
            return gemm_cost(numel(a[0][:-1]), b[0][-1], a[0][-1], a[1])
        batch = numel(broadcast(a[0][:-2], b[0][:-2]))
        return gemm_cost(a[0][-2], b[0][-1], a[0][-1], a[1], batch=batch)
    return None


def _attention(base: str, x: OpInputs, kernel_name: str | None) -> OpCost | None:
    q, k, v = x.tensor(0), x.tensor(1), x.tensor(2)
    backward = base in FLASH_BNHD_BWD or base in SDPA_BHND_BWD
    if backward:  # (grad_out, query, key, value, out, ...)
        q, k, v = x.tensor(1), x.tensor(2), x.tensor(3)
    if not (q and k and v) or len(q[0]) != 4 or len(k[0]) != 4 or len(v[0]) != 4:
        return None
    if base in FLASH_BNHD or base in FLASH_BNHD_BWD:  # (batch, seqlen, heads, head_dim)
        b, nq, hq, dqk = q[0]
        _, nk, hk, _ = k[0]
        dv = v[0][3]
    else:  # (batch, heads, seqlen, head_dim)
        b, hq, nq, dqk = q[0]
        _, hk, nk, _ = k[0]
        dv = v[0][3]
    causal: bool | None = None
    pos = CAUSAL_ARG.get(base)
    if pos is not None:
        flag = x.value(pos)
        if isinstance(flag, bool):
            causal = flag
    if base == "_efficient_attention_forward":
        mask_type = x.value(9)  # custom_mask_type: 0 none, 1/2 causal (top-left / bottom-right)
        if isinstance(mask_type, int):
            causal = mask_type != 0
    if causal is None and kernel_name:
        causal = causal_from_kernel(kernel_name)
    return attention_cost(b, hq, nq, nk, dqk, dv, q[1], heads_kv=hk, causal=causal, backward=backward)


def _conv(base: str, x: OpInputs) -> OpCost | None:
    inp, weight = x.tensor(0), x.tensor(1)
    spec = CONV_ARGS.get(base)
    if not (inp and weight) or spec is None or len(inp[0]) < 3:
        return None
    bias_i, stride_i, pad_i, dil_i, trans_i, groups_i = spec
    stride, padding, dilation = x.value(stride_i), x.value(pad_i), x.value(dil_i)
    if stride is None or padding is None:
        return None  # without stride and padding the output size is unknown: no estimate
    groups = x.value(groups_i)
    transposed = x.value(trans_i) if trans_i is not None else False
    bias = x.tensor(bias_i) is not None if bias_i is not None else False
    return conv_cost(inp[0], weight[0], inp[1], stride=stride, padding=padding,
                     dilation=dilation if dilation is not None else 1,
                     groups=groups if isinstance(groups, int) else 1, bias=bias,
                     transposed=bool(transposed))


def _conv_backward(x: OpInputs) -> OpCost | None:
    """One convolution per gradient the op computes (input, weight: ``output_mask``), as
    ``torch.utils.flop_counter`` counts it; its arguments past grad_output are laid out as
    ``convolution``'s (input, weight, bias sizes, stride, padding, dilation, transposed, ...)."""
    forward = _conv("convolution", OpInputs(x.dims[1:], x.types[1:], x.concrete[1:] if x.concrete else None))
    mask = x.value(10)
    grads = sum(bool(m) for m in mask[:2]) if isinstance(mask, list) else 2
    if forward is None or grads == 0:
        return None
    return msgspec.structs.replace(forward, flops=forward.flops * grads, min_bytes=forward.min_bytes * grads,
                                   params={**forward.params, "backward": True, "gradients": grads})


def _pointwise(x: OpInputs, category: str, flops_per_elem: int, *, same_shape_out: bool) -> OpCost | None:
    tensors = x.tensors()
    if not tensors:
        return None
    main, dtype = tensors[0]
    moved = sum(nbytes(s, d) for s, d in tensors) + (nbytes(main, dtype) if same_shape_out else 0)
    return OpCost(category, float(flops_per_elem * numel(main)), float(moved),
                  vector_precision(dtype), dtype, {"shape": main})


def _reduction(x: OpInputs) -> OpCost | None:
    t = x.tensor(0)
    if not t:
        return None
    return OpCost(REDUCTION, float(numel(t[0])), float(nbytes(*t)), vector_precision(t[1]), t[1],
                  {"shape": t[0]}, "output size not recorded; counted as negligible")


def _cat(x: OpInputs) -> OpCost | None:
    lists = x.dims[0] if x.dims and isinstance(x.dims[0], list) else []
    shapes = [s for s in lists if isinstance(s, list) and all(isinstance(v, int) for v in s)]
    if not shapes:
        return None
    # TensorList carries no per-tensor dtype; the op's output has the inputs' common dtype.
    moved = 2 * sum(numel(s) for s in shapes)
    return OpCost(COPY, 0.0, float(moved * 2), "fp32", "unknown", {"inputs": len(shapes)},
                  "TensorList dtype not recorded; 2 bytes per element assumed")


def _gather(base: str, x: OpInputs) -> OpCost | None:
    if base == "embedding":
        w, idx = x.tensor(0), x.tensor(1)
        if not (w and idx):
            return None
        out = numel(idx[0]) * w[0][-1]
        moved = 2 * out * DTYPE_BYTES[w[1]] + nbytes(*idx)
        return OpCost(COPY, 0.0, float(moved), vector_precision(w[1]), w[1], {"rows": numel(idx[0])})
    src, idx = x.tensor(0), x.tensor(2)
    if not (src and idx):
        return None
    dim = x.value(1)
    dim = dim if isinstance(dim, int) else 0
    out_shape = list(src[0])
    out_shape[dim] = numel(idx[0])
    moved = 2 * nbytes(out_shape, src[1]) + nbytes(*idx)
    return OpCost(COPY, 0.0, float(moved), vector_precision(src[1]), src[1], {"shape": out_shape},
                  None if x.value(1) is not None else "dim not recorded; dim 0 assumed")


def _elementwise(base: str, name: str, x: OpInputs) -> OpCost | None:
    tensors = x.tensors()
    if not tensors:
        return None
    in_place = name.split("::", 1)[-1].endswith("_") and not name.endswith("__")
    out_shape = broadcast(*(s for s, _ in tensors))
    dtype = tensors[0][1]
    if in_place:
        # The first argument is the output: copy_/fill_ only write it, others read and write it.
        reads = sum(nbytes(s, d) for s, d in tensors[1:])
        if base not in ("copy", "fill", "zero"):
            reads += nbytes(*tensors[0])
        moved = reads + nbytes(*tensors[0])
    else:
        moved = sum(nbytes(s, d) for s, d in tensors) + nbytes(out_shape, dtype)
    flops = 0.0 if base in COPY_FLOPS else float(numel(out_shape))
    category = COPY if base in COPY_FLOPS else ELEMENTWISE
    return OpCost(category, flops, float(moved), vector_precision(dtype), dtype, {"shape": out_shape})
