"""tracewhy compile: on the generated torch.compile traces the counts are what the generating
script planted (read from MANIFEST.md, where compile_traces.py wrote them from its own cases),
times are checked against the raw events, real compiled traces give sensible results, and
TORCH_LOGS parsing survives hostile input."""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from conftest import GENERATED, shared_trace
from tracewhy.analyses.compile import (
    BreakCol,
    CompileResult,
    CompileStepCol,
    RecompileCol,
    RegionCol,
    compile_analysis,
)
from tracewhy.analyses.torch_logs import JoinCol, join_regions
from tracewhy.cli import main
from tracewhy.errors import TraceError
from tracewhy.findings.compile import compile_findings
from tracewhy.model.schema import Col
from tracewhy.model.torch_logs import LogBreakCol, LogRecompileCol
from tracewhy.readers import read_trace
from tracewhy.readers.torch_logs.reader import parse_torch_logs, read_torch_logs

CASES = ("nobreak", "break_top", "break_item", "break_loop", "recompile", "loop_skip", "recompile_limit",
         "recompile_every", "recompile_once", "item_every", "branch_once")
_PLANTED = re.compile(r"graph breaks per step \[([\d, ]*)\], recompiles per step \[([\d, ]*)\]")


def _trace(case: str) -> Path:
    return GENERATED / f"cpu_compile_{case}.pt.trace.json.gz"


def _log(case: str) -> Path:
    return GENERATED / f"cpu_compile_{case}.torch_logs.txt"


def _planted(case: str) -> tuple[list[int], list[int]]:
    """What compile_traces.py says it planted, from its MANIFEST.md section."""
    text = (GENERATED / "MANIFEST.md").read_text(encoding="utf-8")
    section = text.split(f"## `{_trace(case).name}`", 1)[1].split("\n## ", 1)[0]
    m = _PLANTED.search(section)
    assert m, f"no planted counts in the manifest section of {case}"
    return [int(x) for x in m.group(1).split(",")], [int(x) for x in m.group(2).split(",")]


def _analysis(case: str) -> CompileResult:
    return compile_analysis(read_trace(_trace(case)))


def _raw(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _steps_raw(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((e for e in events if str(e["name"]).startswith("ProfilerStep#")), key=lambda e: e["ts"])


def _in(e: dict[str, Any], window: dict[str, Any]) -> bool:
    return bool(window["ts"] <= e["ts"] and e["ts"] + e["dur"] <= window["ts"] + window["dur"])


@pytest.mark.parametrize("case", CASES)
def test_counts_are_what_the_script_planted(case: str) -> None:
    breaks, recompiles = _planted(case)
    r = _analysis(case)
    assert r.per_step.get_column(CompileStepCol.GRAPH_BREAKS).to_list() == breaks
    assert r.per_step.get_column(CompileStepCol.RECOMPILES).to_list() == recompiles
    assert r.recompile_count == sum(recompiles)
    steady = r.per_step.filter(pl.col(CompileStepCol.STEADY)).get_column(CompileStepCol.GRAPH_BREAKS)
    assert r.graph_breaks_per_step == float(steady.median())  # type: ignore[arg-type]


@pytest.mark.parametrize("case", ["nobreak", "break_top", "break_item", "recompile"])
def test_cold_start_is_step_zeros_compile_work(case: str) -> None:
    """Step 0 compiles: its compile time covers the outermost compile phases of step 0 in the
    raw file and fits in the step; it is reported though step 0 is warm-up."""
    r = _analysis(case)
    events = _raw(_trace(case))
    step0 = _steps_raw(events)[0]
    phases = sum(e["dur"] for e in events if _in(e, step0) and e["name"] in (
        "_compile.compile_inner (dynamo_timed)", "backward._backward_impl (dynamo_timed)")) * 1000
    assert r.cold_start_step == "ProfilerStep#0"
    assert not r.per_step.row(0, named=True)[CompileStepCol.STEADY]
    assert phases * 0.99 <= r.cold_start_ns <= step0["dur"] * 1000
    assert r.cold_start_share is not None and 0.5 < r.cold_start_share <= 1.0


def test_warm_capture_has_no_cold_start() -> None:
    r = _analysis("break_loop")  # compiled in the wait/warm-up steps, outside the capture
    assert r.compile_ns == 0 and r.cold_start_ns == 0 and r.cold_start_step is None


def test_recompile_in_the_steady_part_with_its_cost() -> None:
    r = _analysis("recompile")
    row = r.recompiles.row(0, named=True)
    assert (row[RecompileCol.REGION], row[RecompileCol.STEP]) == ("0/1", "ProfilerStep#4")
    assert row[RecompileCol.STEADY]
    events = _raw(_trace("recompile"))
    last = _steps_raw(events)[-1]
    inner = [e["dur"] for e in events if _in(e, last) and e["name"] == "_compile.compile_inner (dynamo_timed)"]
    assert len(inner) == 1 and inner[0] * 1000 * 0.99 <= row[RecompileCol.COST_NS] <= last["dur"] * 1000
    assert r.steady_recompiles == 1


def test_recompile_without_compile_id_annotations() -> None:
    """Before torch 2.6 there are no ``*_data: compile_id=`` annotations: the recompile is the new
    region 0/1 in a step that compiles, and costs that step's compile work."""
    trace = read_trace(_trace("recompile"))
    names = trace.slices.get_column(Col.NAME).cast(pl.String).str.replace(r"_data: .*", "_annotation")
    old = replace(trace, slices=trace.slices.with_columns(names.cast(pl.Categorical)))
    r = compile_analysis(old)
    assert r.recompiles.select(RecompileCol.REGION, RecompileCol.STEP).rows() == [("0/1", "ProfilerStep#4")]
    last = r.per_step.row(-1, named=True)
    assert r.recompiles.get_column(RecompileCol.COST_NS)[0] == last[CompileStepCol.COMPILE_NS] > 0
    assert r.cold_start_step == "ProfilerStep#0"


def test_item_break_recompiles_the_resume_function() -> None:
    r = _analysis("break_item")
    assert r.recompiles.select(RecompileCol.REGION, RecompileCol.STEP).rows() == [("1/1", "ProfilerStep#1")]
    # The eager code of the break is the .item() read: one outermost aten op per step.
    assert r.per_step.get_column(CompileStepCol.EAGER_OPS).to_list() == [1] * 5
    regions = dict(r.regions.select(RegionCol.REGION, RegionCol.NESTED_CALLS).rows())
    assert regions == {"0/0": 0, "1/0": 1, "1/1": 4}


def test_per_block_regions_and_eager_ops_between() -> None:
    """Three compiled blocks, each broken once, layer_norm between them: 6 regions and 3 breaks
    per step, and the eager time between regions is the two layer_norms inside the span."""
    r = _analysis("break_loop")
    assert r.per_step.get_column(CompileStepCol.REGIONS).to_list() == [6] * 4
    events = _raw(_trace("break_loop"))
    for step, row in zip(_steps_raw(events), r.per_step.iter_rows(named=True), strict=True):
        norms = sorted((e for e in events if _in(e, step) and e["name"] == "aten::layer_norm"), key=lambda e: e["ts"])
        assert len(norms) == 3
        expected = sum(e["dur"] for e in norms[:2]) * 1000
        assert row[CompileStepCol.EAGER_OPS] == 2
        assert abs(row[CompileStepCol.EAGER_NS] - expected) <= 2
        assert row[CompileStepCol.KERNELS] > 0  # inductor's C++ kernels, seen as Python frames
    # The break's line from the resume function's name equals the one TORCH_LOGS gives.
    logs = read_torch_logs(_log("break_loop"))
    logged = logs.breaks.filter(pl.col(LogBreakCol.REGION) == "0/0").get_column(LogBreakCol.LOCATION)[0]
    assert r.breaks.get_column(BreakCol.LOCATION).to_list() == [Path(logged).name]
    assert r.breaks.get_column(BreakCol.CALLS).to_list() == [12]


@pytest.mark.parametrize("case", ["nobreak", "break_top", "recompile"])
def test_regions_are_the_raw_region_events(case: str) -> None:
    r = _analysis(case)
    raw = [e for e in _raw(_trace(case)) if str(e["name"]).startswith("Torch-Compiled Region: ")]
    assert int(r.regions.get_column(RegionCol.CALLS).sum()) == len(raw)
    assert int(r.per_step.get_column(CompileStepCol.REGIONS).sum()) == len(raw)


def test_generated_cpu_compile_trace() -> None:
    r = compile_analysis(read_trace(GENERATED / "cpu_compile.pt.trace.json.gz"))
    assert r.per_step.get_column(CompileStepCol.REGIONS).to_list() == [1] * 8
    assert r.graph_breaks_per_step == 0 and r.recompile_count == 0
    assert r.cold_start_ns == r.compile_ns > 0
    assert r.per_step.get_column(CompileStepCol.GRAPH_CALLS).to_list() == [2] * 8  # forward + backward


def test_real_compiled_training_trace_without_step_markers() -> None:
    # No ProfilerStep: the steps are the 7 iterations between its 8 Optimizer.step#AdamW.step
    # spans, each calling the compiled forward and backward once (16 calls in all, 2 before the
    # first optimizer step).
    r = compile_analysis(read_trace(shared_trace("perfdigest/rtx4060laptop_torch_compiled_train.json.gz")))
    assert r.per_step.get_column(CompileStepCol.STEP).to_list() == ["Optimizer.step#AdamW.step"] * 7
    assert r.regions.select(RegionCol.REGION, RegionCol.CALLS, RegionCol.NESTED_CALLS).rows() == [("0/0", 8, 0)]
    for row in r.per_step.iter_rows(named=True):
        assert row[CompileStepCol.GRAPH_BREAKS] == row[CompileStepCol.RECOMPILES] == row[CompileStepCol.COMPILE_NS] == 0
        assert row[CompileStepCol.EAGER_NS] == 0  # the eager loss between iterations is not "between regions"
        assert row[CompileStepCol.GRAPH_CALLS] == 2
    assert r.graph_breaks_per_step == 0 and r.cold_start_ns == 0


def test_real_triton_trace_kernels_land_on_their_region() -> None:
    path = shared_trace("tracelens/mi300x_torch_compile_triton_small.json.gz")
    r = compile_analysis(read_trace(path))
    with gzip.open(path, "rt", encoding="utf-8") as f:
        kernels = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    assert r.regions.select(RegionCol.REGION, RegionCol.KERNELS).rows() == [("0/0", len(kernels))]


def test_triton_kernels_replayed_outside_any_region_still_count() -> None:
    """vLLM replays inductor's Triton kernels from a CUDA graph without Dynamo's regions."""
    path = shared_trace("tracelens/mi300x_vllm_decode_fullgraph_replay.json.gz")
    r = compile_analysis(read_trace(path))
    with gzip.open(path, "rt", encoding="utf-8") as f:
        triton = [e for e in json.load(f)["traceEvents"]
                  if e.get("cat") == "kernel" and str(e["name"]).startswith("triton_")]
    assert r.per_step.get_column(CompileStepCol.KERNELS).to_list() == [len(triton)]
    assert not r.has_compile  # no region and no compile work: not a torch.compile capture by itself


def test_trace_without_compile_markers() -> None:
    r = compile_analysis(read_trace(GENERATED / "cpu_eager_schedule.pt.trace.json.gz"))
    assert not r.has_compile and compile_findings(r, 1e6) == []
    assert r.per_step.get_column(CompileStepCol.REGIONS).sum() == 0


@pytest.mark.parametrize(("case", "codes"), [
    ("nobreak", {"compile-cold-start"}),
    ("break_top", {"graph-breaks", "compile-cold-start"}),
    ("break_item", {"graph-breaks", "recompile", "compile-cold-start"}),
    ("break_loop", {"graph-breaks"}),
    ("recompile", {"recompile", "compile-cold-start"}),
])
def test_findings_per_case(case: str, codes: set[str]) -> None:
    r = _analysis(case)
    found = compile_findings(r, 1e6, read_torch_logs(_log(case)))
    assert {str(f.code) for f in found} == codes


def test_recompile_finding_names_the_failed_guard() -> None:
    found = compile_findings(_analysis("recompile"), 1e6, read_torch_logs(_log("recompile")))
    recompile = next(f for f in found if str(f.code) == "recompile")
    assert "size mismatch at index 0. expected 16, actual 12" in recompile.statement
    assert "0/1 in ProfilerStep#4" in recompile.statement


# --- TORCH_LOGS ---------------------------------------------------------------------------------


def test_logs_of_the_generated_runs() -> None:
    top = read_torch_logs(_log("break_top"))
    assert top.breaks.select(LogBreakCol.REGION, LogBreakCol.FUNCTION).rows() == [("0/0", "forward")]
    assert "graph_break()" in top.breaks.get_column(LogBreakCol.REASON)[0]
    item = read_torch_logs(_log("break_item"))
    assert "Tensor.item()" in item.breaks.get_column(LogBreakCol.REASON)[0]
    assert item.recompiles.get_column(LogRecompileCol.GUARD)[0].startswith("___stack2 == ")
    rec = read_torch_logs(_log("recompile"))
    assert rec.recompiles.select(LogRecompileCol.REGION, LogRecompileCol.FUNCTION).rows() == [("0/1", "forward")]
    assert read_torch_logs(_log("nobreak")).breaks.height == 0


def test_logs_join_the_regions_by_compile_id() -> None:
    r = _analysis("recompile")
    joined = join_regions(r.regions, read_torch_logs(_log("recompile")))
    guards = dict(joined.select(RegionCol.REGION, JoinCol.GUARD).rows())
    assert guards["0/0"] is None
    assert guards["0/1"] == "tensor 'x' size mismatch at index 0. expected 16, actual 12"


def test_log_cut_mid_line_warns_and_keeps_what_it_read() -> None:
    text = _log("break_item").read_text(encoding="utf-8")
    cut = text[: text.index("___stack2") + 5]  # inside the failed guard's line
    logs = parse_torch_logs(cut)
    assert logs.breaks.height == 1 and logs.recompiles.height == 1
    assert any("mid-line" in w for w in logs.warnings)


def test_other_versions_wording() -> None:
    """torch 2.1 (Python logging) and torch 2.3-2.5 (glog prefix, older message text)."""
    old = (
        "[2023-10-01 12:00:00,000] torch._dynamo.symbolic_convert.__graph_breaks: [DEBUG] Graph break: "
        "call_function BuiltinVariable(print) [ConstantVariable(str)] {} from user code at:\n"
        '[2023-10-01 12:00:00,000] torch._dynamo.symbolic_convert.__graph_breaks: [DEBUG]   File "model.py", '
        "line 12, in forward\n"
        "V0415 10:00:00.000000 140 torch/_dynamo/guards.py:2611] [0/1] [__recompiles] Recompiling function "
        "forward in model.py:10\n"
        "V0415 10:00:00.000000 140 torch/_dynamo/guards.py:2611] [0/1] [__recompiles]     triggered by the "
        "following guard failure(s):\n"
        "V0415 10:00:00.000000 140 torch/_dynamo/guards.py:2611] [0/1] [__recompiles]     - tensor 'L['x']' "
        "size mismatch at index 0. expected 8, actual 4\n"
    )
    logs = parse_torch_logs(old)
    assert logs.breaks.select(LogBreakCol.LOCATION, LogBreakCol.REGION).rows() == [("model.py:12", None)]
    assert logs.recompiles.select(LogRecompileCol.REGION, LogRecompileCol.GUARD).rows() == [
        ("0/1", "tensor 'L['x']' size mismatch at index 0. expected 8, actual 4")]
    assert logs.warnings == ()


@pytest.mark.parametrize("text", [
    "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: nope\n",  # another log
    "V0415 10:00:00.000000 140 torch/_dynamo/guards.py:1] [0/0] [__recompiles]     - a guard with no header\n",
    "\ufeff" + "x" * 10_000,
    "",
])
def test_logs_that_are_not_understood_never_raise(text: str) -> None:
    logs = parse_torch_logs(text)
    assert logs.breaks.height == 0 and logs.recompiles.height == 0
    assert bool(logs.warnings) == bool(text)


def test_binary_logs_are_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "core.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(TraceError, match="binary"):
        read_torch_logs(binary)
    assert main(["compile", str(_trace("nobreak")), "--logs", str(binary)]) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "--json", str(_trace("recompile")), "--logs", str(_log("recompile"))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"graph_breaks_per_step", "recompiles", "cold_start_ns", "steps", "logged_recompiles"} <= set(out)
    assert out["recompiles"] == 1 and out["graph_breaks_per_step"] == 0
    step = out["steps"][-1]
    for key in ("regions", "graph_breaks", "recompiles", "compile_ns", "eager_ns_between_regions"):
        assert key in step
    assert step["recompiles"] == 1 and step["compile_ns"] > 0


#: Traces of every source, eager and compiled: the shortcut must be taken exactly where there is
#: nothing to count, and then equal the whole analysis.
_SHORTCUT_TRACES = (
    "tracelens/h100_bert-small_bs1_seq512.json.gz", "nsys/nsysai_h100_2gpu_1s.sqlite.gz",
    "hta/a100_ddp2_rank0_nccl2.17.json.gz", "hta/cpu_only_gloo_rank34of300.json.gz",
    "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz", "nsys/nvfuser_matmul_h200_2024.6.sqlite.gz",
    "hta/a100_triton_single_kernel.json.gz", "perfdigest/rtx4060laptop_torch_compiled_train.json.gz",
    "tracelens/mi300x_torch_compile_triton_small.json.gz", "tracelens/mi300x_vllm_decode_fullgraph_replay.json.gz",
)


_TABLES = ("per_step", "regions", "recompiles", "breaks", "fallbacks")


def _same(a: CompileResult, b: CompileResult) -> None:
    import dataclasses

    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in _TABLES:
            assert x.schema == y.schema and x.equals(y), f.name
        else:
            assert x == y, f.name


@pytest.mark.parametrize("relative", _SHORTCUT_TRACES)
def test_a_trace_with_nothing_compiled_gets_the_whole_analysis_answer_at_once(relative: str) -> None:
    from tracewhy.analyses import compile as C
    from tracewhy.analyses.compile_kernels import has_triton_kernels
    from tracewhy.analyses.compile_slices import marked_slices
    from tracewhy.analyses.steps import steps

    trace = read_trace(shared_trace(relative))
    windows = C._windows(trace, steps(trace))
    marked = marked_slices(trace)
    whole = C._analysis(trace, windows, marked)
    if marked.height or has_triton_kernels(trace):
        # Something to count: the analysis runs whole, and it finds something.
        assert whole.has_compile or int(whole.per_step.get_column(CompileStepCol.KERNELS).sum()) > 0
        _same(C.compile_analysis(trace), whole)
        return
    assert not whole.has_compile and int(whole.per_step.get_column(CompileStepCol.KERNELS).sum()) == 0
    _same(C._nothing_compiled(trace, windows), whole)
    _same(C.compile_analysis(trace), whole)


def test_the_shortcut_is_taken_on_eager_traces_and_not_on_compiled_ones() -> None:
    from tracewhy.analyses.compile_kernels import has_triton_kernels
    from tracewhy.analyses.compile_slices import marked_slices

    eager = read_trace(shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz"))
    assert marked_slices(eager).height == 0 and not has_triton_kernels(eager)
    triton_only = read_trace(shared_trace("hta/a100_triton_single_kernel.json.gz"))
    assert has_triton_kernels(triton_only)
