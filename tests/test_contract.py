"""The contract every command keeps: exit 0, 1, 2 or 3 and never 70; what a reader
skipped is a warning every command shows; a partial trace fails ``check``; ``-o`` never
replaces what is not a regular file; stop signals remove what tracewhy made."""

from __future__ import annotations

import gzip
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from tracewhy.cli import EXIT_INTERNAL, EXIT_USAGE, main

#: A real GPU trace with steps and kernels (HTA's test data, 21 KB of gzip).
GP100 = "hta/gp100_step_sync_gpu_user_annotation_2023.json.gz"
TRACE_COMMANDS = ("info", "kernels", "ops", "steps", "gaps", "overlap", "nvtx", "blocks", "diagnose")


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main([*argv, "--no-cache"])
    out, err = capsys.readouterr()
    return code, out, err


# --- a GPU that is never idle -------------------------------------------------------------------


def _saturated(tmp_path: Path) -> list[Path]:
    """The two smallest saturated traces: one step inside one long kernel, and three steps of
    back-to-back 10 µs kernels."""
    one = KinetoBuilder().annotation("ProfilerStep#1", 100, 100).launch("k", 110, 5, 50, 300)
    three = KinetoBuilder()
    for s in range(3):
        t0 = 1000 + s * 100
        three.annotation(f"ProfilerStep#{s + 1}", t0, 100)
        for i in range(10):
            three.launch("k", t0 + i * 10, 2, t0 + i * 10, 10)
    return [one.write(tmp_path / "one.json"), three.write(tmp_path / "three.json")]


def test_saturated_gpu_is_a_finding_not_a_crash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in _saturated(tmp_path):
        for argv in (["gaps", str(path)], ["steps", str(path)], ["overlap", str(path)], ["blocks", str(path)],
                     ["diff", str(path), str(path)], ["export", str(path), "-o", str(tmp_path / "e.json")],
                     ["report", str(path), "-o", str(tmp_path / "r.html")]):
            code, _, err = _run(argv, capsys)
            assert code == 0, (argv, err)
        code, out, _ = _run(["diagnose", str(path), "--json"], capsys)
        assert code == 0
        codes = {f["code"]: f for f in json.loads(out)["findings"]}
        assert "gpu-saturated" in codes and codes["gpu-saturated"]["evidence"]["active_share"] == 1.0
        assert not [c for c in codes if c.startswith("gpu-idle") or c == "gpu-low-utilization"]
        code, out, _ = _run(["check", str(path), "--max-gpu-idle", "5%"], capsys)
        assert code == 0 and "ok   gpu-idle: 0.0%" in out


def test_saturated_finding_only_where_the_gpu_is_saturated(capsys: pytest.CaptureFixture[str]) -> None:
    """On a real trace whose GPU idles, no saturation claim (the rule is the busy share, not a name)."""
    code, out, _ = _run(["diagnose", str(shared_trace(GP100)), "--json"], capsys)
    assert code == 0
    findings = json.loads(out)["findings"]
    assert "gpu-saturated" not in {f["code"] for f in findings}


# --- a cut trace warns everywhere and fails check ----------------------------------------------


def _cut(tmp_path: Path) -> Path:
    data = shared_trace(GP100).read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) * 6 // 10])  # as `head -c` leaves a file copied mid-write
    return cut


@pytest.mark.parametrize("command", TRACE_COMMANDS)
def test_cut_trace_warns_in_every_command(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cut = _cut(tmp_path)
    code, _, err = _run([command, str(cut)], capsys)
    assert code == 0
    lines = [x for x in err.splitlines() if x.startswith("tracewhy: warning: ")]
    assert len(lines) == 1 and str(cut) in lines[0] and "cut" in lines[0], err
    code, out, err = _run([command, str(cut), "--json"], capsys)
    warnings = json.loads(out)["warnings"]
    assert code == 0 and len(warnings) == 1 and warnings[0] in err


def test_whole_trace_has_no_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["kernels", str(shared_trace(GP100)), "--json"], capsys)
    assert code == 0 and json.loads(out)["warnings"] == [] and "warning" not in err


def test_check_fails_a_partial_trace_unless_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cut = _cut(tmp_path)
    code, out, _ = _run(["check", str(cut), "--max-gpu-idle", "100%"], capsys)
    assert code == 1
    assert "ok   gpu-idle" in out and "FAIL partial-trace: " in out and str(cut) in out
    code, out, _ = _run(["check", str(cut), "--max-gpu-idle", "100%", "--allow-partial"], capsys)
    assert code == 0 and "ok   partial-trace: allowed" in out
    code, out, _ = _run(["check", str(cut), "--max-gpu-idle", "100%", "--json"], capsys)
    doc = json.loads(out)
    assert code == 1 and not doc["passed"] and doc["partial"] and doc["warnings"]
    # The whole file passes the same gate.
    code, out, _ = _run(["check", str(shared_trace(GP100)), "--max-gpu-idle", "100%"], capsys)
    assert code == 0 and "partial-trace" not in out


def test_cut_rank_is_marked_and_not_called_a_hang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The gloo pair (scripts/gen_traces) with rank 1's file cut a third of the way in: rank 0
    issued all-reduces in step 4 that rank 1's file no longer holds. Before, that read as
    'Mismatched collectives hang the job'."""
    rank0 = GENERATED / "ddp_gloo_rank0.pt.trace.json.gz"
    whole1 = gzip.decompress((GENERATED / "ddp_gloo_rank1.pt.trace.json.gz").read_bytes())
    rank1 = tmp_path / "rank1.json"
    rank1.write_bytes(whole1[: len(whole1) * 35 // 100])
    code, out, err = _run(["ranks", str(rank0), str(rank1), "--workers", "0", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    codes = {f["code"] for f in doc["findings"]}
    assert "rank-collective-mismatch" not in codes
    assert "rank-trace-incomplete" in codes or not doc["mismatches"]
    rows = {r["rank"]: r for r in doc["ranks"]}
    assert rows[1]["incomplete"] and rows[0]["incomplete"] is None
    assert any("rank 1's trace is incomplete" in n for n in doc["notes"])
    assert any(str(rank1) in w for w in doc["warnings"]) and str(rank1) in err
    code, out, _ = _run(["ranks", str(rank0), str(rank1), "--workers", "0"], capsys)
    assert "1 (incomplete)" in out


# --- options ------------------------------------------------------------------------------------


def test_option_values_get_one_line_answers(capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(shared_trace(GP100))
    code, _, err = _run(["kernels", trace, "--top", "99999999999999999999999"], capsys)
    assert code == 0, err
    for argv, fragment in (
        (["check", trace, "--max-gpu-idle", "20"], "20 is read as a fraction"),
        (["check", trace, "--max-syncs-per-step", "-1"], "must be ≥ 0"),
        (["kernels", trace, "--top", "-3"], "must be ≥ 0"),
    ):
        code, _, err = _run(argv, capsys)
        assert code == EXIT_USAGE and fragment in err, (argv, err)
        assert "Traceback" not in err


def test_warmup_beyond_the_steps_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    trace = GENERATED / "cpu_eager_schedule.pt.trace.json.gz"
    code, out, _ = _run(["diagnose", str(trace), "--warmup", "1000", "--json"], capsys)
    assert code == 0
    findings = {f["code"]: f for f in json.loads(out)["findings"]}
    assert "no-step-markers" not in findings
    assert findings["few-steady-steps"]["statement"].startswith("All ")
    assert "were taken as warm-up" in findings["few-steady-steps"]["statement"]


def test_debug_keeps_the_internal_error_code(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from tracewhy.reports import kernels as kernels_report

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("planted bug")

    monkeypatch.setattr(kernels_report, "kernels", broken)
    trace = str(shared_trace(GP100))
    assert main(["kernels", trace]) == EXIT_INTERNAL
    assert "planted bug" in capsys.readouterr().err
    monkeypatch.setenv("TRACEWHY_DEBUG", "1")
    assert main(["kernels", trace]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError: planted bug" in err


# --- outputs ------------------------------------------------------------------------------------


def test_output_never_replaces_a_device_or_fifo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Run as root, `export T -o /dev/full` turned the device node into a regular file. The test
    makes its own device node (a copy of /dev/full's numbers, root only) so that a regression
    damages nothing outside tmp_path."""
    trace = str(shared_trace(GP100))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    targets = [fifo, tmp_path]
    device = tmp_path / "full"
    if os.geteuid() == 0:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        targets.append(device)
    for command in ("export", "report"):
        for target in targets:
            code, _, err = _run([command, trace, "-o", str(target)], capsys)
            assert code == EXIT_USAGE and "-o writes only regular files" in err, (command, target, err)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    if device in targets:
        assert stat.S_ISCHR(os.stat(device).st_mode)


def test_output_through_a_symlink_writes_its_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(shared_trace(GP100))
    target = tmp_path / "real.html"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.html"
    link.symlink_to(target)
    code, _, _ = _run(["report", trace, "-o", str(link)], capsys)
    assert code == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # a replaced file keeps its permissions


def test_output_dash_is_standard_output(tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    trace = str(shared_trace(GP100))
    assert main(["export", trace, "-o", "-", "--no-cache"]) == 0
    out = capfdbinary.readouterr().out
    assert json.loads(out)["traceEvents"]
    assert not (tmp_path / "-").exists() and not Path("-").exists()


# --- signals ------------------------------------------------------------------------------------

_STOP_INSIDE_READ = textwrap.dedent("""
    import os, signal, sys, time
    import tracewhy.readers.{module} as module
    import tracewhy.readers.kineto.document as document
    from tracewhy.cli import main

    import tracewhy.readers.kineto.parallel as parallel

    if os.environ.get("TRACEWHY_READ_WORKERS"):
        document.ONE_PASS_MAX_BYTES = 0  # read in pieces, as a large file is: the parallel path
    made = parallel.scratch_dir
    def recorded():
        path = made()
        with open(sys.argv[2], "a") as f:
            f.write(str(path) + "\\n")
        return path
    parallel.scratch_dir = recorded

    real = module.{function}
    def stopped(*args, **kwargs):
        os.kill(os.getpid(), signal.{signal})  # what a scheduler does mid-read
        time.sleep(5)
        return real(*args, **kwargs)
    module.{function} = stopped
    sys.exit(main(["kernels", sys.argv[1], "--no-cache"]))
""")


@pytest.mark.parametrize(("signame", "module", "function", "trace", "env"), [
    ("SIGTERM", "nsys.reader", "_read_export", "nsys/nsysai_mock_rtx3080.sqlite.gz", {}),
    ("SIGHUP", "nsys.reader", "_read_export", "nsys/nsysai_mock_rtx3080.sqlite.gz", {}),
    # Two read helpers on a small file: the parallel reader's scratch directory and processes.
    ("SIGTERM", "kineto.reader", "_build", "hta/a100_alexnet_critical_path.json.gz", {"TRACEWHY_READ_WORKERS": "2"}),
])
def test_stop_signal_removes_what_was_made(signame: str, module: str, function: str, trace: str,
                                           env: dict[str, str], tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    script = _STOP_INSIDE_READ.format(module=module, function=function, signal=signame)
    record = tmp_path / "scratch-dirs.txt"
    record.touch()
    proc = subprocess.run([sys.executable, "-c", script, str(shared_trace(trace)), str(record)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "TMPDIR": str(scratch), **env})
    signum = getattr(signal, signame)
    assert proc.returncode == 128 + signum, proc.stderr
    assert proc.stderr.strip() == f"tracewhy: stopped by {signame}"
    assert list(scratch.iterdir()) == []  # the inflated nsys copy (or the scratch without /dev/shm)
    made = record.read_text().split()
    assert len(made) == (1 if module.startswith("kineto") else 0)
    assert not any(Path(p).exists() for p in made)  # the parallel reader's scratch, in /dev/shm


@pytest.mark.parametrize(("trace", "vendor", "rule", "tool", "comm"), [
    # HTA's V100 trace (2021, no version keys in its header): the GPU runs behind the CPU,
    # kernels back to back (docs/decisions.md, steps); its launches are cudaLaunchKernel.
    ("hta/v100_rank0_displayTimeUnit_ns_fractional_us.json.gz", "nvidia", "cu* runtime calls", "ncu --set full",
     False),
    # TraceLens' MI300X DDP rank: busy 99.5%, two thirds of it all-reduce that no compute hides.
    ("tracelens/mi300x_resnet_actckpt_ddp8_rank0.json.gz", "amd", "header", "rocprof-compute profile", True),
])
def test_saturated_real_traces_get_advice_for_their_hardware(trace: str, vendor: str, rule: str, tool: str,
                                                             comm: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """The vendor is decided from the header's version keys (roctracer/hip vs cupti) or the
    runtime API, not from a device-name list; the busy share is overlap's steady figure."""
    path = str(shared_trace(trace))
    code, out, _ = _run(["diagnose", path, "--json"], capsys)
    assert code == 0
    f = {x["code"]: x for x in json.loads(out)["findings"]}["gpu-saturated"]
    ev = f["evidence"]
    assert ev["vendor"] == vendor and rule in ev["vendor_rule"] and tool in f["next_step"]
    assert ev["busy_ns"] / ev["window_ns"] == pytest.approx(ev["active_share"], abs=1e-4) and ev["active_share"] >= 0.98
    code, out, _ = _run(["overlap", path, "--json"], capsys)
    steady = next(r for r in json.loads(out)["steady"] if r["device"] == ev["device"])
    assert ev["busy_ns"] == pytest.approx(steady["busy_ns"], abs=1)
    assert ev["comm_exposed_ns"] == pytest.approx(steady["comm_exposed_ns"], abs=1)
    assert ("communication with no compute under it" in f["statement"]) is comm


def test_gpu_only_trace_with_gaps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The GP100 trace with every host event dropped (a capture with CPU activity off): its GPU
    gaps have no host thread to look at, which indexed an empty host index (fuzz run)."""
    doc = json.loads(gzip.decompress(shared_trace(GP100).read_bytes()))
    gpu_cats = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") in gpu_cats]
    path = tmp_path / "gpu_only.json"
    path.write_text(json.dumps(doc))
    code, out, err = _run(["gaps", str(path), "--json"], capsys)
    assert code == 0, err
    gaps = json.loads(out)["gaps"]
    assert gaps and {g["gap_class"] for g in gaps} == {"other"}
    assert all(g["host_innermost"] is None for g in gaps)
    code, out, _ = _run(["diagnose", str(path), "--json"], capsys)
    assert code == 0 and "gpu-only-trace" in {f["code"] for f in json.loads(out)["findings"]}


def test_step_number_beyond_int64(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(gzip.decompress((GENERATED / "cpu_eager_schedule.pt.trace.json.gz").read_bytes()))
    steps = sorted((e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    assert len(steps) >= 3
    steps[1]["name"] = "ProfilerStep#99999999999999999999999"
    path = tmp_path / "huge_step.json"
    path.write_text(json.dumps(doc))
    code, out, err = _run(["steps", str(path), "--json"], capsys)
    assert code == 0, err
    rows = json.loads(out)["steps"]
    assert [r["name"] for r in rows][1] == "ProfilerStep#99999999999999999999999"
    assert rows[1]["number"] is None and rows[0]["number"] is not None and len(rows) == len(steps)
    assert _run(["diagnose", str(path)], capsys)[0] == 0


def test_cut_plain_file_does_not_claim_to_know_what_came_after(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A plain JSON file cut a third of the way in said 'about 1 events (367 bytes) after the cut
    were lost': the tail it measured is the one event the cut fell in, not what followed."""
    whole = gzip.decompress(shared_trace(GP100).read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(whole[: len(whole) // 3])
    code, out, _ = _run(["kernels", str(cut), "--json"], capsys)
    (warning,) = json.loads(out)["warnings"]
    assert code == 0 and "how many events the run wrote after the cut cannot be told" in warning
    assert "were lost" not in warning


def _sqlite_copy(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.decompress(shared_trace("nsys/nsysai_mock_rtx3080.sqlite.gz").read_bytes()))
    return path


@pytest.mark.parametrize("damage", ["view", "no-column"])
def test_skipped_event_table_is_a_partial_trace(damage: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """An nsys export whose kernel table the reader cannot read (a view, which it never runs, or
    a table without its end column) lacks events: check fails it as partial-trace."""
    import sqlite3

    path = _sqlite_copy(tmp_path, "damaged.sqlite")
    with sqlite3.connect(path) as conn:
        conn.execute('ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO k_rows')
        if damage == "view":
            conn.execute("CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS SELECT * FROM k_rows")
        else:
            conn.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL AS SELECT * FROM k_rows")
            conn.execute('ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN "end"')
    code, out, _ = _run(["check", str(path), "--max-high-findings", "100"], capsys)
    assert code == 1 and "FAIL partial-trace" in out and "CUPTI_ACTIVITY_KIND_KERNEL" in out
    whole = _sqlite_copy(tmp_path, "whole.sqlite")
    code, out, _ = _run(["check", str(whole), "--max-high-findings", "100"], capsys)
    assert code == 0 and "partial-trace" not in out


def test_nsys_report_without_a_cache_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """An .nsys-rep is exported into the cache directory; with none to be had (an unknown ~user
    in TRACEWHY_CACHE_DIR) that was a traceback."""
    nsys = tmp_path / "nsys"
    nsys.write_text("#!/bin/sh\nexit 0\n")
    nsys.chmod(0o755)
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"not really a report")
    monkeypatch.setenv("TRACEWHY_NSYS", str(nsys))
    monkeypatch.setenv("TRACEWHY_CACHE_DIR", "~nosuchuser-tracewhy/x")
    code, _, err = _run(["kernels", str(report)], capsys)
    assert code == 3 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert str(report) in err and "TRACEWHY_CACHE_DIR" in err


def test_database_with_a_log_beside_it_is_not_cached(tmp_path: Path) -> None:
    """A -wal (or hot -journal) is part of the database's content, and a key of the database file
    alone would not see it grow: such a file is read afresh every time, never cached."""
    import sqlite3

    import tracewhy
    from tracewhy.model.cache import CacheOptions

    path = tmp_path / "live.sqlite"
    path.write_bytes(gzip.decompress(shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz").read_bytes()))
    assert path.stat().st_size > 256 * 1024  # big enough to be cached
    cache = CacheOptions(directory=tmp_path / "cache")
    tracewhy.readers.read_trace(path, cache=cache)
    assert any((tmp_path / "cache").rglob("meta.json"))  # cached without a log
    wal_db = tmp_path / "wal" / "live.sqlite"
    wal_db.parent.mkdir()
    wal_db.write_bytes(path.read_bytes())
    conn = sqlite3.connect(wal_db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE note (x)")
    wal_cache = CacheOptions(directory=tmp_path / "wal-cache")
    try:
        assert Path(f"{wal_db}-wal").exists()
        for _ in range(2):
            tracewhy.readers.read_trace(wal_db, cache=wal_cache)
    finally:
        conn.close()
    assert not any((tmp_path / "wal-cache").rglob("meta.json"))
