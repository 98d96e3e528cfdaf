"""Inference steps classed prefill, decode or mixed, tokens per second and the decode steps'
memory bandwidth (MBU), on vLLM and SGLang captures and on a generated ``generate`` loop. Every
expected number is computed here from the raw JSON: the iteration's own annotation, the
ProfilerStep spans, the GEMM and attention ops' recorded shapes."""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

import tracewhy as tw
from conftest import GENERATED, shared_trace
from tracewhy.analyses.step_bytes import DecodeBandwidth, decode_bandwidth
from tracewhy.analyses.step_classes import ClassCol, StepClasses, step_classes
from tracewhy.analyses.step_verdicts import Evidence, StepClass, annotation_verdict, shape_verdict
from tracewhy.analyses.steps import steps
from tracewhy.analyses.throughput import ThroughputOptions
from tracewhy.cli import main

GENERATE = GENERATED / "cpu_generate_kv_cache.pt.trace.json.gz"
MI300X_BYTES_PER_S = 5.3e12  # AMD MI300X datasheet: 5.3 TB/s HBM3
BYTES = {"c10::BFloat16": 2, "float": 4}


@functools.cache
def _events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return events


def _ns(us: float) -> int:
    return round(us * 1000)


@functools.cache
def _classed(path: Path, rate: ThroughputOptions | None = None) -> tuple[StepClasses, DecodeBandwidth | None]:
    trace = tw.load(path)
    classes = step_classes(trace, steps(trace), rate)
    assert classes is not None
    return classes, decode_bandwidth(trace, classes)


def _iteration(events: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    """The engine's one iteration annotation on the host (cat user_annotation)."""
    (hit,) = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith(prefix)]
    return hit


def _step_ns(events: list[dict[str, Any]], it: dict[str, Any]) -> int:
    """The iteration's time: from its annotation's start to the end of its annotation or of the
    GPU work it launched, whichever is later (every GPU activity of these captures is launched
    inside the one iteration: checked by correlation id)."""
    inside = {e["args"]["correlation"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
              and it["ts"] <= e["ts"] < it["ts"] + it["dur"] and "correlation" in e.get("args", {})}
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert all(e["args"]["correlation"] in inside for e in gpu)
    return _ns(max([it["ts"] + it["dur"], *(e["ts"] + e["dur"] for e in gpu)])) - _ns(it["ts"])


def _busy_ns(events: list[dict[str, Any]]) -> int:
    """Union of the GPU activities' intervals, in ns."""
    spans = sorted((_ns(e["ts"]), _ns(e["ts"] + e["dur"])) for e in events
                   if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    total, end = 0, -1
    for lo, hi in spans:
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def _outermost(events: list[dict[str, Any]], names: set[str], lo: float, hi: float) -> list[dict[str, Any]]:
    """CPU ops of ``names`` starting in [lo, hi) that no other op of ``names`` on their thread contains."""
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e["name"] in names and lo <= e["ts"] < hi),
                 key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    kept: list[dict[str, Any]] = []
    for e in ops:
        if kept and kept[-1]["tid"] == e["tid"] and e["ts"] < kept[-1]["ts"] + kept[-1]["dur"]:
            continue
        kept.append(e)
    return kept


def _nbytes(dims: list[int], dtype: str) -> int:
    return math.prod(dims) * BYTES[dtype]


# --- the evidence, on its own ---------------------------------------------------------------

@pytest.mark.parametrize(("name", "cls", "tokens"), [
    ("execute_8192_context_9(sq8155sk8430)_generation_37(sq37sk34489)", StepClass.MIXED, 8192),
    ("execute_32_context_0(sq0sk0)_generation_32(sq32sk55086)", StepClass.DECODE, 32),
    ("execute_context_1(888_788544)_generation_0(0)", StepClass.PREFILL, None),
    ("step[DECODE bs=32]", StepClass.DECODE, 32),
    ("step[EXTEND bs=4]", StepClass.PREFILL, None),
])
def test_engine_annotations_state_the_class(name: str, cls: str, tokens: int | None) -> None:
    v = annotation_verdict(name)
    assert v is not None and (v.step_class, v.evidence, v.tokens) == (cls, Evidence.ANNOTATION, tokens)


def test_other_annotations_state_nothing() -> None:
    assert annotation_verdict("execute_model") is None
    assert annotation_verdict("ProfilerStep#3") is None
    assert annotation_verdict("execute_0_context_0(x)_generation_0(y)") is None


def test_query_length_one_per_sequence_is_a_decode() -> None:
    assert shape_verdict([(4, 1), (4, 1)]) is not None
    assert shape_verdict([(4, 1)]).step_class == StepClass.DECODE  # type: ignore[union-attr]
    assert shape_verdict([(4, 128)]).step_class == StepClass.PREFILL  # type: ignore[union-attr]
    assert shape_verdict([(4, 128), (8, 1)]).step_class == StepClass.MIXED  # type: ignore[union-attr]
    assert shape_verdict([]) is None


# --- vLLM and SGLang captures (one engine iteration each, no ProfilerStep) ---------------------

@pytest.fixture(scope="module")
def vllm_mixed() -> tuple[Path, StepClasses, DecodeBandwidth | None]:
    path = shared_trace("tracelens/mi300x_vllm_prefilldecode_piecewise_graph.json.gz")
    return (path, *_classed(path))


def test_vllm_prefill_and_decode_in_one_iteration_is_mixed(vllm_mixed: tuple[Path, StepClasses, Any]) -> None:
    path, classes, bandwidth = vllm_mixed
    events = _events(path)
    it = _iteration(events, "execute_")
    (row,) = classes.steps.iter_rows(named=True)
    assert row[ClassCol.CLASS] == StepClass.MIXED
    assert row[ClassCol.EVIDENCE] == Evidence.ANNOTATION
    assert row[ClassCol.TOKENS] == int(it["name"].split("_")[1]) == 8192
    # The iteration's GPU work runs 151 ms after its annotation closes (the GPU was busy with work
    # queued before the capture): its time runs to the end of that work, its GPU busy is less.
    window = _step_ns(events, it)
    assert abs(row[ClassCol.WINDOW] - window) <= 2
    assert window > 10 * _ns(it["dur"])
    (mixed,) = classes.classes
    assert abs(mixed.gpu_busy_ns - _busy_ns(events)) <= 400  # (ns rounding of 413 kernels and copies)
    timed = [e for e in events if "dur" in e and e.get("ph") == "X"]
    span = _ns(max(e["ts"] + e["dur"] for e in timed)) - _ns(min(e["ts"] for e in timed))
    assert mixed.share == pytest.approx(window / span, rel=1e-3)
    assert mixed.tokens_per_s == pytest.approx(8192e9 / window, rel=1e-3)
    assert bandwidth is None  # no decode-only step


def test_sglang_decode_iteration_and_why_its_bytes_are_unknown() -> None:
    path = shared_trace("tracelens/mi300x_sglang_qwen3-8b_decode.json.gz")
    classes, bandwidth = _classed(path)
    events = _events(path)
    it = _iteration(events, "execute_")
    (decode,) = classes.classes
    assert (decode.step_class, decode.count, decode.tokens) == (StepClass.DECODE, 1, 32)
    assert abs(decode.median_ns - _step_ns(events, it)) <= 2
    # The whole model ran as one graph replay: no GEMM or attention op with shapes in the window.
    shaped = _outermost(events, {"aten::mm", "aten::linear", "aten::addmm", "aten::matmul",
                                 "aten::scaled_dot_product_attention"}, it["ts"], it["ts"] + it["dur"])
    assert shaped == []
    assert bandwidth is not None and bandwidth.bytes_read == 0 and bandwidth.mbu is None
    assert bandwidth.note is not None and "unknown" in bandwidth.note
    graph = [e for e in events if e.get("cat") == "kernel"]
    assert bandwidth.unshaped_kernel_ns > 0.9 * sum(_ns(e["dur"]) for e in graph)



def test_sglang_decode_mbu_from_the_bytes_the_user_gives(capsys: pytest.CaptureFixture[str]) -> None:
    """Where a graph replay hides the shapes, ``--decode-bytes`` (the model's weights plus its KV
    cache, which the user knows) gives the MBU: those bytes over the iteration's own time (from the
    raw JSON) against the MI300X's 5.3 TB/s; not a lower bound, and the line says they were given."""
    path = shared_trace("tracelens/mi300x_sglang_qwen3-8b_decode.json.gz")
    events = _events(path)
    given = 17_000_000_000  # Qwen3-8B in bf16 (~16.4 GB) plus a KV cache: a size the user states
    step_ns = _step_ns(events, _iteration(events, "execute_"))
    assert main(["steps", str(path), "--decode-bytes", "17GB", "--json", "--no-cache"]) == 0
    b = json.loads(capsys.readouterr().out)["inference"]["decode_bandwidth"]
    assert b["given_bytes_per_step"] == given and b["time_ns"] == pytest.approx(step_ns, abs=2)
    assert b["bytes_per_s"] == pytest.approx(given * 1e9 / step_ns, rel=1e-6)
    assert b["mbu"] == pytest.approx(given * 1e9 / step_ns / MI300X_BYTES_PER_S, rel=1e-6)
    assert main(["steps", str(path), "--decode-bytes", "17GB", "--no-cache"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(as given)" in text and "at least" not in text and "--decode-bytes" in text
    assert main(["steps", str(path), "--decode-bytes", "12"]) == 2  # a size needs its unit
    assert "expected a size with its unit" in capsys.readouterr().err

def test_vllm_full_graph_decode_mbu_is_a_lower_bound_from_the_lm_head() -> None:
    path = shared_trace("tracelens/mi300x_vllm_decode_fullgraph_replay.json.gz")
    classes, b = _classed(path)
    events = _events(path)
    it = _iteration(events, "execute_")
    assert classes.classes[0].step_class == StepClass.DECODE
    gemms = _outermost(events, {"aten::mm", "aten::linear", "aten::addmm", "aten::matmul"},
                       it["ts"], it["ts"] + it["dur"])
    weights = sum(_nbytes(g["args"]["Input Dims"][1], g["args"]["Input type"][1]) for g in gemms)
    assert weights == 2880 * 201088 * 2  # the LM head, bf16: the only GEMM outside the graph
    assert b is not None
    assert (b.weight_bytes, b.kv_bytes, b.gemm_calls) == (weights, 0, len(gemms))
    # The device writes no name; its properties (gfx942, 304 CUs, 192 GiB) are an MI300X's.
    assert b.peak_bytes_per_s == MI300X_BYTES_PER_S
    assert b.mbu == pytest.approx(weights * 1e9 / _step_ns(events, it) / MI300X_BYTES_PER_S, rel=1e-6)
    assert b.unshaped_kernel_ns > 0 and b.note is not None and "lower bound" in b.note


def test_b200_vllm_eager_iteration_is_a_prefill() -> None:
    path = shared_trace("tracelens/b200_vllm_eager_tp8_rank0.json.gz")
    classes, bandwidth = _classed(path)
    events = _events(path)
    it = _iteration(events, "execute_")
    (prefill,) = classes.classes
    assert (prefill.step_class, prefill.count) == (StepClass.PREFILL, 1)
    assert abs(prefill.median_ns - _step_ns(events, it)) <= 2
    assert bandwidth is None


@pytest.mark.parametrize("relative", ["tracelens/h100_bert-small_bs1_seq512.json.gz",
                                      "tracelens/mi300x_falconsai-vit_bs4_224.json.gz"])
def test_a_forward_pass_over_whole_sequences_is_no_prefill(relative: str) -> None:
    """An encoder's (BERT fill-mask) or a ViT's attention reads no KV cache: every call's key is
    as long as its query. Shapes then class nothing, and the trace has no inference steps."""
    path = shared_trace(relative)
    calls = [e["args"]["Input Dims"] for e in _events(path)
             if e.get("cat") == "cpu_op" and e["name"] == "aten::scaled_dot_product_attention"]
    assert calls and all(d[0][2] == d[1][2] and d[0][2] > 1 for d in calls)
    trace = tw.load(path)
    assert step_classes(trace, steps(trace)) is None


# --- a generated generate loop: the shapes decide -------------------------------------------

@pytest.fixture(scope="module")
def generate_loop() -> tuple[list[dict[str, Any]], StepClasses, DecodeBandwidth | None]:
    return (_events(GENERATE), *_classed(GENERATE))


def _profiler_steps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])


def test_generate_loop_prefill_then_decodes(generate_loop: tuple[list[dict[str, Any]], StepClasses, Any]) -> None:
    events, classes, _ = generate_loop
    marks = _profiler_steps(events)
    table = classes.steps
    assert table.get_column(ClassCol.CLASS).to_list() == [StepClass.PREFILL] + [StepClass.DECODE] * 6
    assert set(table.get_column(ClassCol.EVIDENCE).to_list()) == {Evidence.SHAPES}
    # Tokens: batch x query length of the first attention call (2 x 32 prompt, then 2 x 1).
    assert table.get_column(ClassCol.TOKENS).to_list() == [64] + [2] * 6
    windows = [_ns(b["ts"]) - _ns(a["ts"]) for a, b in itertools.pairwise(marks)]
    decode = classes.classes[1]
    assert decode.count == 6
    assert abs(decode.total_ns - (sum(windows[1:]) + _ns(marks[-1]["dur"]))) <= 6


def test_generate_loop_decode_bytes_match_the_recorded_shapes(
        generate_loop: tuple[list[dict[str, Any]], StepClasses, DecodeBandwidth | None]) -> None:
    events, classes, b = generate_loop
    marks = _profiler_steps(events)
    weights = kv = 0
    for m in marks[1:]:
        for op in _outermost(events, {"aten::linear", "aten::scaled_dot_product_attention"}, m["ts"],
                             m["ts"] + 1e12 if m is marks[-1] else marks[marks.index(m) + 1]["ts"]):
            dims, types = op["args"]["Input Dims"], op["args"]["Input type"]
            if op["name"] == "aten::linear":
                weights += sum(_nbytes(dims[i], types[i]) for i in (1, 2) if dims[i])
            else:
                kv += _nbytes(dims[1], types[1]) + _nbytes(dims[2], types[2])
    assert b is not None
    assert (b.weight_bytes, b.kv_bytes) == (weights, kv)
    # Per step: 2 layers x (qkv, out, up, down with biases) + the LM head, float32.
    per_step = 2 * 4 * (64 * 192 + 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64) + 4 * 64 * 256
    assert weights == 6 * per_step
    assert b.bytes_per_s == pytest.approx((weights + kv) * 1e9 / classes.classes[1].total_ns)
    assert b.mbu is None  # a CPU capture: no device bandwidth


def test_tokens_per_step_fills_the_steps_whose_tokens_are_not_recorded() -> None:
    path = shared_trace("tracelens/b200_vllm_eager_tp8_rank0.json.gz")
    classes, _ = _classed(path, ThroughputOptions(888, "tokens"))
    (prefill,) = classes.classes
    assert prefill.tokens == 888
    assert prefill.tokens_per_s == pytest.approx(888e9 / prefill.total_ns)


# --- the command --------------------------------------------------------------------------

def test_steps_json_has_the_classes_and_mbu(capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_trace("tracelens/mi300x_vllm_decode_fullgraph_replay.json.gz")
    assert main(["steps", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    inference = doc["inference"]
    assert [c["step_class"] for c in inference["classes"]] == [StepClass.DECODE]
    assert inference["decode_bandwidth"]["mbu"] > 0


def test_steps_of_a_training_trace_have_no_classes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["steps", str(GENERATED / "cpu_eager_schedule.pt.trace.json.gz"), "--json"]) == 0
    assert "inference" not in capsys.readouterr().out


def test_tokens_per_step_with_items_per_step_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["steps", str(GENERATE), "--tokens-per-step", "2", "--items-per-step", "2"]) == 2
    err = capsys.readouterr().err
    assert "--tokens-per-step" in err and "Traceback" not in err


def test_account_and_diagnose_split_the_step_by_class(capsys: pytest.CaptureFixture[str]) -> None:
    """The generated loop's account (its prefill is warm-up there) has the decode steps' parts;
    they add up to the decode steps' mean window, computed from the ProfilerStep spans."""
    events = _events(GENERATE)
    marks = _profiler_steps(events)
    starts = [_ns(m["ts"]) for m in marks]
    windows = [b - a for a, b in itertools.pairwise(starts)] + [_ns(marks[-1]["dur"])]
    assert main(["account", str(GENERATE), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_class = doc["parts_by_class"]
    assert {r["step_class"] for r in by_class} == {StepClass.DECODE}
    assert {r["steps"] for r in by_class} == {6}
    mean_decode = sum(windows[1:]) / 6
    assert sum(r["ns_per_step"] for r in by_class) == pytest.approx(mean_decode, rel=1e-3)
    assert [c["step_class"] for c in doc["inference"]["classes"]] == [StepClass.PREFILL, StepClass.DECODE]
    assert main(["diagnose", str(shared_trace("tracelens/mi300x_vllm_prefilldecode_piecewise_graph.json.gz")),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["step_class"] for c in doc["inference"]["classes"]] == [StepClass.MIXED]
    assert {r["step_class"] for r in doc["parts_by_class"]} == {StepClass.MIXED}


def test_a_generate_loops_first_step_is_its_prefill_not_a_cold_start(capsys: pytest.CaptureFixture[str]) -> None:
    """ProfilerStep#0 is left out of the steady figures (they are the decode steps'), for being the
    prefill: its attention queries are the 32-token prompt (raw JSON), not for being the run's
    first iteration."""
    events = _events(GENERATE)
    first, second = _profiler_steps(events)[:2]
    sdpa = [e["args"]["Input Dims"][0][2] for e in events if e["name"] == "aten::scaled_dot_product_attention"
            and first["ts"] <= e["ts"] < second["ts"]]
    assert sdpa and set(sdpa) == {32}
    assert main(["steps", str(GENERATE), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["warmup"] == 1 and "prefill" in doc["warmup_reason"]
    assert doc["stats"]["count"] == 6
