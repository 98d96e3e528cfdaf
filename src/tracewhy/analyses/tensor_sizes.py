"""Sizes of the tensors ``record_shapes`` writes: bytes per element of each dtype name the
profiler uses, element and byte counts, broadcast shapes, and which peak bounds math in each
dtype. What ``shapes`` needs to turn recorded dims into minimum bytes and a roofline ceiling.
"""

from __future__ import annotations

import math
from typing import Final

#: Bytes per element for the dtype names PyTorch's profiler writes in "Input type".
DTYPE_BYTES: Final = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2, "half": 2, "bfloat16": 2,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1, "long int": 8, "long": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}
#: Bytes per element for the c10 ScalarType names ``record_param_comms`` writes in "dtype".
SCALAR_TYPE_BYTES: Final = {
    "Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "ComplexHalf": 4, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
}
_FP8: Final = frozenset(k for k in DTYPE_BYTES if "Float8" in k)
_HALF: Final = frozenset({"c10::Half", "c10::BFloat16", "half", "bfloat16"})


def numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def nbytes(shape: list[int], dtype: str) -> int:
    return numel(shape) * DTYPE_BYTES.get(dtype, 4)


def matmul_precision(dtype: str) -> str:
    """The peak that bounds a matrix multiply in ``dtype`` (tensor cores for 16/8-bit)."""
    if dtype in _FP8:
        return "fp8_tensor"
    if dtype in _HALF:
        return "fp16_tensor"
    if dtype == "double":
        return "fp64"
    return "fp32"


def vector_precision(dtype: str) -> str:
    """The peak that bounds elementwise math: CUDA cores; fp64 for doubles, fp32 otherwise."""
    return "fp64" if dtype == "double" else "fp32"


def broadcast(*shapes: list[int]) -> list[int]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, x in enumerate(s, start=rank - len(s)):
            out[i] = max(out[i], x)
    return out
