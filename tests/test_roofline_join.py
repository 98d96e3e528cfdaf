"""``tracewhy kernels --ncu``: ncu verdicts joined onto a trace's kernels by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders import KinetoBuilder
from tracewhy.analyses.roofline_join import kernel_base_name
from tracewhy.cli import EXIT_OK, main


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, "
         "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul> >(int, "
         "at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, "
         "std::array<char*, 2ul>)", "vectorized_elementwise_kernel"),
        ("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, "
         "-2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>)", "indexSelectLargeIndex"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
         "_kernel__5x_cublas", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"
         "_execute_segment_k_off_kernel__5x_cublas"),
        ("void flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128>, (bool)0>(Flash_fwd_params)",
         "flash_fwd_kernel"),
        ("unnamed>::gemm_naive_kernel(const float *, const float *, float *, int, int, int)", "gemm_naive_kernel"),
    ],
)
def test_kernel_base_name(name: str, base: str) -> None:
    assert kernel_base_name(name) == base


def test_kernels_with_ncu_joins_exact_and_unambiguous_base_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = KinetoBuilder()
    b.launch("ampere_sgemm_128x64_nn", 0, 5, gpu_ts=10, gpu_dur=100)  # exact name in ncu
    b.launch("void my_ns::scale_kernel<float>(float*, int)", 20, 5, gpu_ts=200, gpu_dur=50)  # base name
    b.launch("void at::native::vectorized_elementwise_kernel<4, A>(int)", 30, 5, gpu_ts=300, gpu_dur=20)
    b.launch("void at::native::vectorized_elementwise_kernel<4, B>(int)", 40, 5, gpu_ts=400, gpu_dur=20)
    trace = b.write(tmp_path / "t.json")
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Section Name",'
              '"Metric Name","Metric Unit","Metric Value"')

    def rows(i: int, kernel: str, sm: str, mem: str) -> list[str]:
        return [f'"{i}","1","app","h","{kernel}","1","7","SOL","{label}","{unit}","{value}"'
                for label, unit, value in (("Duration", "ns", "1000"), ("Compute (SM) Throughput", "%", sm),
                                           ("Memory Throughput", "%", mem))]

    report = tmp_path / "k.csv"
    report.write_text("\n".join([header, *rows(0, "ampere_sgemm_128x64_nn", "85", "40"),
                                 *rows(1, "scale_kernel", "10", "90"),
                                 *rows(2, "vectorized_elementwise_kernel", "10", "80")]))
    assert main(["kernels", str(trace), "--ncu", str(report), "--json"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    by_name = {k["name"]: k for k in doc["kernels"]}
    sgemm = by_name["ampere_sgemm_128x64_nn"]
    assert (sgemm["ncu_match"], sgemm["ncu_bound"]) == ("exact", "compute-bound")
    scale = by_name["void my_ns::scale_kernel<float>(float*, int)"]
    assert (scale["ncu_match"], scale["ncu_bound"]) == ("base name", "memory-bound")
    # Two trace kernels share the base name ncu profiled once: which one ncu saw is unknown.
    for variant in ("A", "B"):
        row = by_name[f"void at::native::vectorized_elementwise_kernel<4, {variant}>(int)"]
        assert row["ncu_match"] == "ambiguous" and row["ncu_bound"] is None
    assert main(["kernels", str(trace), "--ncu", str(report)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "ncu verdicts" in out and "2 of 4 trace kernels matched" in out
