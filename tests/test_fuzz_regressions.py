"""Crashes the fuzz run found in analyses, findings and renderers, each pinned on a real trace
mutated here the way the fuzzer did it (tests/fuzzing.py, scripts/fuzz.py)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

import tracewhy
from conftest import shared_trace
from tracewhy.analyses.nvtx import gpu_projection
from tracewhy.cli import main


def test_ranges_on_a_capture_spanning_a_century(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every other event's time written 1000x too large (microseconds read as nanoseconds'
    worth of microseconds): the trace spans ~133 years, and two threads times that span no
    longer fit the int64 search keys that match launches to the ranges around them. The
    reader takes it (every time fits int64 ns); nvtx, diagnose and report crashed with
    OverflowError (exit 70). Fuzz: k_retime, 'times scaled by 1000'."""
    doc = json.loads(gzip.decompress(shared_trace("hta/mi250_minitoy_train_rocm6.2.json.gz").read_bytes()))
    timed = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    for event in timed[1::2]:
        event["ts"] *= 1000
        event["dur"] *= 1000
    path = tmp_path / "century.json"
    path.write_text(json.dumps(doc))
    trace = tracewhy.load(path)
    trace.check()
    span_ns = trace.slices["ts_ns"].max() - trace.slices["ts_ns"].min()  # type: ignore[operator]
    assert span_ns > 2**62 // 2  # the shape that overflowed: two threads times this span
    projection = gpu_projection(trace)
    assert projection is not None
    for command in ("nvtx", "diagnose"):
        assert main([command, str(path), "--no-cache"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("damage_at", [12, 30, 200])
def test_a_corrupt_gzip_stream_is_bad_input_when_the_hints_look_too(
        damage_at: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A gzip trace whose deflate stream breaks early: the reader says "corrupt gzip data", then
    the look for another tool's format (memory timeline, snapshot) read the same stream and
    raised zlib.error, an internal error (exit 70). Fuzz: 'flipped 4 bytes' on
    hta/legacy_2022_inference_rank1_tiny.json.gz."""
    data = bytearray(shared_trace("hta/legacy_2022_inference_rank1_tiny.json.gz").read_bytes())
    for i in range(damage_at, damage_at + 4):
        data[i] ^= 0xA5
    path = tmp_path / "input.json.gz"
    path.write_bytes(bytes(data))
    for command in ("gaps", "info"):
        code = main([command, str(path), "--no-cache"])
        err = capsys.readouterr().err
        assert code in (0, 1, 3), err
        assert "internal error" not in err and "Traceback" not in err


def _bounded_memory() -> None:  # (in the child, before exec)
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))


def test_critical_path_with_every_time_at_one_instant_ends(tmp_path: Path) -> None:
    """Every event's time scaled by 1e-9: all 40,573 events of a DDP step collapse into two
    nanoseconds. A host thread's program order, a stream's order and the launches between them
    then order the instants of one time differently, and the edges that released them close a
    cycle; the walk back from the step's end went round it for ever (past 12 GB in 10 minutes;
    refused as "out of memory" under a bound). It now leaves a cycle by its latest earlier
    in-edge. Fuzz: k_retime, 'times scaled by 1e-09'."""
    doc = json.loads(gzip.decompress(shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz").read_bytes()))
    for event in doc["traceEvents"]:
        if isinstance(event.get("ts"), (int, float)):
            event["ts"] *= 1e-9
            if isinstance(event.get("dur"), (int, float)):
                event["dur"] *= 1e-9
    path = tmp_path / "one_instant.json"
    path.write_text(json.dumps(doc))
    done = subprocess.run([sys.executable, "-m", "tracewhy", "critical-path", str(path), "--no-cache", "--json"],
                          capture_output=True, text=True, timeout=180, preexec_fn=_bounded_memory, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = json.loads(done.stdout)["steps"]
    assert steps and all(s["total_ns"] <= s["window_ns"] for s in steps)
