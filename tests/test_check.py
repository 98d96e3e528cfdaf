"""``tracewhy check``: exit codes, one line per violated threshold with the measured value,
limits from options and from pyproject.toml, the baseline gate, and each metric on a trace
whose numbers are worked out by hand."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import msgspec
import pytest

from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from tracewhy.cli import main
from tracewhy.readers import read_trace
from tracewhy.reports.check import CheckOptions, check
from tracewhy.reports.check_metrics import parse_limit

BASE = GENERATED / "cpu_slow_step_base.pt.trace.json.gz"
PLANTED = GENERATED / "cpu_slow_step_planted.pt.trace.json.gz"


class _Event(msgspec.Struct):
    ph: str = ""
    name: str = ""
    dur: float = 0.0
    ts: float = 0.0


class _Doc(msgspec.Struct):
    traceEvents: list[_Event]


def _raw_steady_p50_ms(path: Path) -> float:
    """Median of the ProfilerStep spans, from the JSON itself. All are steady: the capture's first
    step is ProfilerStep#2 (schedule wait=1, warmup=1), and it is in line with the others."""
    with gzip.open(path) as f:
        events = msgspec.json.decode(f.read(), type=_Doc).traceEvents
    durs = [e.dur for e in sorted(events, key=lambda e: e.ts)
            if e.ph == "X" and re.fullmatch(r"ProfilerStep#\d+", e.name)]
    durs.sort()
    mid = len(durs) // 2
    return (durs[mid] if len(durs) % 2 else (durs[mid - 1] + durs[mid]) / 2) / 1000


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(argv)
    return code, capsys.readouterr().out.splitlines()


def test_step_p50_violation_and_pass(capsys: pytest.CaptureFixture[str]) -> None:
    p50 = _raw_steady_p50_ms(PLANTED)  # about 7 ms: 2 ms of work plus the planted 5 ms sleep
    code, lines = _run(["check", str(PLANTED), "--max-step-p50", "5ms"], capsys)
    assert code == 1
    assert lines[0] == f"FAIL step-p50: {p50:.3f} ms > max 5.000 ms (10 steady steps)"
    assert lines[-1] == "check: 1 of 1 failed"
    code, lines = _run(["check", str(PLANTED), "--max-step-p50", f"{p50 + 0.001:.3f}ms"], capsys)
    assert code == 0 and lines[-1] == "check: all 1 passed"


def test_one_line_per_violation_among_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _run(["check", str(PLANTED), "--max-step-p50", "1s", "--max-step-p90", "1ms",
                        "--max-syncs-per-step", "0", "--max-kernels-per-step", "0"], capsys)
    assert code == 1
    failed = [line for line in lines if line.startswith("FAIL")]
    assert len(failed) == 1 and failed[0].startswith("FAIL step-p90: ")
    # A CPU-only run has no synchronize calls and no kernels.
    assert "ok   syncs-per-step: 0 <= max 0 (mean of 10 steady steps)" in lines
    assert "ok   kernels-per-step: 0 <= max 0 (mean of 10 steady steps)" in lines


def test_unmeasurable_metric_fails_unless_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _run(["check", str(BASE), "--max-gpu-idle", "20%"], capsys)
    assert code == 1
    assert lines[0] == "FAIL gpu-idle: not measured (no GPU activity in the trace); limit max 20.0%"
    code, _ = _run(["check", str(BASE), "--max-gpu-idle", "20%", "--allow-unmeasured"], capsys)
    assert code == 0


def test_baseline_gate(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _run(["check", str(PLANTED), "--baseline", str(BASE)], capsys)
    assert code == 1 and lines[0].startswith("FAIL baseline: step time regressed; B is slower")
    code, lines = _run(["check", str(BASE), "--baseline", str(BASE)], capsys)
    assert code == 0 and lines[0].startswith("ok   baseline: within noise")
    # A faster run against a baseline captured with with_stack/profile_memory: not a fair gate.
    heavy = GENERATED / "cpu_with_stack_memory.pt.trace.json.gz"
    code, lines = _run(["check", str(GENERATED / "cpu_eager_schedule.pt.trace.json.gz"), "--baseline", str(heavy)],
                       capsys)
    assert code == 1 and lines[0].startswith("FAIL baseline: not comparable")


def test_pyproject_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copyfile(BASE, tmp_path / "base.json.gz")
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "job"\n\n[tool.tracewhy.check]\nmax-step-p50 = "5ms"\nmax-syncs-per-step = 0\n'
        'baseline = "base.json.gz"\n'
    )
    code, lines = _run(["check", str(PLANTED), "--config", str(tmp_path / "pyproject.toml")], capsys)
    assert code == 1
    assert [line.split(":")[0] for line in lines] == ["FAIL step-p50", "ok   syncs-per-step", "FAIL baseline", "check"]
    # Found by itself from a subdirectory; an option overrides the file's value for one key.
    sub = tmp_path / "ci"
    sub.mkdir()
    monkeypatch.chdir(sub)
    code, lines = _run(["check", str(PLANTED), "--max-step-p50", "1s"], capsys)
    assert lines[0].startswith("ok   step-p50") and lines[2].startswith("FAIL baseline") and code == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-step-p50", "5"], "expected a duration with its unit"),
        (["--max-gpu-idle", "120%"], "between 0% and 100%"),
        ([], "nothing to check"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # no pyproject.toml above
    assert main(["check", str(BASE), *argv]) == 2
    assert message in capsys.readouterr().err


def test_unknown_key_in_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text('[tool.tracewhy.check]\nmax-gpu-idel = "20%"\n')
    assert main(["check", str(BASE), "--config", str(cfg)]) == 2
    assert "unknown check 'max-gpu-idel'" in capsys.readouterr().err


def test_limit_parsing() -> None:
    assert parse_limit("max-gpu-idle", "20%").value == pytest.approx(0.2)
    assert parse_limit("max-gpu-idle", 0.2).value == pytest.approx(0.2)
    assert parse_limit("max-step-p99", "1.5s").value == 1.5e9
    assert parse_limit("max-step-p50", "800us").value == 800_000
    assert parse_limit("min-overlap", "50%").bound == "min"
    with pytest.raises(ValueError, match="takes only min"):
        parse_limit("max-overlap", "50%")


def _gpu_trace(tmp_path: Path) -> Path:
    """Three back-to-back 100 us steps. In each: a compute kernel at +10..+40 us on stream 7, an
    NCCL all-reduce at +30..+60 us on stream 8, and one cudaDeviceSynchronize.

    By hand, per step: GPU busy = [10, 60) = 50 us of 100, so 50% idle; communication 30 us,
    of which 10 us (30..40) runs under compute (33.3% overlap) and 20 us alone (20% of the step
    exposed); 2 kernels and 1 synchronize per step; every step 100 us.
    """
    b = KinetoBuilder()
    for i in range(3):
        t0 = i * 100.0
        b.annotation(f"ProfilerStep#{i}", t0, 100)
        b.launch("gemm_kernel", t0 + 1, 2, t0 + 10, 30, stream=7)
        b.launch("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", t0 + 4, 2, t0 + 30, 30, stream=8)
        b.op("cudaDeviceSynchronize", t0 + 70, 5, cat="cuda_runtime")
    return b.write(tmp_path / "gpu.json")


def test_every_metric_on_a_hand_worked_trace(tmp_path: Path) -> None:
    trace = read_trace(_gpu_trace(tmp_path))
    limits = tuple(parse_limit(k, v) for k, v in (
        ("max-gpu-idle", "50%"), ("max-exposed-comm", "20%"), ("min-overlap", "33%"),
        ("max-syncs-per-step", 1), ("max-kernels-per-step", 2), ("max-step-p50", "100us"),
        ("max-step-p90", "100us"), ("max-step-p99", "100us"),
    ))
    r = check(trace, CheckOptions(limits=limits, warmup=0))
    measured = {x.limit.metric: x.measured for x in r.results}
    assert measured == pytest.approx({
        "gpu-idle": 0.5, "exposed-comm": 0.2, "overlap": 1 / 3, "syncs-per-step": 1, "kernels-per-step": 2,
        "step-p50": 100_000, "step-p90": 100_000, "step-p99": 100_000,
    })
    assert r.passed  # every limit sits exactly at the measured value: bounds are inclusive
    tighter = tuple(parse_limit(k, v) for k, v in (("max-gpu-idle", "49%"), ("min-overlap", "34%")))
    r = check(trace, CheckOptions(limits=tighter, warmup=0))
    assert [x.line for x in r.results] == [
        "FAIL gpu-idle: 50.0% > max 49.0% (GPU 0 mean per step)",
        "FAIL overlap: 33.3% < min 34.0% (communication under compute, worst device, per steady step)",
    ]


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", "--json", str(_gpu_trace(tmp_path)), "--warmup", "0", "--max-gpu-idle", "40%"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["command"] == "check" and doc["passed"] is False
    (result,) = doc["results"]
    assert result["check"] == "max-gpu-idle" and result["measured"] == pytest.approx(0.5)
    assert doc["violations"] == [result["line"]]


@pytest.mark.parametrize("ts", [1e30, float("nan")], ids=["beyond-int64", "nan"])
def test_check_fails_when_the_reader_dropped_what_it_counts(ts: float, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A real DDP trace whose kernels' start times cannot be read: the reader leaves them out
    (with a warning), so kernels-per-step measures 0. That is not a pass: the events it counts
    are missing. Step time does not count kernels, so it still passes on the same trace."""
    doc = json.loads(gzip.decompress(shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz").read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    for e in kernels:
        e["ts"] = ts
    path = tmp_path / "kernels_unreadable.json"
    path.write_text(json.dumps(doc))
    code, lines = _run(["check", str(path), "--max-kernels-per-step", "10"], capsys)
    assert code == 1
    assert lines[0] == "ok   kernels-per-step: 0 <= max 10 (mean of 3 steady steps)"
    assert lines[1] == (f"FAIL partial-trace: {path}: the reader left out {len(kernels)} kernel events (start times "
                        "it could not read); the figures cover only part of the run (--allow-partial checks it anyway)")
    code, lines = _run(["check", str(path), "--max-step-p50", "10s"], capsys)
    assert code == 0 and not any("partial-trace" in x for x in lines)


def test_check_fails_when_nsys_kernel_starts_are_null(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The smallest real nsys export (2 kernels) with every kernel start NULL: the reader skips
    those rows, and gpu-idle counts kernels, so the figure covers part of the run."""
    import sqlite3

    from nsys_support import export_path

    path = tmp_path / "null_starts.sqlite"
    path.write_bytes(gzip.decompress(export_path("nsysai_mock_rtx3080").read_bytes()))
    conn = sqlite3.connect(path)
    kernels = "CUPTI_ACTIVITY_KIND_KERNEL"
    for statement in (f"CREATE TABLE _loose AS SELECT * FROM {kernels}", f"DROP TABLE {kernels}",
                      f"ALTER TABLE _loose RENAME TO {kernels}", f"UPDATE {kernels} SET start = NULL"):
        conn.execute(statement)
    conn.commit()
    conn.close()
    code, lines = _run(["check", str(path), "--max-gpu-idle", "100%", "--allow-unmeasured"], capsys)
    assert code == 1
    assert (f"FAIL partial-trace: {path}: the reader left out 2 kernel events (start times it could not read); "
            "the figures cover only part of the run (--allow-partial checks it anyway)") in lines
