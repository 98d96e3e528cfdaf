"""Anti-patterns read off a trace alone (analyses/anti_patterns.py, findings/anti_patterns.py):
each present in one real capture and absent from its fixed twin (scripts/gen_traces/
anti_pattern_traces.py), compared with what torch's own pattern matcher (TorchTidy) reported on
the live profiler of the same run, and checked on real GPU traces from ../shared/traces."""

from __future__ import annotations

import gzip
import itertools
import json
import re
from pathlib import Path

import pytest

import tracewhy
from conftest import GENERATED, diagnose_json, finding_of, shared_trace
from tracewhy.analyses.account import step_model
from tracewhy.analyses.anti_patterns import AntiPatternsResult, OptimizerBlock, anti_patterns
from tracewhy.analyses.what_if import predict
from tracewhy.analyses.what_if_edits import MultiTensorOptimizer
from tracewhy.analyses.what_if_host_edits import BuildOnDevice, SetGradsToNone
from tracewhy.findings.codes import Code
from tracewhy.findings.model import Finding, Severity
from tracewhy.model.trace import Trace
from tracewhy.reports.diagnose import Report, diagnose

PRESENT = GENERATED / "cpu_anti_present.pt.trace.json.gz"
ABSENT = GENERATED / "cpu_anti_absent.pt.trace.json.gz"
RESNET50 = "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"
RESNET18_FOREACH = "tracelens/mi300x_ddp_resnet18_no_pool_train.json.gz"
MI250_TOY = "hta/mi250_minitoy_train_rocm6.2.json.gz"
ANTI_CODES = {Code.OPTIMIZER_SINGLE_TENSOR, Code.ZERO_GRAD_NOT_NONE, Code.CONV_BIAS_BEFORE_BATCH_NORM,
              Code.TENSOR_BUILT_ON_HOST}
#: TorchTidy's pattern names (torch/profiler/_pattern_matcher.py) and the finding that says the
#: same; None where the pattern does not apply to a CPU-only run.
TORCHTIDY: dict[str, Code | None] = {
    "Optimizer Single Tensor Pattern": Code.OPTIMIZER_SINGLE_TENSOR,
    "Gradient Set To Zero Instead of None Pattern": Code.ZERO_GRAD_NOT_NONE,
    "Enabling Bias in Conv2d Followed By BatchNorm Pattern": Code.CONV_BIAS_BEFORE_BATCH_NORM,
    # Its skip test reads torch.cuda.get_arch_list(), empty on a CPU build, as "every GPU has TF32".
    "FP32 MatMul Pattern": None,
}
#: ConvBnNet's parameters with the conv bias (conv weight and bias, norm weight and bias, linear
#: weight and bias); the fixed twin has no conv bias.
PRESENT_PARAMS = 6


@pytest.fixture(scope="module")
def present() -> tuple[Trace, Report]:
    t = tracewhy.load(PRESENT)
    return t, diagnose(t)


@pytest.fixture(scope="module")
def absent() -> tuple[Trace, Report]:
    t = tracewhy.load(ABSENT)
    return t, diagnose(t)


@pytest.fixture(scope="module")
def resnet50() -> tuple[Trace, Report]:
    t = tracewhy.load(shared_trace(RESNET50))
    return t, diagnose(t)


def _found(report: Report, code: Code) -> Finding | None:
    return next((f for f in report.findings if f.code == code), None)


def _raw_nested(path: Path, outer: str, inner: str) -> tuple[int, int]:
    """(ranges named ``outer...``, ``inner`` ops inside one of them on the same thread), from the raw file."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ranges = [e for e in events if str(e.get("name", "")).startswith(outer)]
    inside = sum(1 for e in events if e.get("name") == inner and any(
        r["tid"] == e["tid"] and r["ts"] <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"] for r in ranges))
    return len(ranges), inside


def _torchtidy(path: Path) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """TorchTidy's summary (pattern: events matched) and its source locations, from the report the
    generator stored beside the trace."""
    text = path.with_name(path.name.replace(".pt.trace.json.gz", ".torchtidy.txt")).read_text(encoding="utf-8")
    summary = {m[1]: int(m[2]) for m in re.finditer(r"^(.+): (\d+) events matched\.$", text, re.M)}
    where = [(m[1], int(m[2])) for m in re.finditer(r"^\[Source Code Location\] (.+):(\d+)$", text, re.M)]
    return summary, where


def test_structure_present_and_absent() -> None:
    on, off = anti_patterns(tracewhy.load(PRESENT)), anti_patterns(tracewhy.load(ABSENT))
    step_on, zero_on = _blocks(on)
    step_off, zero_off = _blocks(off)
    # Single-tensor Adam: each parameter's update is its own ops, none takes a tensor list.
    assert not step_on.multi_tensor and step_on.repeated_per_call >= PRESENT_PARAMS
    assert step_off.multi_tensor
    calls, zeroed = _raw_nested(PRESENT, "Optimizer.zero_grad#", "aten::zero_")
    assert zero_on.zeroed_per_call == zeroed / calls == PRESENT_PARAMS
    assert zero_off.zeroed_per_call == 0
    assert [(c.conv, c.norm, c.channels) for c in on.conv_bias] == [("aten::conv2d", "aten::batch_norm", 8)]
    assert on.conv_bias[0].calls == calls  # one convolution per step
    assert off.conv_bias == ()


def _blocks(r: AntiPatternsResult) -> tuple[OptimizerBlock, OptimizerBlock]:
    step = next(b for b in r.optimizer if b.is_step)
    zero = next(b for b in r.optimizer if not b.is_step)
    return step, zero


def test_findings_present_and_absent(present: tuple[Trace, Report], absent: tuple[Trace, Report]) -> None:
    # A tensor built on the host and copied to the device needs a device: not applicable on a CPU-only run.
    cpu = ANTI_CODES - {Code.TENSOR_BUILT_ON_HOST}
    assert cpu <= {f.code for f in present[1].findings}
    assert not ANTI_CODES & {f.code for f in absent[1].findings}
    assert Code.TENSOR_BUILT_ON_HOST not in {f.code for f in present[1].findings}


def test_costs_are_the_step_predictions(present: tuple[Trace, Report]) -> None:
    """The saving each finding states and ranks by is the replay of its fix (the edit calibration
    measures), recomputed here on a model of its own; zero where the replay saves nothing."""
    trace, report = present
    model = step_model(trace)
    for code, fix in ((Code.OPTIMIZER_SINGLE_TENSOR, MultiTensorOptimizer()),
                      (Code.ZERO_GRAD_NOT_NONE, SetGradsToNone())):
        f = _found(report, code)
        assert f is not None
        p = predict(model, [fix])
        assert p.changed
        # Claimed from 1% of the step (a smaller saving is stated, at severity info, not claimed).
        claimed = p.saved_ns if p.saved_ns >= 0.01 * p.measured_ns else 0
        assert f.recoverable_ns_per_step == claimed
        assert (f.severity == Severity.INFO) == (claimed == 0)
        assert f.predicted_step_ns == p.predicted_ns
        assert f.evidence["saved_ns"] == p.saved_ns
    conv = _found(report, Code.CONV_BIAS_BEFORE_BATCH_NORM)
    assert conv is not None and conv.recoverable_ns_per_step == 0


def test_same_verdicts_as_torchtidy_without_its_false_positive(present: tuple[Trace, Report],
                                                               absent: tuple[Trace, Report]) -> None:
    for path, (_, report) in ((PRESENT, present), (ABSENT, absent)):
        summary, where = _torchtidy(path)
        assert set(summary) <= set(TORCHTIDY), f"TorchTidy reports a pattern this test does not map: {summary}"
        codes = {f.code for f in report.findings}
        expected = {TORCHTIDY[name] for name in summary} - {None}
        assert expected == codes & ANTI_CODES
        assert bool(expected) == (path == PRESENT)
        # TorchTidy flags FP32 matmuls on a CPU-only run; tracewhy says nothing about tensor cores there.
        assert "FP32 MatMul Pattern" in summary
        assert Code.TENSOR_CORES_UNUSED not in codes
        for name, code in TORCHTIDY.items():
            f = _found(report, code) if code is not None else None
            if f is None or name not in summary:
                continue
            # The events TorchTidy matched are the block calls (or convolutions) tracewhy counted.
            assert f.evidence["calls"] == summary[name]
            # The user line tracewhy names is the function holding TorchTidy's calling line.
            line = f.evidence["line"]
            assert any(Path(file).name == Path(line["file"]).name and line["line"] <= at for file, at in where)


def test_scalar_reads_in_a_loop(present: tuple[Trace, Report], absent: tuple[Trace, Report]) -> None:
    """The .item() per class in a loop (one read per iteration) is scalar-read-per-step's: four
    reads per step in the loop, each with the nonzero of its boolean mask; none in the fixed loop."""
    on, off = _found(present[1], Code.SCALAR_READ_PER_STEP), _found(absent[1], Code.SCALAR_READ_PER_STEP)
    assert on is not None and on.evidence["calls"] - on.evidence["from_optimizer"] == 8 * present[1].steps.table.height
    assert off is None or off.evidence["calls"] == off.evidence["from_optimizer"]


def test_multi_tensor_optimizer_reads_get_no_foreach_advice(absent: tuple[Trace, Report]) -> None:
    """Adam with foreach=True still reads each step counter (``_get_value``): the advice is
    capturable, never the foreach=True it already has."""
    f = _found(absent[1], Code.SCALAR_READ_PER_STEP)
    assert f is not None and f.evidence["from_optimizer"] > 0
    assert "foreach=True" not in f.next_step and "capturable=True" in f.next_step


def test_resnet50_gpu_trace(resnet50: tuple[Trace, Report]) -> None:
    """A 2021 V100 capture (PyTorch 1.9: SGD single-tensor, zero_grad zeroing by default) of
    torchvision's resnet50, whose convolutions have no bias."""
    _, report = resnet50
    zero = _found(report, Code.ZERO_GRAD_NOT_NONE)
    single = _found(report, Code.OPTIMIZER_SINGLE_TENSOR)
    assert zero is not None and single is not None
    assert zero.evidence["zeroed_per_call"] == 161  # torchvision resnet50's parameter tensors
    assert _found(report, Code.CONV_BIAS_BEFORE_BATCH_NORM) is None
    # On a GPU both fixes save time, and diagnose ranks them by it among the time findings.
    assert zero.recoverable_ns_per_step > 0 and single.recoverable_ns_per_step > 0
    timed = [f for f in report.findings if f.recoverable_ns_per_step > 0]
    assert [f.recoverable_ns_per_step for f in timed] == sorted((f.recoverable_ns_per_step for f in timed),
                                                                reverse=True)
    assert zero.evidence["line"]["file"] == single.evidence["line"]["file"] == "resnet50_profiler_api.py"


@pytest.mark.parametrize("name", [
    RESNET18_FOREACH,  # MI300X DDP: SGD runs _foreach_ ops, zero_grad sets to None
    # V100 (tracediff): apex's FusedAdam loops over its parameters in Python (one add_ each) and
    # updates them all in multi_tensor_apply_kernel launches from its extension, outside any aten op;
    # its copies go into torch.empty buffers on the device.
    "hta/tracediff_test_v100_rank1of2.json.gz",
])
def test_multi_tensor_gpu_traces_have_none(name: str) -> None:
    r = anti_patterns(tracewhy.load(shared_trace(name)))
    step = next(b for b in r.optimizer if b.is_step)
    assert step.multi_tensor
    assert all(b.zeroed_per_call == 0 for b in r.optimizer)
    assert r.conv_bias == () and r.host_built == ()


def _raw_factory_copies(path: Path) -> list[tuple[str, str]]:
    """(size the creation op was given, shape the next op copies) for each aten::randn directly
    followed by aten::to on its thread, from the raw events' Concrete Inputs and Input Dims."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        ops = sorted((e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
                     key=lambda e: e["ts"])
    top = [e for e in ops if not any(o is not e and o["tid"] == e["tid"] and o["ts"] <= e["ts"]
                                     and e["ts"] + e["dur"] <= o["ts"] + o["dur"] for o in ops)]
    return [(a["args"]["Concrete Inputs"][0], str(b["args"]["Input Dims"][0]))
            for a, b in itertools.pairwise(top) if a["name"] == "aten::randn" and b["name"] == "aten::to"]


def test_tensor_built_on_host_gpu_trace() -> None:
    """HTA's MI250 toy draws its input with torch.randn on the host and moves it with .to(device)
    in each of its two steps; the fix replayed (BuildOnDevice) prices it."""
    path = shared_trace(MI250_TOY)
    trace = tracewhy.load(path)
    report = diagnose(trace)
    f = _found(report, Code.TENSOR_BUILT_ON_HOST)
    assert f is not None
    raw = _raw_factory_copies(path)
    assert len(raw) == report.steps.table.height == f.evidence["calls"] == 2
    assert all(size == shape.replace(" ", "").replace(",", ", ") for size, shape in raw)
    assert [c["shape"] for c in f.evidence["copies"]] == [[5, 128]]
    ops = tuple(sorted(i for h in anti_patterns(trace).host_built for i in h.copy_ids))
    p = predict(step_model(trace), [BuildOnDevice(ops)])
    assert p.saved_ns > 0 and f.recoverable_ns_per_step == p.saved_ns


def test_tensor_built_on_host_absent_where_batches_are_copied(resnet50: tuple[Trace, Report]) -> None:
    """resnet50's HtoD copies move the DataLoader's batches: no creation op makes them."""
    assert _found(resnet50[1], Code.TENSOR_BUILT_ON_HOST) is None


def _raw_unaligned(path: Path) -> set[tuple[str, int, int, int]]:
    """(op, M, K, N) of the half-precision mm/addmm/bmm calls whose K or N is not a multiple of 8
    and neither M nor N is 1, read from the raw events' Input type and Input Dims."""
    operands = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    out = set()
    for e in events:
        if e.get("ph") != "X" or e.get("name") not in operands:
            continue
        a, b = operands[e["name"]]
        args = e.get("args", {})
        if args.get("Input type", [None] * 3)[a] not in ("c10::BFloat16", "c10::Half"):
            continue
        dims = args["Input Dims"]
        m, k, n = dims[a][-2], dims[b][-2], dims[b][-1]
        if (k % 8 or n % 8) and 1 not in (m, n):
            out.add((e["name"], m, k, n))
    return out


@pytest.mark.parametrize(("name", "flagged"), [
    ("tracelens/h100_bert-small_bs1_seq512.json.gz", {("aten::addmm", 141, 512, 30522)}),  # the vocabulary
    ("tracelens/h100_qwen1.5-0.5b_bs16_seq2048.json.gz", set()),
])
def test_unaligned_half_gemms(name: str, flagged: set[tuple[str, int, int, int]]) -> None:
    path = shared_trace(name)
    r = anti_patterns(tracewhy.load(path))
    found = {(g.op, g.m, g.k, g.n) for g in r.unaligned_gemms}
    assert found == flagged == _raw_unaligned(path)
    assert all(g.kernel_ns > 0 for g in r.unaligned_gemms)


def test_unaligned_gemm_finding_states_its_kernel_time_and_claims_nothing() -> None:
    report = diagnose(tracewhy.load(shared_trace("tracelens/h100_timesformer_video_bs1.json.gz")))
    f = _found(report, Code.GEMM_DIMS_UNALIGNED)
    assert f is not None and f.recoverable_ns_per_step == 0
    assert {(g["m"], g["k"], g["n"]) for g in f.evidence["gemms"]} == {(3137, 64, 3137), (3137, 3137, 64)}
    assert f.evidence["kernel_ns_per_step"] == sum(g["kernel_ns"] for g in f.evidence["gemms"]) / \
        report.steps.table.height


def test_no_gpu_anti_pattern_on_cpu_traces(present: tuple[Trace, Report]) -> None:
    r = anti_patterns(present[0])
    assert r.unaligned_gemms == () and r.host_built == ()


CALIBRATION = Path(__file__).parent / "data" / "calibration"


def _raw_zeroing_and_accumulation_us(path: Path) -> tuple[float, float]:
    """Per ProfilerStep: the time of the outermost ops under Optimizer.zero_grad (the zeroing)
    and of the aten::add_ directly under AccumulateGrad (the accumulation), from the raw events
    by containment on the main thread."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    main = max({e["tid"] for e in events}, key=lambda t: sum(1 for e in events if e["tid"] == t))
    ops = sorted((e for e in events if e["tid"] == main and e.get("cat") == "cpu_op"), key=lambda e: e["ts"])

    def inside(outer: dict[str, object], e: dict[str, object]) -> bool:
        return outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"]  # type: ignore[operator]

    zeroing = sum(o["dur"] for z in events if str(z.get("name", "")).startswith("Optimizer.zero_grad#")
                  for o in ops if inside(z, o) and o["name"] in {"aten::zero_", "aten::_foreach_zero_"})
    accumulating = sum(a["dur"] for g in ops if g["name"] == "torch::autograd::AccumulateGrad"
                       for a in ops if a["name"] == "aten::add_" and inside(g, a) and a is not g)
    steps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    return zeroing / steps, accumulating / steps


def test_cpu_zero_grad_prices_both_allocator_outcomes(capsys: pytest.CaptureFixture[str]) -> None:
    """A CPU-only run's fix is priced twice: with the gradients faulted back in on fresh pages
    (the replay the finding ranks by: no shorter on this pair) and with them kept in the
    process, which saves what the trace's own zeroing and accumulation ops took (raw events,
    not the replay's graph), and the next step names the glibc settings that keep them."""
    path = CALIBRATION / "zero_grad_none_before_1.pt.trace.json.gz"
    f = finding_of(diagnose_json(path, capsys), Code.ZERO_GRAD_NOT_NONE.value)
    assert f is not None and f["recoverable_ns_per_step"] == 0 and f["severity"] == "info"
    ev = f["evidence"]
    assert ev["predicted_step_ns"] >= ev["measured_step_ns"]
    assert "negligible" not in f["statement"] and "faulted every gradient page" in f["statement"]
    zeroing_us, accumulating_us = _raw_zeroing_and_accumulation_us(path)
    kept_saving_us = (ev["measured_step_ns"] - ev["predicted_step_ns_without_faults"]) / 1e3
    assert kept_saving_us == pytest.approx(zeroing_us + accumulating_us, rel=0.25)
    assert "MALLOC_MMAP_THRESHOLD_" in f["next_step"] and "MALLOC_TRIM_THRESHOLD_" in f["next_step"]


def test_gpu_zero_grad_names_no_allocator_setting(resnet50: tuple[Trace, Report]) -> None:
    """On a GPU the caching allocator keeps the freed gradients: one price, no glibc advice."""
    zero = _found(resnet50[1], Code.ZERO_GRAD_NOT_NONE)
    assert zero is not None and "predicted_step_ns_without_faults" not in zero.evidence
    assert "MALLOC_" not in zero.next_step
