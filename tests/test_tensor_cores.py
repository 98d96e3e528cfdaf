"""Tensor-core advice decides by precision, by the device's architecture and by the kernel's
shape, and speaks to the framework that launched the kernel."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import polars as pl

import tracewhy
from builders import KinetoBuilder
from conftest import shared_trace
from nsys_support import load as load_nsys
from tracewhy.analyses.kernels import kernels
from tracewhy.analyses.tensor_cores import CANDIDATE, EXCLUDED, ON, tensor_cores
from tracewhy.findings import platform
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding
from tracewhy.model.schema import Col, DeviceCol, Kind
from tracewhy.model.trace import Trace

B200 = "tracelens/b200_vllm_eager_tp8_rank0.json.gz"
#: cuBLAS's FP64 transposed matrix-vector kernel, as CuPy's a.T @ x on float64 launches it
#: (template: index type, compute type, input type, tile shape, then cublasGemvParamsEx).
GEMV_FP64 = ("void gemv2T_kernel_val<int, int, double, double, double, double, 128, 16, 4, 4, false, false, "
             "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<double const>, "
             "cublasGemvTensorStridedBatched<double const>, cublasGemvTensorStridedBatched<double>, double> >"
             "(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<double const>, "
             "cublasGemvTensorStridedBatched<double const>, cublasGemvTensorStridedBatched<double>, double>, "
             "double, double)")
SGEMM = "volta_sgemm_128x64_nn"  # cuBLAS's FP32 SIMT GEMM (no tensor-core shape in its name)
TORCH_WORDS = ("torch", "autocast", "allow_tf32", "GradScaler")


def _tensor_finding(trace: Trace) -> Finding | None:
    found = [f for f in platform.findings(Context(trace)) if f.code == "tensor-cores-unused"]
    return found[0] if found else None


def test_blackwell_fp4_fp8_gemms_are_on_tensor_cores() -> None:
    """vLLM on B200: the MoE GEMMs take MX FP4/FP8 inputs (E2m1, E4m3, in mixed case). The old
    regex lost IGNORECASE on its way into polars and called 54% of kernel time 'not on tensor
    cores' with autocast advice; bf16 and nvjet GEMMs make up the rest."""
    trace = tracewhy.load(shared_trace(B200))
    tc = tensor_cores(trace)
    by_name = {r["name"]: r for r in tc.table.iter_rows(named=True)}
    mx = [n for n in by_name if n.startswith("bmm_") and "MxE2m1" in n]
    assert len(mx) == 2
    for n in mx:
        assert (by_name[n]["precision"], by_name[n]["precision_rule"], by_name[n]["verdict"]) == ("fp4", "name", ON)
        assert by_name[n]["cc"] == "10.0"
    assert tc.table.filter(pl.col("verdict") == CANDIDATE).height == 0
    # The GEMM time judged is the kernels table's GEMM time, summed independently here.
    gemm = kernels(trace).by_family.filter(pl.col("family") == "gemm").get_column("total_ns").sum()
    assert tc.table.get_column("total_ns").sum() == gemm
    assert tc.framework == "torch"
    assert _tensor_finding(trace) is None


def _as_turing_gemv(name: str) -> Trace:
    """The MPI saxpy export (a CUDA program, no framework), its kernel renamed and its A100
    described as a T4 (compute capability 7.5)."""
    t = load_nsys("pipit_saxpy_mpi_cuda_a100_2022.2")
    s = t.slices.with_columns(
        pl.when(pl.col(Col.KIND) == Kind.KERNEL.value).then(pl.lit(name)).otherwise(pl.col(Col.NAME).cast(pl.String))
        .cast(pl.Categorical).alias(Col.NAME))
    devices = t.devices.with_columns(pl.lit("Tesla T4").alias(DeviceCol.NAME), pl.lit(7,
                                                                                      pl.Int32).alias(DeviceCol.CC_MAJOR),
                                     pl.lit(5, pl.Int32).alias(DeviceCol.CC_MINOR))
    out = dataclasses.replace(t, slices=s, devices=devices)
    out.__dict__.pop("_of_kind", None)
    out.check()
    return out


def test_fp64_gemv_on_a_t4_from_a_non_torch_program_gets_no_tensor_core_advice() -> None:
    """FP64 cuBLAS gemv on a T4, no torch in sight: memory-bound, no FP64 (or TF32/BF16) tensor
    cores on sm_75, and no torch to autocast. The old rule said 'enable torch.autocast(bf16) or
    allow_tf32' for 100% of the kernel time."""
    trace = _as_turing_gemv(GEMV_FP64)
    tc = tensor_cores(trace)
    assert (tc.framework, tc.framework_rule) == (None, "no framework's ops or kernels in the trace")
    row = tc.table.row(0, named=True)
    assert (row["precision"], row["shape"], row["shape_rule"], row["verdict"], row["cc"]) == (
        "fp64", "matrix-vector", "name", EXCLUDED, "7.5")
    assert row["count"] == 5 and row["total_ns"] == 88_573_480  # the export's five kernel rows
    assert _tensor_finding(trace) is None


def test_fp64_gemm_on_a_t4_is_excluded_for_its_precision() -> None:
    trace = _as_turing_gemv("volta_dgemm_128x64_nn")
    row = tensor_cores(trace).table.row(0, named=True)
    assert (row["precision"], row["shape"], row["verdict"]) == ("fp64", None, EXCLUDED)
    assert "sm_75 has no FP64 tensor cores" in row["reason"]
    assert _tensor_finding(trace) is None


def test_fp32_gemm_on_a_t4_without_torch_is_told_fp16_not_torch_or_tf32() -> None:
    trace = _as_turing_gemv(SGEMM)
    f = _tensor_finding(trace)
    assert f is not None and f.evidence["framework"] is None
    assert "FP16" in f.next_step and "sm_75" in f.next_step
    assert not any(w in f.next_step for w in TORCH_WORDS)
    assert "CUBLAS_TF32" not in f.next_step


def _torch_gemm(tmp_path: Path, kernel: str, cc: tuple[int, int], dims: list[list[int]]) -> Trace:
    b = KinetoBuilder()
    b.header["deviceProperties"] = [{"id": 0, "name": "GPU", "totalGlobalMem": 16 << 30, "computeMajor": cc[0],
                                     "computeMinor": cc[1], "numSms": 40}]
    args: dict[str, Any] = {"Input Dims": dims, "Input type": ["float", "float"]}
    for i in range(4):
        b.op("aten::mm", i * 100, 20, **args)
        b.launch(kernel, i * 100 + 1, 2, gpu_ts=i * 100 + 5, gpu_dur=80)
    return tracewhy.load(b.write(tmp_path / f"{cc[0]}{cc[1]}.json"))


def test_torch_fp32_gemm_advice_follows_the_architecture(tmp_path: Path) -> None:
    """Precision from the op's input types (the kernel name says none); sm_75 has FP16 tensor
    cores only, sm_80 adds TF32 and BF16."""
    name = "void gemmSN_TN_kernel<128, 16, 2, 4, 8, 9, false>(int, int, int)"
    turing = _tensor_finding(_torch_gemm(tmp_path, name, (7, 5), [[256, 512], [512, 256]]))
    assert turing is not None
    assert turing.evidence["kernels"][0]["precision_rule"] == "op input types"
    assert "torch.float16" in turing.next_step and "GradScaler" in turing.next_step
    assert "bfloat16" not in turing.next_step and "allow_tf32" not in turing.next_step
    ampere = _tensor_finding(_torch_gemm(tmp_path, name, (8, 0), [[256, 512], [512, 256]]))
    assert ampere is not None and "bfloat16" in ampere.next_step and "allow_tf32" in ampere.next_step


def test_a_matrix_vector_mm_is_not_a_tensor_core_candidate(tmp_path: Path) -> None:
    """aten::mm of a [1, 4096] row by a [4096, 4096] matrix: a GEMV whatever kernel runs it."""
    trace = _torch_gemm(tmp_path, SGEMM, (8, 0), [[1, 4096], [4096, 4096]])
    row = tensor_cores(trace).table.row(0, named=True)
    assert (row["shape"], row["shape_rule"], row["verdict"]) == ("matrix-vector", "op input shapes", EXCLUDED)
    assert _tensor_finding(trace) is None
    assert json.dumps(row)  # plain values, ready for --json
