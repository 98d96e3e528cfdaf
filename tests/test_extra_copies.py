"""Extra copies on the step's path (analyses/extra_copies.py, findings/extra_copies.py): a
transposed input made contiguous before a matmul and a float -> half -> float round trip, present
in one real CPU capture and absent from its fixed twin (scripts/gen_traces/copy_traces.py),
counted against the raw events; and silent on real GPU traces whose copies are essential (a
contiguous layout fused attention or a later cast needs)."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

import tracewhy
from conftest import GENERATED, shared_trace
from tracewhy.analyses.account import step_model
from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.extra_copies import CONTIGUOUS, ROUND_TRIP, ExtraCopiesResult
from tracewhy.analyses.what_if import predict
from tracewhy.analyses.what_if_removals import RemoveSlices
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.findings.extra_copies import extra_copies_result
from tracewhy.findings.model import Severity
from tracewhy.model.trace import Trace
from tracewhy.reports.diagnose import Report, diagnose

PRESENT = GENERATED / "cpu_copies_present.pt.trace.json.gz"
ABSENT = GENERATED / "cpu_copies_absent.pt.trace.json.gz"
#: Bytes per element, written here from the dtypes' definitions (not from tensor_sizes).
WIDTH = {"float": 4, "c10::Half": 2}


def _diagnosed(path: Path) -> tuple[Trace, Report]:
    trace = tracewhy.load(path)
    return trace, diagnose(trace)


@pytest.fixture(scope="module")
def present() -> tuple[Trace, Report]:
    return _diagnosed(PRESENT)


@pytest.fixture(scope="module")
def absent() -> tuple[Trace, Report]:
    return _diagnosed(ABSENT)


def _result(trace: Trace) -> ExtraCopiesResult:
    return extra_copies_result(Context(trace, DiagnoseOptions()))


def _raw_per_step(path: Path) -> list[dict[str, Any]]:
    """Per ProfilerStep, from the raw events: contiguous calls with an aten::clone inside them
    (shape, dtype), and dtype-changing aten::copy_ writes (shape, destination, source)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    out = []
    for step in sorted((e for e in events if str(e["name"]).startswith("ProfilerStep#")), key=lambda e: e["ts"]):
        mine = [e for e in ops if step["ts"] <= e["ts"] < step["ts"] + step["dur"]]

        def within(outer: dict[str, Any], inner: dict[str, Any]) -> bool:
            return outer["tid"] == inner["tid"] and outer["ts"] <= inner["ts"] and \
                inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]

        contiguous = [(e["args"]["Input Dims"][0], e["args"]["Input type"][0]) for e in mine
                      if e["name"] == "aten::contiguous" and any(c["name"] == "aten::clone" and within(e, c)
                                                                 for c in mine)]
        casts = [(e["args"]["Input Dims"][0], *e["args"]["Input type"][:2]) for e in mine
                 if e["name"] == "aten::copy_" and e["args"]["Input type"][0] != e["args"]["Input type"][1]
                 and e["args"]["Input Dims"][0] and e["args"]["Input Dims"][0] == e["args"]["Input Dims"][1]]
        out.append({"contiguous": contiguous, "casts": casts})
    return out


def _bytes(shape: list[int], dtype: str) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * WIDTH[dtype]


def test_counts_and_bytes_match_the_raw_events(present: tuple[Trace, Report]) -> None:
    raw = _raw_per_step(PRESENT)
    # Every step: one contiguous copy; forward's two casts and backward's two (its gradient).
    assert all(s["contiguous"] == [([16, 256, 64], "float")] for s in raw)
    assert all(sorted(s["casts"]) == sorted([([16, 256, 128], "c10::Half", "float"),
                                             ([16, 256, 128], "float", "c10::Half")] * 2) for s in raw)
    r = _result(present[0])
    steady = int(present[1].steps.table.get_column("steady").sum())
    by_kind = {c.kind: c for c in r.copies}
    assert set(by_kind) == {CONTIGUOUS, ROUND_TRIP}
    contiguous, trip = by_kind[CONTIGUOUS], by_kind[ROUND_TRIP]
    assert (contiguous.shape, contiguous.dtypes, contiguous.consumer) == ((16, 256, 64), ("float",), "aten::matmul")
    assert contiguous.calls == steady and contiguous.bytes == steady * _bytes([16, 256, 64], "float")
    assert (trip.shape, trip.dtypes) == ((16, 256, 128), ("float", "c10::Half"))
    assert trip.calls == 2 * steady  # forward's h.half().float() and backward's cast of its gradient
    per_trip = sum(_bytes(list(shape), dst) for shape, dst, _ in raw[-1]["casts"]) // 2
    assert trip.bytes == trip.calls * per_trip


def test_finding_present_priced_by_the_replay(present: tuple[Trace, Report]) -> None:
    trace, report = present
    f = next(f for f in report.findings if f.code == Code.EXTRA_COPIES)
    raw = _raw_per_step(PRESENT)[-1]
    assert f.evidence["calls_per_step"] == len(raw["contiguous"]) + len(raw["casts"]) / 2
    assert f.evidence["bytes_per_step"] == sum(_bytes(s, d) for s, d in raw["contiguous"]) + sum(
        _bytes(s, dst) for s, dst, _ in raw["casts"])
    p = predict(step_model(trace), [RemoveSlices(_result(trace).removed, kinds=(Edge.HOST, Edge.LAUNCH, Edge.GPU))])
    assert p.saved_ns > 0 and f.recoverable_ns_per_step == p.saved_ns == f.evidence["saved_ns"]
    assert f.predicted_step_ns == p.predicted_ns
    assert f.evidence["line"]["file"] == "copy_traces.py"
    assert "aten::matmul" in f.statement and "float -> Half -> float" in f.statement


def test_absent_in_the_fixed_twin(absent: tuple[Trace, Report]) -> None:
    """The matmul reads the transposed view, no cast; .contiguous() on a contiguous tensor returns
    it before any op is dispatched (nothing recorded, nothing copied)."""
    trace, report = absent
    assert all(s["contiguous"] == [] and s["casts"] == [] for s in _raw_per_step(ABSENT))
    assert _result(trace).copies == ()
    assert Code.EXTRA_COPIES not in {f.code for f in report.findings}


def test_torchtidy_says_nothing_of_them_on_cpu() -> None:
    """TorchTidy's ExtraCUDACopyPattern matches only host-to-device copies of CUDA tensors: on
    this CPU run it reports the same (FP32 matmuls) with and without the planted copies."""
    texts = [p.with_name(p.name.replace(".pt.trace.json.gz", ".torchtidy.txt")).read_text(encoding="utf-8")
             for p in (PRESENT, ABSENT)]
    assert texts[0] == texts[1] and "Extra CUDA Copy" not in texts[0]


def _raw_copying_contiguous(path: Path) -> int:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        # PyTorch 1.9 (the resnet50 capture) writes op events as "Operator", later ones as "cpu_op".
        ops = [e for e in json.load(f)["traceEvents"]
               if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "Operator")]
    calls = [e for e in ops if e["name"] == "aten::contiguous"]
    return sum(1 for e in calls if any(c["name"] in ("aten::clone", "aten::copy_") and c["tid"] == e["tid"]
                                       and e["ts"] <= c["ts"] <= e["ts"] + e["dur"] for c in ops))


@pytest.mark.parametrize(("name", "copying"), [
    # HF Qwen2 makes q, k and v contiguous for scaled_dot_product_attention every layer: fused attention
    # wants the layout, so the copies are essential.
    ("tracelens/h100_qwen1.5-0.5b_bs16_seq2048.json.gz", True),
    # torchvision's to_tensor (num_workers=0: on the main thread) permutes each image contiguous and
    # then casts it: the cast keeps the strides it is given, so the copy sets the batch's layout.
    ("kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz", True),
    ("hta/mi250_minitoy_train_rocm6.2.json.gz", False),
    ("tracelens/h100_bert-small_bs1_seq512.json.gz", False),
])
def test_no_extra_copies_on_gpu_traces(name: str, copying: bool) -> None:
    path = shared_trace(name)
    assert (_raw_copying_contiguous(path) > 0) == copying
    assert _result(tracewhy.load(path)).copies == ()


def test_a_back_to_back_round_trip_on_a_real_capture_is_named_and_not_claimed() -> None:
    """HTA's CPU-ops-only capture casts one index tensor long -> int -> long, back to back, once
    in its one step (the raw copy_ writes say so); 44 us of a 75 ms step is stated at info, not
    claimed. Other casts of [1024] tensors there (int -> long, then long -> int of another tensor
    with indexing between) do not pair."""
    path = shared_trace("hta/edge_cpu_ops_only_no_deviceprops_rank0.json.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        ops = sorted((e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
                     key=lambda e: e["ts"])
    writes = [e["args"]["Input type"][:2] for e in ops if e["name"] == "aten::copy_"
              and e["args"]["Input Dims"][0] == [1024] and e["args"]["Input type"][0] != e["args"]["Input type"][1]]
    assert ["int", "long"] in writes and ["long", "int"] in writes
    back_to_back = [(a, b) for a, b in itertools.pairwise(writes) if a == ["int", "long"]]
    assert back_to_back == [(["int", "long"], ["long", "int"])]
    report = diagnose(tracewhy.load(path))
    f = next(f for f in report.findings if f.code == Code.EXTRA_COPIES)
    assert [(c["kind"], c["shape"], c["dtypes"], c["calls"]) for c in f.evidence["copies"]] == [
        (ROUND_TRIP, [1024], ["long", "int"], 1)]
    assert f.evidence["bytes_per_step"] == 1024 * (4 + 8)
    assert f.recoverable_ns_per_step == 0 and f.severity == Severity.INFO
