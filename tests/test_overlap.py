"""Overlap on tiny multi-stream traces whose answers are worked out by hand in the comments."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import tracewhy
from builders import KinetoBuilder
from tracewhy.analyses.overlap import OverlapOptions, overlap
from tracewhy.cli import main
from tracewhy.findings import thresholds as th
from tracewhy.findings.overlap import exposed_comm_findings

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _three_steps(tmp_path: Path, comm_us: float = 250, same_stream: bool = False) -> tracewhy.Trace:
    """Three 1000 µs steps; in each, at offset o (µs, GPU clock = host clock):

    stream 7:  gemm [o+100, o+400)                relu [o+500, o+600)
    stream 20:           nccl all-reduce [o+300, o+300+comm_us)   (launched inside nccl:all_reduce)
    stream 30:              memset [o+380, o+420)                  memcpy [o+650, o+700)
    """
    b = KinetoBuilder()
    # same_stream: the all-reduce queues on stream 7 after relu instead, [o+600, o+600+comm_us).
    comm_stream, comm_at = (7, 600) if same_stream else (20, 300)
    for i in range(3):
        o = 1000.0 * i
        b.annotation(f"ProfilerStep#{i}", o, 1000)
        b.launch("sm80_xmma_gemm_f32", o + 10, 5, gpu_ts=o + 100, gpu_dur=300, stream=7)
        b.launch("vectorized_elementwise_kernel relu", o + 20, 5, gpu_ts=o + 500, gpu_dur=100, stream=7)
        b.annotation("nccl:all_reduce", o + 35, 10)
        b.launch(NCCL, o + 40, 5, gpu_ts=o + comm_at, gpu_dur=comm_us, stream=comm_stream)
        b.launch("Memset (Device)", o + 50, 5, gpu_ts=o + 380, gpu_dur=40, stream=30, cat="gpu_memset",
                 api="cudaMemsetAsync")
        b.launch("Memcpy HtoD (Pinned -> Device)", o + 60, 5, gpu_ts=o + 650, gpu_dur=50, stream=30,
                 cat="gpu_memcpy", api="cudaMemcpyAsync")
    trace = tracewhy.load(b.write(tmp_path / "three.json"))
    trace.check()
    return trace


def test_per_step_parts_by_hand(tmp_path: Path) -> None:
    r = overlap(_three_steps(tmp_path), OverlapOptions(warmup=0))
    # compute = gemm 300 + relu 100; comm 250 of which gemm covers [300,400) and relu [500,550):
    # hidden 150, exposed [400,500) = 100; copies memset 40 + memcpy 50 = 90, of which only the
    # memcpy [650,700) runs with neither compute nor comm: 50; busy [100,600) + [650,700) = 550;
    # idle 1000 - 550 = 450 (window: to the next step's start; the last one to its CPU end).
    expected = {"window_ns": 1_000_000, "compute_ns": 400_000, "comm_ns": 250_000, "comm_hidden_ns": 150_000,
                "comm_exposed_ns": 100_000, "copy_ns": 90_000, "copy_exposed_ns": 50_000, "busy_ns": 550_000,
                "idle_ns": 450_000}
    assert r.steps.height == 3
    for row in r.steps.iter_rows(named=True):
        assert {k: row[k] for k in expected} == expected
    steady = r.steady.row(0, named=True)
    assert steady["steps"] == 3 and steady["comm_exposed_ns"] == 100_000.0


def test_device_span_concurrency_and_streams(tmp_path: Path) -> None:
    r = overlap(_three_steps(tmp_path), OverlapOptions(warmup=0))
    d = r.devices.row(0, named=True)
    # Span: first start (100) to last end (2700); idle = 2600 - 3 * 550.
    assert (d["span_ns"], d["busy_ns"], d["idle_ns"], d["streams"]) == (2_600_000, 1_650_000, 950_000, 3)
    assert d["comm_hidden_share"] == pytest.approx(150 / 250)
    # Busy streams per step: 1 during [100,300) [420,500) [550,600) [650,700) = 380; 2 during
    # [300,380) [400,420) [500,550) = 150; 3 during [380,400) = 20.
    conc = dict(r.concurrency.select("streams_active", "time_ns").iter_rows())
    assert conc == {0: 950_000, 1: 3 * 380_000, 2: 3 * 150_000, 3: 3 * 20_000}
    assert (d["max_streams_active"], d["multi_stream_ns"]) == (3, 3 * 170_000)
    streams = {row["stream"]: row for row in r.streams.iter_rows(named=True)}
    assert streams[20]["communication_ns"] == 3 * 250_000 and streams[20]["compute_ns"] == 0
    assert (streams[30]["copy_ns"], streams[30]["memset_ns"]) == (3 * 50_000, 3 * 40_000)


def test_collectives_named_by_their_range(tmp_path: Path) -> None:
    r = overlap(_three_steps(tmp_path), OverlapOptions(warmup=0))
    assert r.collectives.select("collective", "count", "time_ns", "hidden_ns", "exposed_ns").to_dicts() == [
        {"collective": "nccl:all_reduce", "count": 3, "time_ns": 750_000, "hidden_ns": 450_000, "exposed_ns": 300_000}
    ]
    assert r.collectives.get_column("exposed_ns_per_step").to_list() == [100_000.0]


def test_warmup_excluded_from_steady_means(tmp_path: Path) -> None:
    # Default warm-up with 3 steps is 1: the steady means cover 2 steps.
    r = overlap(_three_steps(tmp_path))
    assert r.steady.row(0, named=True)["steps"] == 2 and r.steady_steps == 2
    assert r.steps.get_column("steady").to_list() == [False, True, True]


def test_window_boundary_splits_a_kernel(tmp_path: Path) -> None:
    # A collective from step 0 still running when step 1 starts is split at the boundary.
    b = KinetoBuilder()
    b.annotation("ProfilerStep#0", 0, 1000).annotation("ProfilerStep#1", 1000, 1000)
    b.launch("gemm_a", 10, 5, gpu_ts=100, gpu_dur=700)
    b.launch(NCCL, 20, 5, gpu_ts=900, gpu_dur=300, stream=20)
    b.launch("gemm_b", 1010, 5, gpu_ts=1100, gpu_dur=200)
    trace = tracewhy.load(b.write(tmp_path / "split.json"))
    trace.check()
    r = overlap(trace, OverlapOptions(warmup=0))
    rows = r.steps.select("step", "comm_ns", "comm_hidden_ns", "comm_exposed_ns").to_dicts()
    # Step 0 keeps [900,1000) exposed; step 1 gets [1000,1200), of which gemm_b hides [1100,1200).
    assert rows == [
        {"step": "ProfilerStep#0", "comm_ns": 100_000, "comm_hidden_ns": 0, "comm_exposed_ns": 100_000},
        {"step": "ProfilerStep#1", "comm_ns": 200_000, "comm_hidden_ns": 100_000, "comm_exposed_ns": 100_000},
    ]


def test_parts_add_up_to_the_window(tmp_path: Path) -> None:
    r = overlap(_three_steps(tmp_path, comm_us=333), OverlapOptions(warmup=0))
    for row in r.steps.iter_rows(named=True):
        assert row["compute_ns"] + row["comm_exposed_ns"] + row["copy_exposed_ns"] + row["idle_ns"] == row["window_ns"]
        assert row["comm_hidden_ns"] + row["comm_exposed_ns"] == row["comm_ns"]


@pytest.mark.parametrize(("comm_us", "fires"), [(250, True), (190, False)])
def test_exposed_comm_finding_threshold(tmp_path: Path, comm_us: float, fires: bool) -> None:
    # Exposed comm is the part of [300, 300 + comm_us) after gemm ends (400) and before relu
    # starts (500): 100 µs at 250 (10% of the step, exactly EXPOSED_COMM_MIN_NS) fires; 90 µs at
    # 190 is below EXPOSED_COMM_MIN_NS and does not.
    assert th.EXPOSED_COMM_MIN_NS == 100_000 and th.EXPOSED_COMM_MIN_SHARE <= 0.09
    found = exposed_comm_findings(overlap(_three_steps(tmp_path, comm_us=comm_us), OverlapOptions(warmup=0)))
    assert [f.code for f in found] == (["comm-exposed"] if fires else [])
    if fires:
        f = found[0]
        assert f.statement.startswith(
            "communication runs with no compute beside it for 0.10 ms/step on GPU 0 (10.0% of the 1.00 ms")
        assert "nccl:all_reduce 0.10 ms (3 calls)" in f.statement
        assert f.recoverable_ns_per_step == 100_000
        assert f.evidence["comm_on_compute_stream"] is False


def test_comm_on_the_compute_stream_is_said(tmp_path: Path) -> None:
    # One stream runs kernels one after another: the all-reduce [600,850) is all exposed.
    r = overlap(_three_steps(tmp_path, same_stream=True), OverlapOptions(warmup=0))
    assert r.steady.row(0, named=True)["comm_exposed_ns"] == 250_000.0
    f = exposed_comm_findings(r)[0]
    assert f.evidence["comm_on_compute_stream"] is True
    assert "same stream as compute" in f.statement


def test_cpu_only_trace_has_no_devices(tmp_path: Path) -> None:
    b = KinetoBuilder().annotation("ProfilerStep#0", 0, 100).op("aten::add", 10, 5)
    r = overlap(tracewhy.load(b.write(tmp_path / "cpu.json")))
    assert r.devices.height == 0 and r.steps.height == 0
    assert r.note == "no GPU activity in this trace: nothing to overlap"
    assert exposed_comm_findings(r) == []


def test_cli_overlap_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    path = tmp_path / "three.json"
    _three_steps(tmp_path)
    assert main(["overlap", str(path), "--json", "--warmup", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "overlap" and doc["steady_steps"] == 3
    assert doc["steady"][0]["comm_exposed_ns"] == 100_000.0
    assert [f["code"] for f in doc["findings"]] == ["comm-exposed"]
    assert main(["overlap", str(path)]) == 0
    out = capsys.readouterr().out
    assert "communication runs with no compute beside it for 0.10 ms/step" in out


def test_two_devices_kept_apart(tmp_path: Path) -> None:
    b = KinetoBuilder()
    b.annotation("ProfilerStep#0", 0, 1000)
    b.launch("gemm", 10, 5, gpu_ts=100, gpu_dur=400, device=0)
    b.launch(NCCL, 20, 5, gpu_ts=200, gpu_dur=400, device=1, stream=20)
    trace = tracewhy.load(b.write(tmp_path / "two.json"))
    trace.check()
    r = overlap(trace, OverlapOptions(warmup=0))
    by_dev = {row["device"]: row for row in r.steps.iter_rows(named=True)}
    # Compute on GPU 0 cannot hide communication on GPU 1.
    assert by_dev[0]["compute_ns"] == 400_000 and by_dev[0]["comm_ns"] == 0
    assert by_dev[1]["comm_exposed_ns"] == 400_000 and by_dev[1]["comm_hidden_ns"] == 0
    assert r.devices.filter(pl.col("device") == 1).row(0, named=True)["comm_hidden_share"] == 0.0
