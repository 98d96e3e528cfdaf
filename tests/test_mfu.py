"""MFU per step and per region: FLOPs checked against counts made without tracewhy (PyTorch's own
``with_flops`` fields, FlopCounterMode, TraceLens' tables), MFU against the datasheet peak."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import tracewhy
from conftest import GENERATED, TRACES, shared_trace
from tracewhy.analyses.mfu_steps import DEVICE_SPAN, HOST_SPAN, MfuResult, measure_mfu
from tracewhy.analyses.op_inputs import OpInputs
from tracewhy.analyses.shapes import estimate
from tracewhy.analyses.steps import steps

FLOPS_TRACE = GENERATED / "cpu_flops_attention.pt.trace.json.gz"
#: The ops PyTorch's with_flops counts that are matrix math (torch/csrc/profiler/util.cpp).
TORCH_MATH_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::conv2d"}
H100_BF16_DENSE = 989.5e12  # NVIDIA H100 SXM datasheet: 1,979 TFLOPS BF16 with sparsity, halved


def _raw(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


@pytest.fixture(scope="module")
def cpu_run() -> tuple[dict[str, Any], MfuResult]:
    t = tracewhy.load(FLOPS_TRACE)
    return _raw(FLOPS_TRACE), measure_mfu(t, steps(t))


def _step_bounds(doc: dict[str, Any]) -> list[tuple[str, float, float]]:
    """Each ProfilerStep's name and window in the file's microseconds: its start to the next's."""
    marks = sorted((e["ts"], e["name"], e["dur"]) for e in doc["traceEvents"]
                   if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))
    ends = [m[0] for m in marks[1:]] + [float("inf")]
    return [(name, ts, end) for (ts, name, _), end in zip(marks, ends, strict=True)]


def _math_ops_with_flops(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] in TORCH_MATH_OPS
            and (e.get("args") or {}).get("flops")]


def test_shape_formulas_agree_with_each_flops_field(cpu_run: tuple[dict[str, Any], MfuResult]) -> None:
    # Every op the profiler counted, estimated from its own recorded shapes: within 5% (addmm and
    # conv2d differ by their bias, which PyTorch leaves out: 1.4% and 1.9% here).
    doc, _ = cpu_run
    ops = _math_ops_with_flops(doc)
    assert {e["name"] for e in ops} == {"aten::mm", "aten::addmm", "aten::conv2d"}
    for e in ops:
        a = e["args"]
        cost = estimate(e["name"], OpInputs(a["Input Dims"], a["Input type"], a["Concrete Inputs"]))
        assert cost is not None, e["name"]
        assert cost.flops == pytest.approx(a["flops"], rel=0.05), (e["name"], a["Input Dims"])


def test_step_flops_prefer_the_trace_and_match_its_fields(cpu_run: tuple[dict[str, Any], MfuResult]) -> None:
    # Per step, from the raw file: the flops fields of the ops starting in the step. MFU's count
    # uses them where the trace has them (no op counted twice: linear's field is its addmm's), and
    # the shape formulas for the same ops come within 5%.
    doc, r = cpu_run
    ops = _math_ops_with_flops(doc)
    bounds = _step_bounds(doc)
    assert [b[0] for b in bounds] == r.steps.get_column("step").to_list()
    for name, lo, hi in bounds:
        raw = sum(e["args"]["flops"] for e in ops if lo <= e["ts"] < hi)
        lo_ns, hi_ns = _ns(lo), _ns(hi)
        counted = r.ops.filter((pl.col("ts_ns") >= lo_ns) & (pl.col("ts_ns") < hi_ns)
                               & pl.col("trace_flops").is_not_null())
        assert counted.get_column("trace_flops").sum() == raw, name
        assert counted.get_column("flops").sum() == raw, name
        assert counted.get_column("shapes_flops").sum() == pytest.approx(raw, rel=0.05), name


def _ns(us: float) -> float:
    """A raw timestamp (us) in the model's ns."""
    return round(us * 1e3) if us != float("inf") else us


def test_step_flops_match_flop_counter_mode(cpu_run: tuple[dict[str, Any], MfuResult]) -> None:
    # FlopCounterMode over one identical forward and backward (written into the trace by its
    # generator), with torch's own attention formulas for the CPU attention op it does not count:
    # convolution backward (weight gradient only: the input needs none) and attention forward and
    # backward must all be in each step's FLOPs.
    doc, r = cpu_run
    counter = doc["flop_counter_step"]
    expected = sum(counter["ops"].values()) + counter["sdpa_call"]["forward"] + counter["sdpa_call"]["backward"]
    assert r.steps.height == 3
    for flops in r.steps.get_column("flops").to_list():
        assert flops == pytest.approx(expected, rel=1e-9)
    assert r.steady_flops_per_step == pytest.approx(expected, rel=1e-9)
    assert r.flops_source == "trace+shapes"


def test_cpu_trace_gives_flops_but_no_mfu(cpu_run: tuple[dict[str, Any], MfuResult]) -> None:
    _, r = cpu_run
    assert r.peak_name is None and r.steady_mfu is None
    assert r.peak_note is not None and "no GPU work" in r.peak_note
    assert r.steps.get_column("mfu").null_count() == r.steps.height
    assert r.steps.get_column("flop_per_s").null_count() == 0
    assert r.regions.get_column("mfu").null_count() == r.regions.height


def test_region_flops_are_the_ops_nested_in_it(cpu_run: tuple[dict[str, Any], MfuResult]) -> None:
    # From the raw file: the flops fields of the math ops inside each record_function range on
    # its thread, and (attention) torch's count of the attention call it holds.
    doc, r = cpu_run
    events = doc["traceEvents"]
    counter = doc["flop_counter_step"]["sdpa_call"]
    regions = {row["region"]: row for row in r.regions.iter_rows(named=True)}
    assert set(regions) == {"conv_stem", "attention", "mlp", "head"}
    for name, extra in (("conv_stem", 0), ("attention", counter["forward"]), ("mlp", 0), ("head", 0)):
        spans = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == name]
        raw = sum(e["args"]["flops"] for e in _math_ops_with_flops(doc) for s in spans
                  if s["tid"] == e["tid"] and s["ts"] <= e["ts"] < s["ts"] + s["dur"])
        if name == "head":  # torch.matmul of [4, 32] @ [32, 10] runs as mm: 2*4*10*32
            assert raw == 2 * 4 * 10 * 32 * len(spans)
        assert regions[name]["flops"] == pytest.approx(raw + extra * len(spans), rel=1e-9), name
        assert regions[name]["instances"] == len(spans) == 3
        assert regions[name]["time_basis"] == HOST_SPAN
        assert regions[name]["time_ns"] == pytest.approx(sum(s["dur"] for s in spans) * 1e3, abs=len(spans))


@pytest.fixture(scope="module")
def qwen() -> MfuResult:
    t = tracewhy.load(shared_trace("tracelens/h100_qwen1.5-0.5b_bs16_seq2048.json.gz"))
    return measure_mfu(t, steps(t))


def _tracelens_gflops(name: str) -> float:
    path = shared_trace(f"tracelens/reference_csvs/h100_qwen/{name}")
    with open(path, newline="") as f:
        return sum(float(row["GFLOPS_first"]) * int(row["name_count"]) for row in csv.DictReader(f))


def test_h100_step_flops_match_tracelens_and_mfu_uses_the_bf16_peak(qwen: MfuResult) -> None:
    # TraceLens' GEMM and attention tables of the same trace (their FLOPs per shape times calls)
    # sum to the step's FLOPs; the one step's MFU is those FLOPs over its window at the H100
    # SXM's dense BF16 peak.
    step = qwen.steps.row(0, named=True)
    tracelens = (_tracelens_gflops("GEMM.csv") + _tracelens_gflops("SDPA_fwd.csv")) * 1e9
    assert step["flops"] == pytest.approx(tracelens, rel=1e-4)
    assert qwen.peak_name == "H100 SXM" and qwen.flops_source == "shapes"
    # (within 1e-6: the LM head's one fp32 matmul, 35,776 FLOPs, is held against the fp32 peak)
    assert step["mfu"] == pytest.approx(step["flops"] / (step["window_ns"] * 1e-9 * H100_BF16_DENSE), rel=1e-6)
    assert 0.05 < step["mfu"] < 0.5
    assert qwen.steady_mfu == pytest.approx(step["mfu"])


def test_h100_regions_are_timed_by_the_device_work_they_launched(qwen: MfuResult) -> None:
    layers = qwen.regions.filter(pl.col("region").str.starts_with("nn.Module: Qwen2DecoderLayer_"))
    assert layers.height == 24
    assert set(layers.get_column("time_basis").to_list()) == {DEVICE_SPAN}
    window = qwen.steps.get_column("window_ns")[0]
    # Each layer's device span is a slice of the step, and the 24 layers together fit in it.
    assert 0 < layers.get_column("time_ns").sum() < window
    assert layers.get_column("flops").n_unique() == 1  # the same layer, the same math


def _with_flops_traces() -> list[tuple[Path, bytes]]:
    """The shared traces captured with with_flops, each with its decompressed text."""
    out = []
    for path in sorted(TRACES.rglob("*.json.gz")) if TRACES.is_dir() else []:
        with gzip.open(path) as f:
            head = f.read(1 << 16)  # Kineto writes its capture options before traceEvents
            if b'"with_flops"' in head.split(b'"traceEvents"')[0]:
                out.append((path, head + f.read()))
    return out


def test_every_shared_trace_with_flops_fields_agrees_with_the_shape_formulas() -> None:
    # The shared traces captured with with_flops (TraceLens' torch 2.6 runs) carry the flag but,
    # today, no per-op field: their exporter left the counts out, as torch 2.13's does. Any op
    # that carries one is checked as the generated trace's are.
    found = _with_flops_traces()
    assert len(found) >= 10
    for path, data in found:
        if b'"flops":' not in data:
            continue
        for e in _math_ops_with_flops(json.loads(data)):
            a = e["args"]
            cost = estimate(e["name"], OpInputs(a["Input Dims"], a["Input type"], a.get("Concrete Inputs")))
            assert cost is not None and cost.flops == pytest.approx(a["flops"], rel=0.05), (path.name, e["name"])


def test_steps_and_account_say_mfu(capsys: pytest.CaptureFixture[str]) -> None:
    from tracewhy.cli import main

    trace = str(shared_trace("tracelens/h100_qwen1.5-0.5b_bs16_seq2048.json.gz"))
    assert main(["steps", trace, "--json"]) == 0
    mfu = json.loads(capsys.readouterr().out)["mfu"]
    assert mfu["peak"] == "H100 SXM" and mfu["steps"][0]["mfu"] == pytest.approx(mfu["steady_mfu"])
    assert main(["steps", trace]) == 0
    out = capsys.readouterr().out
    assert "│ 11.8% │" in out and f"MFU {100 * mfu['steady_mfu']:.1f}% of the H100 SXM peak" in out
    assert main(["account", str(FLOPS_TRACE), "--json"]) == 0
    account = json.loads(capsys.readouterr().out)["mfu"]
    assert account["steady_mfu"] is None and account["steady_flops_per_step"] == 7_151_104
    assert main(["account", str(FLOPS_TRACE)]) == 0
    assert "MFU: none, no GPU work in the trace" in capsys.readouterr().out


def test_nested_math_counts_once_from_the_trace_field_and_regions_time_their_device_work(tmp_path: Path) -> None:
    # linear holds addmm (PyTorch's flops field is on addmm): one op counted, from the field, at
    # the H100's BF16 peak. The step's window is 1 ms; the region's device span is its one
    # kernel's 200 us, whatever its host range (0.5 ms) says.
    from builders import KinetoBuilder

    flops = 2 * 1024 * 4096 * 4096
    shapes = {"Input Dims": [[1024, 4096], [4096, 4096], [4096]],
              "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]}
    b = KinetoBuilder(header={"schemaVersion": 1, "deviceProperties": [
        {"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}]})
    b.annotation("ProfilerStep#3", 0, 1000).annotation("block", 5, 500)
    b.op("aten::linear", 10, 90, **shapes)
    b.op("aten::addmm", 20, 70, **{"Input Dims": [[4096], [1024, 4096], [4096, 4096]],
                                  "Input type": shapes["Input type"], "flops": flops})
    b.launch("sm90_xmma_gemm_bf16bf16_bf16f32", 30, 5, 200, 200)
    t = tracewhy.load(b.write(tmp_path / "t.json"))
    r = measure_mfu(t, steps(t))
    assert r.ops.select("name", "source", "flops").rows() == [("aten::linear", "trace", float(flops))]
    ideal_s = flops / H100_BF16_DENSE
    step = r.steps.row(0, named=True)
    assert step["flops"] == flops and step["mfu"] == pytest.approx(ideal_s / 1e-3, rel=1e-6)
    region = r.regions.row(0, named=True)
    assert (region["region"], region["time_ns"], region["time_basis"]) == ("block", 200_000, DEVICE_SPAN)
    assert region["mfu"] == pytest.approx(ideal_s / 200e-6, rel=1e-6)
