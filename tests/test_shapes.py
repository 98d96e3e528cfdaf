"""FLOPs and minimum bytes from recorded shapes, against values worked out by hand in each test,
then against TraceLens's own reference CSVs for the same H100 trace (a peer, not ground truth)."""

from __future__ import annotations

import ast
import csv
import json

import pytest

from conftest import shared_trace
from tracewhy.analyses.op_families import causal_from_kernel
from tracewhy.analyses.shapes import (
    ATTENTION,
    CONVOLUTION,
    GEMM,
    OpInputs,
    attention_cost,
    conv_cost,
    estimate,
)

BF16 = "c10::BFloat16"


def _inputs(dims: list[object], types: list[str], concrete: list[str] | None = None) -> OpInputs:
    parsed = OpInputs.parse(json.dumps(dims), json.dumps(types), json.dumps(concrete) if concrete else None)
    assert parsed is not None
    return parsed


# --- GEMM -----------------------------------------------------------------------------------


def test_mm_flops_and_bytes_by_hand() -> None:
    # [64,32] @ [32,16] in fp32: 2*64*16*32 = 65,536 FLOPs; A 2048 + B 512 + C 1024 elements, 4 B each.
    cost = estimate("aten::mm", _inputs([[64, 32], [32, 16]], ["float", "float"]))
    assert cost is not None and cost.category == GEMM
    assert cost.flops == 65_536
    assert cost.min_bytes == (2048 + 512 + 1024) * 4
    assert cost.precision == "fp32"


def test_addmm_adds_one_flop_per_output_for_the_bias() -> None:
    # bias [16] broadcast onto [64,16]: 2*64*16*32 + 64*16 = 66,560; bf16 runs on tensor cores.
    cost = estimate("aten::addmm", _inputs([[16], [64, 32], [32, 16], [], []],
                                           [BF16, BF16, BF16, "Scalar", "Scalar"]))
    assert cost is not None
    assert cost.flops == 66_560
    assert cost.min_bytes == (2048 + 512 + 1024 + 16) * 2
    assert cost.precision == "fp16_tensor"


def test_bmm_and_matmul_broadcast_batches() -> None:
    # bmm [8,4,5] @ [8,5,3]: 8 * 2*4*3*5 = 960.
    bmm = estimate("aten::bmm", _inputs([[8, 4, 5], [8, 5, 3]], ["float", "float"]))
    assert bmm is not None and bmm.flops == 960
    # matmul [2,8,4,5] @ [5,3]: the batch dims flatten into M = 2*8*4 = 64 rows: 2*64*3*5 = 1920.
    mm = estimate("aten::matmul", _inputs([[2, 8, 4, 5], [5, 3]], ["float", "float"]))
    assert mm is not None and mm.flops == 1920
    # matmul [2,1,4,5] @ [3,5,6]: batch broadcasts to 2*3 = 6 GEMMs of 4x6x5: 6*2*4*6*5 = 1440.
    bc = estimate("aten::matmul", _inputs([[2, 1, 4, 5], [3, 5, 6]], ["float", "float"]))
    assert bc is not None and bc.flops == 1440


def test_linear_flattens_leading_dims_and_counts_bias() -> None:
    # x [2,3,8] @ W[4,8]^T + b[4]: M = 6: 2*6*4*8 + 6*4 = 408.
    cost = estimate("aten::linear", _inputs([[2, 3, 8], [4, 8], [4]], ["float", "float", "float"]))
    assert cost is not None and cost.flops == 408


def test_fp8_scaled_mm_uses_the_fp8_peak() -> None:
    cost = estimate("aten::_scaled_mm", _inputs([[128, 64], [64, 32], [], []],
                                                ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float", "float"]))
    assert cost is not None and cost.flops == 2 * 128 * 32 * 64 and cost.precision == "fp8_tensor"


# --- attention ------------------------------------------------------------------------------


def test_attention_flops_by_hand_and_causal_halves() -> None:
    # B=2, H=4, N=128, d=64: QK^T 2*2*4*128*128*64 and PV the same: 4*2*4*128*128*64 = 33,554,432.
    full = attention_cost(2, 4, 128, 128, 64, 64, BF16)
    assert full.flops == 33_554_432
    causal = attention_cost(2, 4, 128, 128, 64, 64, BF16, causal=True)
    assert causal.flops == full.flops / 2
    # Q, K, V and O each 2*4*128*64 = 65,536 bf16 elements.
    assert full.min_bytes == 4 * 65_536 * 2


def test_grouped_query_attention_reads_fewer_kv_heads() -> None:
    # 8 query heads sharing 2 KV heads: FLOPs follow the query heads; K and V bytes the KV heads.
    gqa = attention_cost(1, 8, 256, 256, 64, 64, BF16, heads_kv=2)
    assert gqa.flops == 4 * 8 * 256 * 256 * 64
    q = o = 8 * 256 * 64
    kv = 2 * 256 * (64 + 64)
    assert gqa.min_bytes == (q + kv + o) * 2


def test_sdpa_and_flash_layouts_read_the_right_axes() -> None:
    # SDPA ops take (batch, heads, seq, dim); _flash_attention_forward takes (batch, seq, heads, dim).
    # The same problem written both ways must cost the same. is_causal is argument 4 / 8.
    sdpa = estimate("aten::_scaled_dot_product_flash_attention",
                    _inputs([[2, 4, 128, 64]] * 3 + [[]] * 4, [BF16] * 3 + ["Scalar"] * 4,
                            ["", "", "", "0.", "True", "False", "0.125"]))
    flash = estimate("aten::_flash_attention_forward",
                     _inputs([[2, 128, 4, 64]] * 3 + [[]] * 12, [BF16] * 3 + [""] * 12,
                             ["", "", "", "", "", "128", "128", "0.", "True", "False", "0.125", "", "", "", ""]))
    assert sdpa is not None and flash is not None and sdpa.category == ATTENTION
    assert sdpa.flops == flash.flops == 33_554_432 / 2
    assert sdpa.params["causal"] is True and flash.params["causal"] is True


def test_unknown_causal_flag_is_costed_full_and_says_so() -> None:
    cost = estimate("aten::_flash_attention_forward", _inputs([[2, 128, 4, 64]] * 3, [BF16] * 3))
    assert cost is not None and cost.flops == 33_554_432
    assert cost.note is not None and "upper bound" in cost.note


def test_causal_flag_from_flash_kernel_template_arguments() -> None:
    # The H100 Qwen trace's kernel: flash_fwd_kernel<Traits, Is_dropout=false, Is_causal=true, ...>.
    name = ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, "
            "false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, "
            "cutlass::bfloat16_t> >, false, true, false, false, false, true, false>(pytorch_flash::Flash_fwd_params)")
    assert causal_from_kernel(name) is True
    assert causal_from_kernel(name.replace(">, false, true,", ">, false, false,")) is False
    assert causal_from_kernel("attn_fwd") is None


# --- convolution ----------------------------------------------------------------------------


def test_conv2d_by_hand() -> None:
    # N=1, C=3, 8x8 input, O=4, 3x3 kernel, stride 1, padding 1 -> 8x8 output.
    # 2 * 1 * 4 * 64 * 3 * 9 = 13,824 FLOPs; bytes: input 192 + weight 108 + output 256 elements, fp32.
    cost = conv_cost([1, 3, 8, 8], [4, 3, 3, 3], "float", stride=1, padding=1, dilation=1)
    assert cost.category == CONVOLUTION and cost.params["out"] == [8, 8]
    assert cost.flops == 13_824
    assert cost.min_bytes == (192 + 108 + 256) * 4


def test_conv_stride_dilation_and_groups() -> None:
    # 32x32, k=3, stride 2, padding 1: (32 + 2 - 2 - 1) // 2 + 1 = 16.
    strided = conv_cost([2, 8, 32, 32], [16, 8, 3, 3], "float", stride=2, padding=1, dilation=1)
    assert strided.params["out"] == [16, 16]
    assert strided.flops == 2 * 2 * 16 * 256 * 8 * 9
    # dilation 2 makes a 3x3 kernel span 5: (32 + 0 - 4 - 1) // 1 + 1 = 28.
    dilated = conv_cost([1, 8, 32, 32], [8, 8, 3, 3], "float", stride=1, padding=0, dilation=2)
    assert dilated.params["out"] == [28, 28]
    # depthwise (groups = channels = 8): each output channel sees 1 input channel.
    depthwise = conv_cost([1, 8, 32, 32], [8, 1, 3, 3], "float", stride=1, padding=1, dilation=1, groups=8)
    assert depthwise.flops == 2 * 1 * 8 * 1024 * 1 * 9


def test_convolution_op_reads_concrete_arguments_and_skips_without_them() -> None:
    # ViT patch embedding: 16x16 kernel, stride 16 on 224x224 -> 14x14; with bias.
    dims = [[4, 3, 224, 224], [768, 3, 16, 16], [768], [], [], [], [], [], []]
    types = ["float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"]
    concrete = ["", "", "", "[16, 16]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]
    cost = estimate("aten::convolution", _inputs(dims, types, concrete))
    assert cost is not None
    out = 4 * 768 * 14 * 14
    assert cost.flops == 2 * out * 3 * 16 * 16 + out
    # Without stride and padding the output size is unknowable: no estimate rather than a guess.
    assert estimate("aten::convolution", _inputs(dims, types)) is None


# --- memory-bound ops ------------------------------------------------------------------------


def test_elementwise_bytes_count_broadcast_inputs_at_their_own_size() -> None:
    # [16,16,559,64] * [1,1,559,64] in bf16: read both, write the broadcast result.
    big, small = 16 * 16 * 559 * 64, 559 * 64
    cost = estimate("aten::mul", _inputs([[16, 16, 559, 64], [1, 1, 559, 64]], [BF16, BF16]))
    assert cost is not None
    assert cost.min_bytes == (big + small + big) * 2 and cost.flops == big


def test_copy_with_cast_reads_source_writes_destination() -> None:
    # copy_(dst fp32 [1024], src bf16 [1024]): 1024*2 read + 1024*4 written, no FLOPs.
    cost = estimate("aten::copy_", _inputs([[1024], [1024], []], ["float", BF16, "Scalar"]))
    assert cost is not None and cost.flops == 0 and cost.min_bytes == 1024 * 2 + 1024 * 4


def test_in_place_add_reads_and_writes_its_first_argument() -> None:
    cost = estimate("aten::add_", _inputs([[100], [100], []], ["float", "float", "Scalar"]))
    assert cost is not None and cost.min_bytes == 100 * 4 * 3  # read self, read other, write self


def test_unmodelled_op_has_no_estimate() -> None:
    assert estimate("aten::nonzero", _inputs([[10]], ["float"])) is None


# --- against TraceLens on the same H100 trace --------------------------------------------------


def _reference(name: str) -> list[dict[str, str]]:
    path = shared_trace(f"tracelens/reference_csvs/h100_qwen/{name}")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_gemm_flops_and_bytes_match_tracelens_reference() -> None:
    # TraceLens's GEMM.csv lists each GEMM shape of the H100 Qwen trace with GFLOPS and the data
    # it moves (MiB). Same conventions (2MNK, +MN for addmm's bias), computed independently.
    rows = _reference("GEMM.csv")
    assert rows
    for row in rows:
        dims = row["Input Dims_first"]
        types = row["Input type_first"]
        parsed = OpInputs.parse(json.dumps(ast.literal_eval(dims)), json.dumps(ast.literal_eval(types)))
        assert parsed is not None
        cost = estimate(row["name"], parsed)
        assert cost is not None, row["name"]
        assert cost.flops / 1e9 == pytest.approx(float(row["GFLOPS_first"]), rel=1e-9)
        assert cost.min_bytes / 2**20 == pytest.approx(float(row["Data Moved (MB)_first"]), rel=1e-9)


def test_sdpa_flops_and_bytes_match_tracelens_reference() -> None:
    rows = _reference("SDPA_fwd.csv")
    assert rows
    for row in rows:
        parsed = OpInputs.parse(json.dumps(ast.literal_eval(row["Input Dims_first"])),
                                json.dumps(ast.literal_eval(row["Input type_first"])),
                                json.dumps(ast.literal_eval(row["Concrete Inputs_first"])))
        assert parsed is not None
        cost = estimate(row["name"], parsed)
        assert cost is not None
        assert cost.params["causal"] == (row["param: causal"] == "True")
        assert cost.flops / 1e9 == pytest.approx(float(row["GFLOPS_first"]), rel=1e-9)
        assert cost.min_bytes / 2**20 == pytest.approx(float(row["Data Moved (MB)_first"]), rel=1e-9)
