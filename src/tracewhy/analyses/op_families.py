"""The operators ``shapes.estimate`` models, by family, and where each keeps the arguments the
estimate reads (is_causal, a convolution's stride, padding and groups), as PyTorch declares them
in aten's native_functions.yaml; and the causal flag a FlashAttention kernel's name carries.
"""

from __future__ import annotations

import re
from typing import Final

# Operator families by name (aten:: stripped, trailing "_" for in-place stripped).
GEMM_OPS: Final = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm",
                             "addmv", "mv", "addbmm"})
FLASH_BNHD: Final = frozenset({"_flash_attention_forward", "_efficient_attention_forward"})
FLASH_BNHD_BWD: Final = frozenset({"_flash_attention_backward", "_efficient_attention_backward"})
SDPA_BHND: Final = frozenset({
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable",
})
SDPA_BHND_BWD: Final = frozenset({
    "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward", "_scaled_dot_product_flash_attention_for_cpu_backward",
})
#: Position of is_causal among each attention op's arguments (aten native_functions.yaml).
CAUSAL_ARG: Final = {
    "scaled_dot_product_attention": 5, "_scaled_dot_product_flash_attention": 4,
    "_scaled_dot_product_efficient_attention": 6, "_scaled_dot_product_cudnn_attention": 6,
    "_flash_attention_forward": 8, "_scaled_dot_product_flash_attention_backward": 10,
    "_flash_attention_backward": 10, "_scaled_dot_product_flash_attention_for_cpu": 4,
    "_scaled_dot_product_flash_attention_for_cpu_backward": 7,
    "_scaled_dot_product_efficient_attention_backward": 11,
}
CONV_OPS: Final = frozenset({"convolution", "_convolution", "conv1d", "conv2d", "conv3d",
                             "cudnn_convolution", "miopen_convolution", "conv_transpose1d",
                             "conv_transpose2d", "conv_transpose3d", "convolution_overrideable"})
NORM_OPS: Final = frozenset({"native_layer_norm", "layer_norm", "native_group_norm", "group_norm",
                             "native_batch_norm", "_native_batch_norm_legit", "batch_norm",
                             "cudnn_batch_norm", "miopen_batch_norm", "_batch_norm_impl_index",
                             "rms_norm", "_fused_rms_norm", "instance_norm",
                             "native_layer_norm_backward", "native_group_norm_backward",
                             "native_batch_norm_backward", "cudnn_batch_norm_backward"})
SOFTMAX_OPS: Final = frozenset({"softmax", "_softmax", "log_softmax", "_log_softmax",
                                "_softmax_backward_data", "_log_softmax_backward_data"})
REDUCE_OPS: Final = frozenset({"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin",
                               "norm", "linalg_vector_norm", "var", "std", "var_mean", "std_mean",
                               "all", "any", "prod", "logsumexp", "cumsum", "topk", "sort"})
COPY_OPS: Final = frozenset({"copy", "_to_copy", "to", "clone", "contiguous", "fill", "zero",
                             "index_select", "embedding", "cat", "stack", "index", "gather",
                             "scatter", "index_put", "masked_fill", "_unsafe_view"})
ELEMENTWISE_OPS: Final = frozenset({
    "add", "sub", "mul", "div", "neg", "abs", "silu", "gelu", "relu", "sigmoid", "tanh", "exp",
    "log", "pow", "rsqrt", "sqrt", "sin", "cos", "where", "clamp", "clamp_min", "clamp_max",
    "maximum", "minimum", "reciprocal", "erf", "addcmul", "addcdiv", "lerp", "eq", "ne", "lt",
    "le", "gt", "ge", "logical_not", "bitwise_not", "threshold_backward", "silu_backward",
    "gelu_backward", "sigmoid_backward", "tanh_backward", "hardtanh", "leaky_relu", "mish",
    "softplus", "dropout", "native_dropout", "_fused_dropout", "floor", "ceil", "round",
})
COPY_FLOPS: Final = frozenset({"copy", "_to_copy", "to", "clone", "contiguous", "fill", "zero",
                               "cat", "stack", "index_select", "embedding", "index", "gather",
                               "_unsafe_view", "masked_fill", "scatter", "index_put"})

_FLASH_KERNEL_FLAGS: Final = re.compile(r"flash_fwd_kernel<.*?>\s*,\s*(true|false)\s*,\s*(true|false)")


def causal_from_kernel(kernel_name: str) -> bool | None:
    """Is_causal of a FlashAttention-2 forward kernel, read from its template arguments.

    FA2 (and PyTorch's vendored copy) declares ``flash_fwd_kernel<Kernel_traits, Is_dropout,
    Is_causal, ...>``; the kernel name carries the instantiation, so the second boolean after
    the traits is the causal flag.
    """
    m = _FLASH_KERNEL_FLAGS.search(kernel_name)
    if not m:
        return None
    return m.group(2) == "true"


def base_name(name: str) -> str:
    """The family key of an op name: ``aten::`` stripped, and the ``_`` of an in-place op."""
    base = name.split("::", 1)[-1]
    if base.endswith("_") and not base.endswith("__"):
        base = base[:-1]
    return base


#: Positions of (bias, stride, padding, dilation, transposed, groups) per convolution op.
CONV_ARGS: Final = {
    "convolution": (2, 3, 4, 5, 6, 8), "_convolution": (2, 3, 4, 5, 6, 8),
    "convolution_overrideable": (2, 3, 4, 5, 6, 8),
    "conv1d": (2, 3, 4, 5, None, 6), "conv2d": (2, 3, 4, 5, None, 6), "conv3d": (2, 3, 4, 5, None, 6),
    "cudnn_convolution": (None, 3, 2, 4, None, 5), "miopen_convolution": (2, 4, 3, 5, None, 6),
}
