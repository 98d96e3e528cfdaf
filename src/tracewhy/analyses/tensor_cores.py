"""Which GEMM and convolution kernels run on tensor cores and which could: per kernel name and
device, its precision, its shape (matrix-vector or not), what the device's architecture offers,
and the framework that launched it, each with the rule that decided. ``findings/platform.py``
judges; the architecture facts and name lists live here, once, with their sources.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import polars as pl

from tracewhy.analyses.families import Family, classify_kernels
from tracewhy.model.schema import Col, DeviceCol, Kind, OpAttrCol
from tracewhy.model.trace import KINETO_FORMAT, Trace

# --- architecture facts (CUDA C++ Programming Guide, "Compute Capabilities" and the warp
# matrix functions' type table; NVIDIA V100, T4, A100, H100 and Blackwell whitepapers) -------
#: Tensor cores arrived with Volta (sm_70); nothing before it has any.
TENSOR_CORES_MIN_CC: Final = (7, 0)
#: First compute capability whose tensor cores take each input precision: FP16 on Volta, INT8
#: from sm_72/Turing (sm_75: FP16 and INT8 only, no TF32 or BF16), TF32 and BF16 from Ampere
#: (sm_80), FP8 from Ada (sm_89) and Hopper (sm_90), FP4 from Blackwell (sm_100).
PRECISION_MIN_CC: Final = {"fp16": (7, 0), "int8": (7, 2), "tf32": (8, 0), "bf16": (8, 0), "fp8": (8, 9),
                           "fp4": (10, 0)}
#: FP64 tensor cores (DMMA) are on the data-center parts only: A100 (sm_80), H100/H200 (sm_90),
#: B200 (sm_100); not on T4 (sm_75), A10/RTX 30 (sm_86), L4/RTX 40 (sm_89). Where they exist
#: cuBLAS uses them for DGEMM unasked, so FP64 is never a "not on tensor cores" case.
FP64_TENSOR_CORE_CC: Final = frozenset({(8, 0), (9, 0), (10, 0)})

# --- names ---------------------------------------------------------------------------------
#: Kernel names that run on tensor cores: Volta 884 / Turing 1688 / Ampere 16816 HMMA shapes,
#: cutlass tensorop, Hopper wgmma and nvjet (cuBLASLt), cuDNN "xmma" tensor paths, AMD mfma/wmma.
_TENSOR_CORE_NAME: Final = re.compile(
    r"884|1688|16816|16832|tensorop|hmma|imma|wgmma|nvjet|xmma|mfma|wmma|s16816|h16816|i8816|utcmma|tcgen05",
    re.IGNORECASE)
#: Input precision from a kernel name, lowest first (a name lists inputs and accumulator:
#: bmm_Bfloat16_MxE2m1MxE4m3_Fp32 takes FP4/FP8 inputs). OCP MX formats: E2M1 is FP4, E4M3 and
#: E5M2 are FP8. cuBLAS spells types as template arguments (gemv2T_kernel_val<int, int, double,
#: double, ...>), legacy BLAS by prefix (sgemm, dgemm, hgemm, zgemm).
_PRECISION_NAME: Final = tuple((p, re.compile(r, re.IGNORECASE)) for p, r in (
    ("fp4", r"e2m1|nvfp4|mxfp4|fp4"),
    ("fp8", r"e4m3|e5m2|fp8|mxf8"),
    ("int8", r"int8|imma|i8816|_s8_|_u8_"),
    ("bf16", r"bf16|bfloat16"),
    ("fp16", r"fp16|f16|half|hgemm|_h\d+gemm"),
    ("tf32", r"tf32"),
    ("fp32", r"sgemm|cgemm|\bfloat\b|fp32|f32"),
    ("fp64", r"dgemm|zgemm|\bdouble\b|fp64|f64|dmma"),
))
#: PyTorch's scalar type names as Kineto writes them in an op's "Input type".
_PRECISION_TYPE: Final = {"c10::Half": "fp16", "c10::BFloat16": "bf16", "float": "fp32", "double": "fp64",
                          "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::complex<float>": "fp32",
                          "c10::complex<double>": "fp64", "signed char": "int8", "unsigned char": "int8"}
#: Matrix-vector kernels and ops: memory-bound at any size (two flops per matrix element
#: read), so tensor cores would not make them faster. cuBLAS gemv/gemvx/ger/dot kernel names.
_MATRIX_VECTOR_NAME: Final = re.compile(r"gemv|ger_kernel|dot_kernel|spmv|trsv|symv|hemv", re.IGNORECASE)
_MATRIX_VECTOR_OP: Final = frozenset({"aten::mv", "aten::addmv", "aten::dot", "aten::vdot", "aten::ger",
                                      "aten::outer"})
_MATRIX_OPS: Final = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
                                "aten::linear", "aten::_scaled_mm"})
#: Frameworks by what they leave in a trace: torch.profiler writes Kineto and records aten::
#: ops (nsys shows them as NVTX with emit_nvtx) and ATen's own kernels are at::native::*; XLA
#: names its NVTX ranges XlaModule / Thunk; CuPy's elementwise and reduction kernels are cupy_*.
_JAX_RANGE: Final = re.compile(r"^(XlaModule|Thunk|jit_)")

ON: Final = "on tensor cores"
CANDIDATE: Final = "could use tensor cores"
EXCLUDED: Final = "excluded"


@dataclass(frozen=True)
class TensorCoresResult:
    """``table``: one row per GEMM/convolution kernel name and device, most time first.

    Columns: name, device, cc (``"8.0"``, null when the trace does not describe the device),
    precision (fp4 ... fp64, null when unknown), precision_rule (name, op input types),
    shape (matrix-vector or null), shape_rule (name, op, op input shapes), verdict (ON,
    CANDIDATE, EXCLUDED), reason (why, for the verdict), count, total_ns.
    ``framework``: torch, jax, cupy or None, with ``framework_rule`` saying what decided.
    """

    table: pl.DataFrame
    framework: str | None
    framework_rule: str


_SCHEMA: Final = {"name": pl.String, "device": pl.Int32, "cc": pl.String, "precision": pl.String,
                  "precision_rule": pl.String, "shape": pl.String, "shape_rule": pl.String, "verdict": pl.String,
                  "reason": pl.String, "count": pl.Int64, "total_ns": pl.Int64}


def tensor_cores(trace: Trace, vendor: str | None = "nvidia") -> TensorCoresResult:
    """``vendor``: the GPU vendor (findings.platform.gpu_vendor decides it). The compute
    capability tables are NVIDIA's: on another vendor's GPU only the name rules apply."""
    framework, framework_rule = launching_framework(trace)
    fam = classify_kernels(trace).filter(
        pl.col("family").is_in([Family.GEMM.value, Family.CONVOLUTION.value])).get_column(Col.ID)
    k = trace.of_kind(Kind.KERNEL).filter(pl.col(Col.ID).is_in(fam.implode())).select(
        pl.col(Col.NAME).cast(pl.String), Col.DEVICE, Col.OP, Col.DUR)
    if k.height == 0:
        return TensorCoresResult(pl.DataFrame(schema=_SCHEMA), framework, framework_rule)
    ops = k.get_column(Col.OP).drop_nulls().unique()
    op_info = pl.DataFrame({Col.OP: ops}, schema={Col.OP: pl.Int64})
    if ops.len():
        names = trace.slices.get_column(Col.NAME).gather(ops).cast(pl.String)
        op_info = op_info.with_columns(names.alias("_op")).join(
            trace.op_attrs.select(pl.col(OpAttrCol.ID).alias(Col.OP), OpAttrCol.INPUT_DIMS, OpAttrCol.INPUT_TYPES),
            on=Col.OP, how="left")
    else:
        op_info = op_info.with_columns(pl.lit(None, pl.String).alias("_op"), pl.lit(None, pl.String).alias(
            OpAttrCol.INPUT_DIMS), pl.lit(None, pl.String).alias(OpAttrCol.INPUT_TYPES))
    cc = {d: (a, b) for d, a, b in trace.devices.select(DeviceCol.DEVICE, DeviceCol.CC_MAJOR,
                                                        DeviceCol.CC_MINOR).iter_rows()
          if a is not None and b is not None and vendor == "nvidia"}
    groups = (
        k.join(op_info, on=Col.OP, how="left")
        .group_by(Col.NAME, Col.DEVICE, "_op", OpAttrCol.INPUT_DIMS, OpAttrCol.INPUT_TYPES)
        .agg(pl.len().cast(pl.Int64).alias("count"), pl.col(Col.DUR).sum().alias("total_ns"))
    )
    rows = []
    for g in groups.iter_rows(named=True):
        dev_cc = cc.get(g[Col.DEVICE])
        precision, precision_rule = _precision(g[Col.NAME], g[OpAttrCol.INPUT_TYPES])
        shape_rule = _matrix_vector(g[Col.NAME], g["_op"], g[OpAttrCol.INPUT_DIMS])
        verdict, reason = _verdict(g[Col.NAME], precision, shape_rule, dev_cc)
        rows.append({"name": g[Col.NAME], "device": g[Col.DEVICE],
                     "cc": f"{dev_cc[0]}.{dev_cc[1]}" if dev_cc else None, "precision": precision,
                     "precision_rule": precision_rule, "shape": "matrix-vector" if shape_rule else None,
                     "shape_rule": shape_rule, "verdict": verdict, "reason": reason, "count": g["count"],
                     "total_ns": g["total_ns"]})
    table = (
        pl.DataFrame(rows, schema=_SCHEMA)
        .group_by([c for c in _SCHEMA if c not in ("count", "total_ns")])
        .agg(pl.col("count").sum(), pl.col("total_ns").sum())
        .sort(["total_ns", "name", "device", "verdict"], descending=[True, False, False, False], nulls_last=True)
        .select(*_SCHEMA)
    )
    return TensorCoresResult(table, framework, framework_rule)


@lru_cache(maxsize=8192)
def precision_from_name(name: str) -> str | None:
    """The lowest input precision a kernel name spells, or None."""
    for precision, pattern in _PRECISION_NAME:
        if pattern.search(name):
            return precision
    return None


def _precision(name: str, input_types: str | None) -> tuple[str | None, str | None]:
    by_name = precision_from_name(name)
    if by_name is not None:
        return by_name, "name"
    if input_types:
        try:
            types = json.loads(input_types)
        except ValueError:
            types = []
        found = [_PRECISION_TYPE[t] for t in types if isinstance(t, str) and t in _PRECISION_TYPE]
        if found:
            return found[0], "op input types"
    return None, None


def _matrix_vector(name: str, op: str | None, input_dims: str | None) -> str | None:
    """The rule that found a matrix-vector product (name, op, op input shapes), or None."""
    if _MATRIX_VECTOR_NAME.search(name):
        return "name"
    if op in _MATRIX_VECTOR_OP:
        return "op"
    if op in _MATRIX_OPS and input_dims:
        m_n = _gemm_m_n(op, input_dims)
        if m_n is not None and min(m_n) == 1:
            return "op input shapes"
    return None


def _gemm_m_n(op: str, input_dims: str) -> tuple[int, int] | None:
    """(M, N) of a matrix op from its recorded input shapes, None when they do not say."""
    try:
        dims = json.loads(input_dims)
    except ValueError:
        return None
    if not isinstance(dims, list):
        return None
    shapes = [d for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]
    if op in ("aten::addmm", "aten::baddbmm") and len(shapes) >= 3:
        shapes = shapes[1:]  # (bias, mat1, mat2)
    if len(shapes) < 2:
        return None
    a, b = shapes[0], shapes[1]
    if op == "aten::linear":  # input [..., K], weight [N, K]
        return math.prod(a[:-1]) if len(a) > 1 else 1, b[0]
    if len(a) == 1 or len(b) == 1:
        return 1, 1
    return a[-2], b[-1]


def _verdict(name: str, precision: str | None, matrix_vector: str | None,
             cc: tuple[int, int] | None) -> tuple[str, str]:
    sm = f"sm_{cc[0]}{cc[1]}" if cc else None
    if _TENSOR_CORE_NAME.search(name):
        return ON, "its name names a tensor-core instruction or kernel family"
    if matrix_vector:
        return EXCLUDED, f"matrix-vector product (by {matrix_vector}): memory-bound, tensor cores would not help"
    if cc is not None and cc < TENSOR_CORES_MIN_CC:
        return EXCLUDED, f"{sm} has no tensor cores (they start with Volta, sm_70)"
    if precision == "fp64":
        if cc in FP64_TENSOR_CORE_CC:
            return EXCLUDED, f"FP64 on {sm}: cuBLAS uses its FP64 tensor cores unasked"
        where = sm or "this GPU"
        return EXCLUDED, f"FP64: {where} has no FP64 tensor cores (only sm_80, sm_90, sm_100 do)"
    if precision in PRECISION_MIN_CC:
        if cc is None or cc >= PRECISION_MIN_CC[precision]:
            return ON, f"{precision.upper()} inputs run on tensor cores" + (f" on {sm}" if sm else "")
        return EXCLUDED, f"{sm} has no {precision.upper()} tensor cores"
    return CANDIDATE, f"{(precision or 'unknown-precision').upper()} on CUDA cores" + (f" ({sm})" if sm else "")


def launching_framework(trace: Trace) -> tuple[str | None, str]:
    """torch, jax, cupy or None, and the rule that decided."""
    if trace.meta.format.startswith(KINETO_FORMAT):
        return "torch", "a Kineto trace (torch.profiler)"
    read = trace.meta.kinds_read
    host = [k for k in (Kind.CPU_OP, Kind.ANNOTATION) if read is None or k.value in read]
    # Distinct names first, then strings: a full-width copy of the 4.8 M annotations of a large
    # nsys export, each name a string, was 0.4 GB.
    names = trace.kind_columns(host, Col.NAME).get_column(Col.NAME).unique().cast(pl.String).to_list() if host else []
    if any(isinstance(n, str) and n.startswith("aten::") for n in names):
        return "torch", "aten:: ops in the trace"
    if any(isinstance(n, str) and _JAX_RANGE.match(n) for n in names):
        return "jax", "XLA ranges (XlaModule/Thunk) in the trace"
    kernels = trace.of_kind(Kind.KERNEL).get_column(Col.NAME).unique().cast(pl.String).to_list()
    if any(isinstance(n, str) and "at::native::" in n for n in kernels):
        return "torch", "ATen (at::native::) kernels in the trace"
    if any(isinstance(n, str) and n.startswith("cupy_") for n in kernels):
        return "cupy", "cupy_* kernels in the trace"
    return None, "no framework's ops or kernels in the trace"
