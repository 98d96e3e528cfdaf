"""critical-path: the path through host order, launches, stream order and syncs on traces built
inline (where every number is known), its invariants on real traces, and agreement with HTA's
critical_path_analysis on HTA's own test traces, every difference explained."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from builders import KinetoBuilder
from conftest import shared_trace
from tracewhy.analyses.critical_path import CATEGORIES, CriticalPathOptions, CriticalPathResult, critical_path
from tracewhy.cli import main
from tracewhy.readers import read_trace

US = 1000  # the builders write microseconds


def _two_steps(kernel_end: float, sync: tuple[float, float], host_after: tuple[float, float]) -> KinetoBuilder:
    """Step 1 (0-1000 µs): aten::mm launches a 40 µs-start kernel, then a cudaDeviceSynchronize,
    then aten::add; step 2 starts at 1000 µs (the end of step 1's window)."""
    b = KinetoBuilder()
    b.annotation("ProfilerStep#1", 0, 1000).annotation("ProfilerStep#2", 1000, 100)
    b.op("aten::mm", 10, 50).launch("sm80_gemm_kernel", 20, 10, gpu_ts=40, gpu_dur=kernel_end - 40)
    b.op("cudaDeviceSynchronize", sync[0], sync[1] - sync[0], cat="cuda_runtime")
    b.op("aten::add", host_after[0], host_after[1] - host_after[0])
    return b


def _analyse(tmp_path: Path, b: KinetoBuilder) -> CriticalPathResult:
    return critical_path(read_trace(b.write(tmp_path / "t.json")))


def test_a_gpu_bound_step_runs_launch_kernel_sync(tmp_path: Path) -> None:
    # The sync (100-850) waits for the kernel (40-840): the path leaves the host at the launch
    # (20), runs the kernel, and comes back when the sync returns 10 µs after the kernel ends.
    r = _analyse(tmp_path, _two_steps(kernel_end=840, sync=(100, 850), host_after=(860, 990)))
    step = r.steps.row(0, named=True)
    assert step["window_ns"] == step["total_ns"] == 1000 * US and step["determined"]
    assert {c: step[f"{c}_ns"] for c in CATEGORIES} == {
        "host_ops": (10 + 10 + 10 + 130 + 10) * US,  # step start to mm, mm to launch, sync to add, add, add to end
        "launch_overhead": 20 * US, "kernels": 800 * US, "communication": 0, "copies": 0,
        "sync": 10 * US, "kernel_gap": 0, "idle": 0,
    }
    assert r.families.filter(pl.col("step") == 0).rows() == [(0, "gemm", 800 * US)]
    on_path = r.on_path.filter(pl.col("step") == 0)
    assert on_path.get_column("name").to_list() == [
        "ProfilerStep#1", "aten::mm", "cudaLaunchKernel", "sm80_gemm_kernel", "cudaDeviceSynchronize", "aten::add"]
    # Without the kernel the sync would return as soon as the host called it (100 µs) instead of
    # at 850: 750 µs saved of the 800 on the path.
    gains = dict(r.gains.filter(pl.col("step") == 0).select("name", "gain_ns").iter_rows())
    assert gains["sm80_gemm_kernel"] == (850 - 100) * US
    assert gains["aten::add"] == 130 * US


def test_a_host_bound_step_stays_on_the_host(tmp_path: Path) -> None:
    # The kernel ends (90) before the sync starts (100): it delayed nothing, so it is not on the path.
    r = _analyse(tmp_path, _two_steps(kernel_end=90, sync=(100, 105), host_after=(110, 990)))
    step = r.steps.row(0, named=True)
    assert step["total_ns"] == 1000 * US and step["determined"]
    assert step["kernels_ns"] == 0 and step["sync_ns"] == 5 * US and step["launch_overhead_ns"] == 10 * US
    assert step["host_ops_ns"] == (1000 - 10 - 5) * US
    assert "sm80_gemm_kernel" not in r.on_path.get_column("name").to_list()


def test_the_window_ends_at_the_last_steps_own_end(tmp_path: Path) -> None:
    # Step 2 has no next step: its window ends where its own time does, and so does its path.
    r = _analyse(tmp_path, _two_steps(kernel_end=840, sync=(100, 850), host_after=(860, 990)))
    last = r.steps.row(1, named=True)
    assert last["window_ns"] == 100 * US and last["total_ns"] == 100 * US


def test_a_kernel_held_back_by_another_stream_waits_on_it(tmp_path: Path) -> None:
    # The gemm is launched at 30 µs on an idle stream but starts at 2030 µs, right after the
    # NCCL kernel on stream 20 ends: a cross-stream wait this trace has no record of (no
    # cuda_sync events). The path runs through the collective, not a 2 ms "gap".
    b = KinetoBuilder()
    b.annotation("ProfilerStep#1", 0, 3000).annotation("ProfilerStep#2", 3000, 100)
    b.launch("ncclKernel_AllReduce_RING_LL_Sum_float", 10, 5, gpu_ts=20, gpu_dur=2000, stream=20)
    b.launch("sm80_gemm_kernel", 30, 5, gpu_ts=2030, gpu_dur=500, stream=7)
    b.op("cudaDeviceSynchronize", 40, 2500, cat="cuda_runtime")
    step = _analyse(tmp_path, b).steps.row(0, named=True)
    assert step["total_ns"] == 3000 * US and step["determined"]
    assert {c: step[f"{c}_ns"] for c in CATEGORIES} == {
        "host_ops": (10 + 460) * US, "launch_overhead": 10 * US, "kernels": 500 * US,
        "communication": 2000 * US, "copies": 0, "sync": (10 + 10) * US, "kernel_gap": 0, "idle": 0,
    }


def test_a_launch_blocked_on_a_full_queue_waits_on_the_gpu(tmp_path: Path) -> None:
    # The second launch takes 1000 µs and returns 10 µs after the first kernel ends: the launch
    # queue was full, the host was waiting on the GPU. The path runs through that kernel.
    b = KinetoBuilder()
    b.annotation("ProfilerStep#1", 0, 2000).annotation("ProfilerStep#2", 2000, 100)
    b.launch("sm80_gemm_a", 10, 5, gpu_ts=20, gpu_dur=1000)
    b.launch("sm80_gemm_b", 30, 1000, gpu_ts=1040, gpu_dur=60)
    b.op("aten::add", 1035, 955)
    step = _analyse(tmp_path, b).steps.row(0, named=True)
    assert step["total_ns"] == 2000 * US and step["determined"]
    assert {c: step[f"{c}_ns"] for c in CATEGORIES} == {
        "host_ops": (10 + 5 + 955 + 10) * US, "launch_overhead": 10 * US, "kernels": 1000 * US,
        "communication": 0, "copies": 0, "sync": 10 * US, "kernel_gap": 0, "idle": 0,
    }


# --- real traces: what holds on every path -------------------------------------------------------

REAL = ["hta/a100_ddp2_rank0_nccl2.17.json.gz", "hta/sampled_128rank_job_rank0.json.gz",
        "hta/a100_16rank_rank0_alltoall.json.gz"]


@pytest.mark.parametrize("relative", REAL)
def test_paths_on_real_traces_are_contiguous_and_add_up(relative: str) -> None:
    r = critical_path(read_trace(shared_trace(relative)))
    assert r.steps.height > 0
    for row in r.steps.iter_rows(named=True):
        step = row["step"]
        assert sum(row[f"{c}_ns"] for c in CATEGORIES) == row["total_ns"]
        assert row["total_ns"] <= row["window_ns"]
        if row["determined"]:
            assert row["total_ns"] == row["window_ns"]
        seg = r.segments.filter(pl.col("step") == step)
        # One unbroken chain: each stretch starts where the one before ended, up to the window's end.
        ends = (seg.get_column("ts_ns") + seg.get_column("dur_ns")).to_list()
        assert ends[:-1] == seg.get_column("ts_ns").to_list()[1:]
        assert (seg.get_column("dur_ns") >= 0).all()
        assert int(seg.get_column("ts_ns")[-1] + seg.get_column("dur_ns")[-1]) == row["window_end_ns"]
        assert int(r.on_path.filter(pl.col("step") == step).get_column("on_path_ns").sum()) <= row["total_ns"]
    # Removing an item cannot save more than the time it spends on the path, nor cost time.
    replayed = r.gains.filter(pl.col("gain_ns").is_not_null())
    assert replayed.height > 0
    assert (replayed.get_column("gain_ns") >= 0).all()
    assert (replayed.get_column("gain_ns") <= replayed.get_column("on_path_ns")).all()


def test_a_backward_thread_hands_the_path_back_and_forth() -> None:
    # DDP on A100: the main thread waits in "## backward ##" while the autograd thread works.
    # Without the hand-off edges the path sat in that annotation for 100 ms of each step.
    r = critical_path(read_trace(shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz")))
    steady = r.on_path.filter(pl.col("step") == 1)
    backward = steady.filter(pl.col("name") == "## backward ##").get_column("on_path_ns").sum()
    assert backward < 1_000_000
    assert steady.filter(pl.col("name").str.starts_with("autograd::engine::evaluate_function")).height > 0


# --- HTA: the same trace, the same window ------------------------------------------------------------

ALEXNET = "hta/a100_alexnet_critical_path.json.gz"
SIMPLE_ADD = "hta/a100_alexnet_simple_add_cp_input.json.gz"
SIMPLE_ADD_HTA_OUTPUT = "hta/a100_alexnet_simple_add_cp_hta_overlaid_output.json.gz"
#: HTA's test window: the second instance of this annotation (annotation=..., instance_id=1).
HTA_ANNOTATION = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"


def _hta_window(path: Path) -> CriticalPathResult:
    trace = read_trace(path)
    marks = trace.slices.filter(pl.col("name").cast(pl.String) == HTA_ANNOTATION).sort("ts_ns")
    ts, dur = marks.row(1, named=True)["ts_ns"], marks.row(1, named=True)["dur_ns"]
    return critical_path(trace, CriticalPathOptions(window_ns=(ts, ts + dur)))


#: HTA 0.6.1's get_critical_path_breakdown() on ALEXNET, HTA_ANNOTATION instance 1, summed by
#: bound_by (µs), and the part of its cpu_bound spent in cudaLaunchKernel.
HTA_ALEXNET_US = {"cpu_bound": 32042, "gpu_compute_bound": 3712, "gpu_kernel_kernel_overhead": 50,
                  "gpu_kernel_launch_overhead": 30}
HTA_ALEXNET_LAUNCH_CPU_US = 103


def test_composition_reconciles_with_htas_breakdown_on_alexnet() -> None:
    step = _hta_window(shared_trace(ALEXNET)).steps.row(0, named=True)
    assert step["determined"] and step["total_ns"] == step["window_ns"] == 36_356 * US
    # The same GPU work on the path: HTA's compute-bound time is our kernels plus the memset.
    assert step["kernels_ns"] + step["copies_ns"] == HTA_ALEXNET_US["gpu_compute_bound"] * US
    assert step["kernel_gap_ns"] == HTA_ALEXNET_US["gpu_kernel_kernel_overhead"] * US
    # Launch overhead: HTA's launch delays plus the cudaLaunchKernel host time it calls cpu_bound.
    assert step["launch_overhead_ns"] == (HTA_ALEXNET_US["gpu_kernel_launch_overhead"] + HTA_ALEXNET_LAUNCH_CPU_US) * US
    # HTA's path is 522 µs shorter than the window, and we say where those went:
    # - 499 µs of host time inside the annotation between ops: HTA has no annotation nodes and
    #   links consecutive top-level ops with zero-weight dependency edges (HTA is wrong: that
    #   time passed on the only thread there is, so the step could not end sooner);
    # - 23 µs of syncs returning after their kernels: HTA gives sync edges zero weight.
    annotation_only = 499 * US
    assert step["host_ops_ns"] == (HTA_ALEXNET_US["cpu_bound"] - HTA_ALEXNET_LAUNCH_CPU_US) * US + annotation_only
    assert step["sync_ns"] == 23 * US
    assert step["window_ns"] - sum(HTA_ALEXNET_US.values()) * US == annotation_only + step["sync_ns"]


def _hta_events(path: Path) -> set[tuple[int, str]]:
    """(ts µs, name) of the events HTA's overlaid output marks critical."""
    with gzip.open(path, "rt") as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return {(int(e["ts"]), e["name"]) for e in events if e.get("ph") == "X" and e.get("args", {}).get("critical") == 1}


def _ours(r: CriticalPathResult) -> pl.DataFrame:
    return r.on_path.with_columns((pl.col("ts_ns") // US).alias("ts_us"))


def test_on_path_agrees_with_htas_overlaid_output_on_simple_add() -> None:
    # HTA's end-to-end test writes this output with annotation="" (the whole trace; the MANIFEST's
    # "instance 1" is its other test): so the window here is the whole trace.
    hta = _hta_events(shared_trace(SIMPLE_ADD_HTA_OUTPUT))
    trace = read_trace(shared_trace(SIMPLE_ADD))
    s = trace.slices
    whole = (int(s.get_column("ts_ns").min()), int((s.get_column("ts_ns") + s.get_column("dur_ns")).max()))  # type: ignore[arg-type]
    r = critical_path(trace, CriticalPathOptions(window_ns=whole))
    assert r.steps.row(0, named=True)["determined"]
    ours = _ours(r)
    keys = set(ours.select("ts_us", "name").iter_rows())
    assert len(hta) == 624 and len(hta & keys) == 618
    # HTA-only: the last six GPU activities. They ended before the host even called
    # cudaDeviceSynchronize, so they delayed nothing: HTA routes its path through them because
    # it zero-weights the blocking call and the gaps between top-level ops, which makes the GPU
    # route look longer than the host route that actually took the time. Our path stays on the host.
    gpu = s.filter(pl.col("kind").cast(pl.String).is_in(["kernel", "memset"])).select(
        (pl.col("ts_ns") // US).alias("ts_us"), pl.col("name").cast(pl.String), "ts_ns", "dur_ns", "launch_id")
    hta_only = gpu.filter(pl.struct("ts_us", "name").is_in([{"ts_us": t, "name": n} for t, n in hta - keys]))
    assert hta_only.height == len(hta - keys) == 6
    sync = ours.filter(pl.col("name") == "cudaDeviceSynchronize").sort("ts_ns").row(-1, named=True)
    assert (hta_only.get_column("ts_ns") + hta_only.get_column("dur_ns") < sync["ts_ns"]).all()
    # Ours-only: the annotations (HTA has no annotation nodes) and the host work HTA's path
    # skipped: from the first of those six launches to the sync's end, all on the host.
    ours_only = ours.filter(~pl.struct("ts_us", "name").is_in([{"ts_us": t, "name": n} for t, n in hta]))
    host = ours_only.filter(pl.col("kind") != "annotation")
    assert set(host.get_column("kind").to_list()) == {"cpu_op", "runtime"}
    first_launch = int(s.get_column("ts_ns").gather(hta_only.get_column("launch_id")).min())  # type: ignore[arg-type]
    assert min(host.get_column("ts_ns").to_list()) >= first_launch
    assert (host.get_column("ts_ns") + host.get_column("dur_ns")).max() == sync["ts_ns"] + sync["dur_ns"]
    assert ours_only.height - host.height == 8


def test_on_path_contains_htas_critical_events_on_alexnet(tmp_path: Path) -> None:
    hta_analysis = pytest.importorskip("hta.trace_analysis")
    shutil.copy(shared_trace(ALEXNET), tmp_path / "trace.json.gz")
    ta = hta_analysis.TraceAnalysis(trace_dir=str(tmp_path))
    graph, ok = ta.critical_path_analysis(rank=0, annotation=HTA_ANNOTATION, instance_id=1)
    assert ok
    df = ta.t.get_trace(0)
    names = ta.t.symbol_table.get_sym_table()
    start = int(df[df.name == ta.t.symbol_table.get_sym_id_map()[HTA_ANNOTATION]].ts.iloc[1])
    hta = {(int(df.ts.loc[i]) - start, names[df.name.loc[i]]) for i in graph.critical_path_events_set}
    r = _hta_window(shared_trace(ALEXNET))
    origin = r.steps.row(0, named=True)["window_start_ns"]
    ours = {((ts - origin) // US, n) for ts, n in r.on_path.select("ts_ns", "name").iter_rows()}
    assert len(hta) == 77 and hta <= ours
    # Ours has three more: the annotation's own time between ops (HTA has no annotation nodes),
    # the cudaStreamWaitEvent whose wait the path crossed (HTA attributes no time to sync
    # edges), and the last cudaDeviceSynchronize (HTA's path ends at its heaviest node, ours
    # at the window's end).
    assert {n for _, n in ours - hta} == {HTA_ANNOTATION, "cudaStreamWaitEvent", "cudaDeviceSynchronize"}


# --- the command -------------------------------------------------------------------------------------


def test_json_gives_per_step_total_composition_and_on_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["critical-path", str(shared_trace("hta/sampled_128rank_job_rank0.json.gz")), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "critical-path"
    for step in doc["steps"]:
        assert step["total_ns"] == sum(v for k, v in step["composition"].items() if k != "kernel_families")
        assert sum(step["composition"]["kernel_families"].values()) == step["composition"]["kernels"]
        assert step["on_path"] and {"id", "name", "category", "on_path_ns"} <= set(step["on_path"][0])
        assert any(g["gain_ns"] is not None for g in step["gains"])


def test_window_option_checks_its_argument(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(shared_trace(ALEXNET))
    assert main(["critical-path", path, "--window", "5:1"]) == 2
    assert "--window" in capsys.readouterr().err
