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
