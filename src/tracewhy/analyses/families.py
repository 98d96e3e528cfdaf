"""Coarse kernel families by name: the one place where kernel-name rules live.

Rules are tried in order; the first match wins. Names are matched lower-cased. Communication
comes first so that e.g. ``ncclDevKernel_ReduceScatter`` is not taken for a reduction.
"""

from __future__ import annotations

import re
from enum import Enum
from functools import lru_cache


class Family(str, Enum):
    COMMUNICATION = "communication"
    COPY = "copy/memset"
    ATTENTION = "attention"
    GEMM = "gemm"
    CONVOLUTION = "convolution"
    NORMALIZATION = "normalization"
    REDUCTION = "reduction"
    ELEMENTWISE = "elementwise"
    OTHER = "other"


_RULES: tuple[tuple[Family, re.Pattern[str]], ...] = tuple(
    (family, re.compile(pattern))
    for family, pattern in (
        # NCCL (ncclKernel_* before 2.19, ncclDevKernel_* after), RCCL, symmetric-memory
        # all-reduce (multimem_*, vLLM / torch symm_mem), custom all-reduce, gloo has no kernels.
        (Family.COMMUNICATION, r"nccl|rccl|multimem|all_?reduce|allgather|all_gather|reduce_scatter"
                               r"|alltoall|all_to_all|cross_device_reduce|sendrecv|broadcast_kernel"),
        (Family.COPY, r"^memcpy|^memset|direct_copy_kernel|copy_kernel|catarraybatchedcopy|"
                      r"cudamemcpy|hipmemcpy|__amd_rocclr_copy|__amd_rocclr_fill|fillbuffer"),
        (Family.ATTENTION, r"flash|fmha|attention|attn|sdpa|paged_attention|softmax_warp"
                           r"|cutlass.*mha|xformers"),
        # Implicit-GEMM convolutions carry "gemm" in their names: match convolution first.
        (Family.CONVOLUTION, r"conv|winograd|fprop|dgrad|wgrad"),
        (Family.GEMM, r"gemm|sgemm|hgemm|dgemm|matmul|cublas|cutlass|wgmma|nvjet|ampere_.*_nn|"
                      r"ampere_.*_tn|ampere_.*_nt|volta_.*_nn|sm\d+_xmma_gemm|ck_tile.*gemm|"
                      r"tensile|cijk_|hipblaslt|triton_.*mm|_mm_|bmm"),
        (Family.NORMALIZATION, r"norm|bn_fw|bn_bw|layer_norm|batch_norm|rms|welford|group_norm"),
        (Family.CONVOLUTION, r"cudnn|miopen|fft"),
        (Family.REDUCTION, r"reduce|softmax|sum_kernel|argmax|argmin|topk|sort|scan|cumsum|"
                           r"max_kernel|min_kernel|mean_kernel|per_row|triton_red_|triton_per_"),
        (Family.ELEMENTWISE, r"elementwise|vectorized|unrolled|pointwise|triton_poi_|fill_kernel|"
                             r"index_kernel|scatter|gather|act_and_mul|silu|gelu|relu|rotary|"
                             r"quant|cast|where|add_kernel|mul_kernel|clamp"),
    )
)


@lru_cache(maxsize=65536)
def kernel_family(name: str) -> Family:
    """The family of a kernel or GPU activity name."""
    low = name.lower()
    for family, pattern in _RULES:
        if pattern.search(low):
            return family
    return Family.OTHER


# --- collectives ------------------------------------------------------------------------------
# PyTorch >= 1.13 wraps each process-group call in a ``<backend>:<op>`` range (Kineto
# user_annotation; with emit_nvtx nsys shows it as "nccl:all_reduce, op_id = N").
_COLLECTIVE_RANGE = re.compile(r"^(nccl|gloo|mpi|ucc|xccl|hccl|rccl|mccl):([A-Za-z_]+)")
# Normalized op per spelling, tried in order on the name lower-cased with non-letters removed:
# "all_reduce" (ranges), "allreduce" (record_param_comms' Collective name), "AllReduce"
# (ncclKernel_AllReduce_*, ncclDevKernel_AllReduce_*), "multimem_all_reduce" (symm_mem).
_COLLECTIVE_OPS: tuple[tuple[str, str], ...] = (
    ("allreduce", "all_reduce"),
    ("reducescatter", "reduce_scatter"),
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("sendrecv", "send_recv"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("reduce", "reduce"),
    ("send", "send"),
    ("recv", "recv"),
)
_NON_LETTERS = re.compile(r"[^a-z]")


@lru_cache(maxsize=8192)
def collective_op(name: str) -> str | None:
    """The collective a name stands for (``all_reduce``, ``all_gather``...), None if none.

    Works on range names, record_param_comms' collective names and communication kernel
    names alike, so the same collective gets the same op whichever of them a trace has.
    """
    letters = _NON_LETTERS.sub("", name.lower())
    for token, op in _COLLECTIVE_OPS:
        if token in letters:
            return op
    return None


@lru_cache(maxsize=8192)
def collective_range(name: str) -> tuple[str, str] | None:
    """(backend, op) of a process-group range such as ``nccl:all_reduce``; None otherwise."""
    m = _COLLECTIVE_RANGE.match(name)
    if m is None:
        return None
    return m.group(1), collective_op(m.group(2)) or m.group(2).strip("_")
