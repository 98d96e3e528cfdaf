"""Gaps, their classes and the findings on tiny traces whose answers can be worked out by hand."""

from __future__ import annotations

from pathlib import Path

import polars as pl

import tracewhy
from builders import KinetoBuilder
from tracewhy.analyses.gaps import gaps
from tracewhy.analyses.steps import steps
from tracewhy.findings.model import Severity
from tracewhy.reports.diagnose import diagnose

LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _loop(tmp_path: Path, with_sync: bool = True, steps_n: int = 3) -> tracewhy.Trace:
    """Each 1000 µs step: a 300 µs DataLoader fetch, kernel A (300 µs, launched at +310), an
    aten::item whose DtoH copy and synchronize wait for A, 200 µs of host compute, kernel B (70 µs)."""
    b = KinetoBuilder()
    for i in range(steps_n):
        t = 1000.0 * i
        b.annotation(f"ProfilerStep#{i}", t, 1000)
        b.annotation(LOADER, t, 300)
        b.op("aten::relu", t + 305, 20)
        b.launch("kernel_A", t + 310, 10, gpu_ts=t + 330, gpu_dur=300)
        if with_sync:
            b.op("aten::item", t + 322, 378)
            b.launch("Memcpy DtoH (Device -> Pageable)", t + 325, 3, gpu_ts=t + 630, gpu_dur=2, cat="gpu_memcpy",
                     api="cudaMemcpyAsync")
            b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 100,
                             "tid": 100, "ts": t + 330, "dur": 310, "args": {"correlation": 9000 + i}})
        b.op("aten::mul_", t + 700, 200)
        b.op("aten::add", t + 899, 20)
        b.launch("kernel_B", t + 900, 10, gpu_ts=t + 920, gpu_dur=70)
    trace = tracewhy.load(b.write(tmp_path / "loop.json"))
    trace.check()
    return trace


def _step_classes(trace: tracewhy.Trace, step: int) -> dict[str, int]:
    g = gaps(trace, steps(trace))
    row = g.per_step.filter(pl.col("step") == step).row(0, named=True)
    return {k: v for k, v in row.items() if k.endswith("_ns") and v
            and k not in ("window_ns", "busy_ns", "idle_ns", "kernel_busy_ns")}


def test_step_windows_and_idle(tmp_path: Path) -> None:
    trace = _loop(tmp_path)
    g = gaps(trace, steps(trace))
    row = g.per_step.filter(pl.col("step") == 1).row(0, named=True)
    # Busy: A 300 + copy 2 + B 70 = 372 µs of the 1000 µs window.
    assert (row["window_ns"], row["busy_ns"], row["idle_ns"]) == (1_000_000, 372_000, 628_000)


def test_gap_classes_by_hand(tmp_path: Path) -> None:
    # Step 1 (window 1000-2000 µs):
    # - 1000-1330: B launches A at 1310; before that the host is in the DataLoader (sampled
    #   instants all fall before 1300): 310 µs input; 1310-1320 inside the launch call and
    #   1320-1330 queued (< 20 µs): 20 µs launch.
    # - 1632-1920: the synchronize started at 1330 while A ran and returned at 1640, 8 µs into
    #   the gap: the device drained under a blocking call, so the whole 288 µs is sync.
    # - 1990-2000: the last 10 µs of the step, host inside ProfilerStep only: host.
    assert _step_classes(_loop(tmp_path), 1) == {"input_ns": 310_000, "launch_ns": 20_000, "sync_ns": 288_000,
                                                  "host_ns": 10_000}


def test_host_compute_without_sync(tmp_path: Path) -> None:
    # Without the synchronize the 630-920 gap is host work: aten::mul_ (700-900) and the
    # untraced 630-700 stretch (ProfilerStep only on the stack -> host), then the launch of B
    # at 900: 270 µs host before the launch, 20 µs launch. aten::add (899-919) launches B inside
    # the 290 µs gap, which is too long to count as dispatch overhead.
    classes = _step_classes(_loop(tmp_path, with_sync=False), 1)
    assert classes == {"input_ns": 310_000, "launch_ns": 40_000, "host_ns": 280_000}


def test_gap_rows_name_the_host_activity(tmp_path: Path) -> None:
    g = gaps(_loop(tmp_path), steps(_loop(tmp_path)))
    first = g.gaps.filter(pl.col("step") == 1).sort("start_ns").row(0, named=True)
    assert first["gap_class"] == "input"
    assert first["host_innermost"] == LOADER and first["next_activity"] == "kernel_A"
    assert first["host_annotation"] == LOADER


def test_diagnose_ranks_input_first_and_names_the_sync(tmp_path: Path) -> None:
    report = diagnose(_loop(tmp_path))
    # The first cause: gpu-low-utilization sums the idle classes up and is printed right before
    # them (findings/consolidate.py), so it is not one of the causes ranked here.
    codes = [f.code for f in report.findings if f.severity is not Severity.TRUST and not f.parts]
    assert codes[0] == "gpu-idle-input"
    assert next(f.code for f in report.findings if f.severity is not Severity.TRUST) == "gpu-low-utilization"
    top = report.findings[[f.code for f in report.findings].index("gpu-idle-input")]
    # Measured: the GPU waits 310 µs on input in steady steps 1 and 2 (the 300 µs fetch and the
    # relu before A's launch). Recoverable is the replay's: the fetch prefetched, the step is
    # 300 µs shorter (the relu and the launch still come before A).
    assert top.evidence["idle_in_dataloader_ns"] == 310_000
    assert (top.recoverable_ns_per_step, top.predicted_step_ns) == (300_000, 700_000)
    sync = next(f for f in report.findings if f.code == "gpu-idle-sync")
    # 288 µs of GPU idle after the synchronize (measured, by hand above); the recoverable time is
    # the replay's with the wait dropped (DropSync), which the what-if tests check on their own.
    assert sync.evidence["idle_after_sync_ns"] == 288_000
    assert sync.recoverable_ns_per_step == 298_000
    assert "aten::item" in sync.statement
    assert any(f.code == "gpu-low-utilization" for f in report.findings)


def test_healthy_trace_says_so(tmp_path: Path) -> None:
    # Back-to-back kernels, 1 µs apart, launched well ahead: nothing to recover.
    b = KinetoBuilder()
    for i in range(4):
        t = 1000.0 * i
        b.annotation(f"ProfilerStep#{i}", t, 1000)
        for j in range(10):
            b.launch(f"vectorized_elementwise_kernel_{j}", t + j * 5, 4, gpu_ts=t + 1 + j * 100, gpu_dur=99)
    report = diagnose(tracewhy.load(b.write(tmp_path / "busy.json")))
    assert not [f for f in report.findings if f.severity in (Severity.HIGH, Severity.MEDIUM)]
    assert report.basis.active_share > 0.98
    # The host launches a step's kernels in its first 50 µs, then nothing is recorded on it until
    # the next step: the account names that stretch (an avoidable part over 15% is never left
    # out), and the replay says it costs nothing, since the GPU runs beside it the whole step.
    host = next(f for f in report.findings if f.code == "unexplained-part")
    assert host.severity is Severity.LOW and host.recoverable_ns_per_step == 0
    assert "is no shorter" in host.statement
    assert any(f.code == "gpu-saturated" for f in report.findings)


def test_idle_per_step_never_exceeds_the_window(tmp_path: Path) -> None:
    # GPU work long after the last step's window: the gap that starts inside the window is cut
    # at its end, so a step's idle time stays within its window.
    b = KinetoBuilder()
    for i in range(3):
        b.annotation(f"ProfilerStep#{i}", 100.0 * i, 100)
        b.launch(f"k{i}", 100.0 * i + 1, 1, gpu_ts=100.0 * i + 10, gpu_dur=20)
    b.launch("late", 500, 1, gpu_ts=5000, gpu_dur=10)
    trace = tracewhy.load(b.write(tmp_path / "late.json"))
    per_step = gaps(trace, steps(trace)).per_step
    from tracewhy.analyses.gaps import CLASSES

    for row in per_step.iter_rows(named=True):
        assert sum(row[f"{c}_ns"] for c in CLASSES) <= row["idle_ns"] <= row["window_ns"]
