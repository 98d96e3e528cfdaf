"""Exact expectations on tiny inline traces: ops, kernels, steps, and the model's links."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import tracewhy
from builders import KinetoBuilder
from tracewhy.analyses.families import Family, kernel_family
from tracewhy.analyses.kernels import kernels
from tracewhy.analyses.ops import OpsOptions, ops
from tracewhy.analyses.steps import StepsOptions, steps
from tracewhy.model import Col, Kind


def _two_level(tmp_path: Path) -> tracewhy.Trace:
    # aten::linear [0, 100) contains aten::addmm [10, 60) which launches gemm (GPU 20 µs)
    # and, directly under linear, a launch of relu (GPU 5 µs).
    b = KinetoBuilder()
    b.op("aten::linear", 0, 100).op("aten::addmm", 10, 50)
    b.launch("sm80_gemm_kernel", 20, 5, gpu_ts=30, gpu_dur=20)
    b.launch("vectorized_elementwise_kernel relu", 70, 4, gpu_ts=80, gpu_dur=5)
    t = tracewhy.load(b.write(tmp_path / "t.json"))
    t.check()
    return t


def test_links_gpu_to_launch_and_innermost_op(tmp_path: Path) -> None:
    t = _two_level(tmp_path)
    s = t.slices.with_columns(pl.col(Col.NAME).cast(pl.String))
    by_name = {r[Col.NAME]: r for r in s.iter_rows(named=True)}
    gemm, relu = by_name["sm80_gemm_kernel"], by_name["vectorized_elementwise_kernel relu"]
    addmm, linear = by_name["aten::addmm"], by_name["aten::linear"]
    assert s[gemm[Col.LAUNCH], Col.NAME] == "cudaLaunchKernel"
    assert gemm[Col.OP] == addmm[Col.ID]
    assert relu[Col.OP] == linear[Col.ID]
    assert addmm[Col.PARENT] == linear[Col.ID] and addmm[Col.DEPTH] == 1
    assert linear[Col.DEPTH] == 0 and linear[Col.PARENT] is None


def test_ops_self_and_total_times(tmp_path: Path) -> None:
    table = ops(_two_level(tmp_path)).table
    rows = {r["name"]: r for r in table.iter_rows(named=True)}
    # linear: 100 µs total, 50 µs of which is addmm -> 50 µs self; GPU self = relu 5 µs,
    # GPU total = relu + gemm launched under addmm = 25 µs.
    assert rows["aten::linear"]["cpu_total_ns"] == 100_000
    assert rows["aten::linear"]["cpu_self_ns"] == 50_000
    assert rows["aten::linear"]["gpu_self_ns"] == 5_000
    assert rows["aten::linear"]["gpu_total_ns"] == 25_000
    assert rows["aten::addmm"]["gpu_self_ns"] == rows["aten::addmm"]["gpu_total_ns"] == 20_000
    assert table.get_column("name").to_list()[0] == "aten::addmm"  # sorted by GPU self time


def test_ops_by_shapes_splits_rows(tmp_path: Path) -> None:
    b = KinetoBuilder()
    b.op("aten::mm", 0, 10, **{"Input Dims": [[2, 3], [3, 4]]})
    b.op("aten::mm", 20, 10, **{"Input Dims": [[8, 3], [3, 4]]})
    b.op("aten::mm", 40, 10, **{"Input Dims": [[2, 3], [3, 4]]})
    r = ops(tracewhy.load(b.write(tmp_path / "s.json")), OpsOptions(by_shapes=True))
    calls = {row["input_dims"]: row["calls"] for row in r.table.iter_rows(named=True)}
    assert calls == {"[[2,3],[3,4]]": 2, "[[8,3],[3,4]]": 1}


def test_kernels_stats(tmp_path: Path) -> None:
    b = KinetoBuilder()
    for i, d in enumerate([10, 20, 30, 100]):
        b.launch("k_a", i * 200, 2, gpu_ts=i * 200 + 5, gpu_dur=d)
    b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1000, 2, gpu_ts=1005, gpu_dur=40)
    r = kernels(tracewhy.load(b.write(tmp_path / "k.json")))
    assert r.total_count == 5 and r.total_time_ns == 200_000
    a = r.by_name.filter(pl.col("name") == "k_a").row(0, named=True)
    assert (a["count"], a["total_ns"], a["min_ns"], a["max_ns"]) == (4, 160_000, 10_000, 100_000)
    assert a["p50_ns"] == 25_000 and a["mean_ns"] == 40_000 and a["share"] == pytest.approx(0.8)
    fam = {row["family"]: row["total_ns"] for row in r.by_family.iter_rows(named=True)}
    assert fam["communication"] == 40_000


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", Family.COMMUNICATION),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", Family.COMMUNICATION),
        ("void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_relu>", Family.GEMM),
        ("ampere_sgemm_32x32_sliced1x4_nn", Family.GEMM),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", Family.GEMM),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", Family.ATTENTION),
        ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512>", Family.NORMALIZATION),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", Family.NORMALIZATION),
        ("void implicit_convolve_sgemm<float, float, 128, 5, 5>", Family.CONVOLUTION),
        ("void at::native::reduce_kernel<512, 1, ReduceOp<float, sum_functor>>", Family.REDUCTION),
        ("void at::native::vectorized_elementwise_kernel<4, AUnaryFunctor<float>>", Family.ELEMENTWISE),
        ("Memcpy HtoD (Pageable -> Device)", Family.COPY),
        ("triton_poi_fused_add_0", Family.ELEMENTWISE),
        ("triton_red_fused_sum_1", Family.REDUCTION),
        ("some_custom_kernel", Family.OTHER),
    ],
)
def test_kernel_families(name: str, family: Family) -> None:
    assert kernel_family(name) is family


def _stepped(tmp_path: Path, durations: list[float], name: str = "ProfilerStep#{}") -> Path:
    b = KinetoBuilder()
    t = 0.0
    for i, d in enumerate(durations):
        b.annotation(name.format(i + 3), t, d)
        b.launch("k", t + 1, 1, gpu_ts=t + 2, gpu_dur=d / 2)
        t += d + 10
    return b.write(tmp_path / "steps.json")


def test_steps_warmup_and_percentiles(tmp_path: Path) -> None:
    r = steps(tracewhy.load(_stepped(tmp_path, [900, 100, 200, 300, 400])))
    assert r.table.get_column("number").to_list() == [3, 4, 5, 6, 7]
    assert r.warmup == 1 and r.table.get_column("steady").to_list() == [False, True, True, True, True]
    assert r.stats is not None
    # numpy's linear percentile over 100..400 µs: p50 = 250 µs, p90 = 370 µs.
    assert (r.stats.p50_ns, r.stats.p90_ns, r.stats.max_ns) == (250_000, 370_000, 400_000)
    assert r.table.get_column("kernel_count").to_list() == [1] * 5
    assert r.table.get_column("gpu_busy_ns").to_list() == [450_000, 50_000, 100_000, 150_000, 200_000]


def test_steps_custom_marker_and_absent_markers(tmp_path: Path) -> None:
    trace = tracewhy.load(_stepped(tmp_path, [100, 100], name="train_step"))
    # No ProfilerStep: a top-level block repeated evenly bounds the loop's iterations, start to
    # start (the last block's iteration has no known end, so two blocks give one iteration), and
    # the note names the rule and --step.
    inferred = steps(trace)
    assert inferred.source == "annotation" and inferred.table.height == 1
    assert inferred.note is not None and "train_step" in inferred.note and "--step" in inferred.note
    custom = steps(trace, StepsOptions(marker="train_step"))
    # Two same-named, disjoint spans are two steps (no warm-up with fewer than 3).
    assert custom.table.height == 2 and custom.warmup == 0
    assert custom.table.get_column("number").to_list() == [None, None]


def test_steps_nested_duplicate_is_one_step(tmp_path: Path) -> None:
    b = KinetoBuilder()
    b.op("ProfilerStep#1", 0, 100).annotation("ProfilerStep#1", 1, 98).op("ProfilerStep#2", 110, 50)
    r = steps(tracewhy.load(b.write(tmp_path / "dup.json")))
    assert r.table.get_column("dur_ns").to_list() == [100_000, 50_000]


def test_last_step_window_leaves_out_the_gpu_backlog(tmp_path: Path) -> None:
    # The GPU runs behind: step 1 (0-100 µs) launches 150 µs of work that runs 50-200; step 2
    # (110-160 µs) launches 40 µs that can only start when that is done, at 200, ending at 240.
    # Step 1's window is 0-110 (the next start). The last step's window lasts the GPU's time on
    # its own work (200-240: 40 µs) or its CPU span (50 µs), whichever is longer: 110-160, not
    # 110-240, which would take in 90 µs of step 1's backlog.
    b = KinetoBuilder()
    b.annotation("ProfilerStep#1", 0, 100).launch("a", 10, 5, gpu_ts=50, gpu_dur=150)
    b.annotation("ProfilerStep#2", 110, 50).launch("b", 120, 5, gpu_ts=200, gpu_dur=40)
    t = steps(tracewhy.load(b.write(tmp_path / "lag.json"))).table
    assert t.get_column("window_end_ns").to_list() == [110_000, 160_000]
    assert t.get_column("gpu_end_ns").to_list() == [200_000, 240_000]
    # With 70 µs of its own GPU work the last window outlasts its CPU span: 110 + 70 = 180 µs.
    b = KinetoBuilder()
    b.annotation("ProfilerStep#1", 0, 100).launch("a", 10, 5, gpu_ts=50, gpu_dur=150)
    b.annotation("ProfilerStep#2", 110, 50).launch("b", 120, 5, gpu_ts=200, gpu_dur=70)
    t = steps(tracewhy.load(b.write(tmp_path / "lag2.json"))).table
    assert t.get_column("window_end_ns").to_list() == [110_000, 180_000]
    # Without a backlog it is the end of the step's GPU work, as before: 110 + (250 - 110).
    b = KinetoBuilder()
    b.annotation("ProfilerStep#1", 0, 100).launch("a", 10, 5, gpu_ts=50, gpu_dur=20)
    b.annotation("ProfilerStep#2", 110, 50).launch("b", 120, 5, gpu_ts=200, gpu_dur=50)
    t = steps(tracewhy.load(b.write(tmp_path / "nolag.json"))).table
    assert t.get_column("window_end_ns").to_list() == [110_000, 250_000]


def test_kinds_legacy_categories(tmp_path: Path) -> None:
    b = KinetoBuilder()
    b.events += [
        {"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 1, "tid": "1", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": "1", "ts": 2, "dur": 3,
         "args": {"correlation": 5, "external id": 9}},
        {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": "stream 7", "ts": 6, "dur": 2,
         "args": {"device": 0, "stream": 7, "correlation": 5, "external id": 9}},
    ]
    t = tracewhy.load(b.write(tmp_path / "legacy.json"))
    t.check()
    kinds = t.slices.get_column(Col.KIND).cast(pl.String).to_list()
    assert kinds == [Kind.CPU_OP.value, Kind.RUNTIME.value, Kind.KERNEL.value]
    kernel = t.of_kind(Kind.KERNEL).row(0, named=True)
    assert kernel[Col.EXTERNAL_ID] == 9 and kernel[Col.STREAM] == 7 and kernel[Col.OP] == 0


def test_of_kind_keeps_small_results_only_and_never_a_stale_one(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """of_kind keeps a result of at most an eighth of the rows for the next caller (diagnose
    asks for the same kinds many times); a large one is filtered afresh each time (unless the
    table is small: ``_KEEP_OF_KIND_ROWS``, here 0 as for a large trace), and a Trace made from
    another (dataclasses.replace) starts with nothing kept."""
    import dataclasses

    from tracewhy.model import trace as trace_module

    monkeypatch.setattr(trace_module, "_KEEP_OF_KIND_ROWS", 0)
    b = KinetoBuilder()
    for i in range(40):
        b.op(f"op{i}", i * 10, 5)
    b.launch("k", 401, 1, gpu_ts=402, gpu_dur=2)
    trace = tracewhy.load(b.write(tmp_path / "t.json"))
    kernels_first = trace.of_kind(Kind.KERNEL)
    assert kernels_first.height == 1
    assert trace.of_kind(Kind.KERNEL) is kernels_first  # kept
    both = trace.of_kind(Kind.KERNEL, Kind.MEMCPY)
    assert both.equals(trace.of_kind(Kind.MEMCPY, Kind.KERNEL)) and both is trace.of_kind(Kind.MEMCPY, Kind.KERNEL)
    ops_first = trace.of_kind(Kind.CPU_OP)
    assert ops_first.height == 40 and trace.of_kind(Kind.CPU_OP) is not ops_first  # too large to keep
    assert ops_first.equals(trace.of_kind(Kind.CPU_OP))
    fewer = dataclasses.replace(trace, slices=trace.slices.filter(pl.col(Col.KIND) != Kind.KERNEL.value))
    assert fewer.of_kind(Kind.KERNEL).height == 0
    # A small table keeps every result: its copies are small, and diagnose asks again and again.
    monkeypatch.setattr(trace_module, "_KEEP_OF_KIND_ROWS", trace.slices.height)
    small = dataclasses.replace(trace)
    assert small.of_kind(Kind.CPU_OP) is small.of_kind(Kind.CPU_OP)
