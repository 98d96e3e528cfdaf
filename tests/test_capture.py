"""Capture helpers: ``tracewhy.capture.profile`` writes a trace tracewhy reads with the
steps it was asked for; ``tracewhy capture`` builds the nsys/ncu commands the playbook documents,
prints them without the tool and runs them (then reads the result) with it; ``tracewhy which``
maps a symptom to its first tool."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

import tracewhy.capture
from conftest import shared_trace
from tracewhy.cli import main
from tracewhy.findings.playbook import PLAYBOOK, answers, ncu_command, nsys_command
from tracewhy.model.schema import Col, Kind
from tracewhy.readers import read_trace


def test_profile_captures_the_steps_asked_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")  # (a CPU build is enough; without torch this test is skipped)
    model = torch.nn.Linear(32, 32)
    with tracewhy.capture.profile(tmp_path, steps=3, wait=1, warmup=1) as prof:
        for _ in range(6):
            model(torch.randn(8, 32)).sum().backward()
            prof.step()
    written = list(tmp_path.glob("*.pt.trace.json.gz"))
    assert len(written) == 1
    assert f"tracewhy diagnose {written[0]}" in capsys.readouterr().err
    t = read_trace(written[0])
    steps = t.of_kind(Kind.ANNOTATION).filter(
        t.of_kind(Kind.ANNOTATION).get_column(Col.NAME).cast(str).str.starts_with("ProfilerStep#"))
    assert steps.height == 3
    assert t.meta.capture.with_stack is not True and t.meta.capture.profile_memory is not True


def test_profile_says_when_too_few_steps_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    with tracewhy.capture.profile(tmp_path, steps=5) as prof:
        prof.step()
    assert "no trace written" in capsys.readouterr().err


def test_commands_without_the_tool_are_printed(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", "")
    assert main(["capture", "ncu", "--kernel", "gemm", "--launch-skip", "3", "--", "python", "train.py"]) == 0
    out = capsys.readouterr().out
    assert " ".join(ncu_command(["python", "train.py"], "gemm", 3)) in out
    assert "--launch-count 1" in out and "tracewhy roofline kernel.ncu-rep" in out
    assert main(["capture", "nsys", "--", "python", "train.py", "--bs", "8"]) == 0
    out = capsys.readouterr().out
    assert "--capture-range=cudaProfilerApi" in out and "--output=run_%q{RANK}" in out
    assert out.rstrip().splitlines()[1].endswith("python train.py --bs 8")
    assert nsys_command(["x"])[-1] == "x"
    assert main(["capture", "ncu", "--", "python", "train.py"]) == 2  # no --kernel
    assert main(["capture", "nsys"]) == 2  # no job


def test_with_the_tool_it_runs_and_reads_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A stand-in ``ncu`` on PATH records its arguments and writes a real report where -o says."""
    report = shared_trace("ncu/a100pcie_mistic_multikernel_basic.ncu-rep")
    fake = tmp_path / "bin" / "ncu"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport shutil, sys\n"
                    "open('argv.txt', 'w').write(' '.join(sys.argv[1:]))\n"
                    f"shutil.copyfile({str(report)!r}, sys.argv[sys.argv.index('-o') + 1] + '.ncu-rep')\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    assert main(["capture", "ncu", "--kernel", "k", "--name", "mine", "--", "python", "job.py"]) == 0
    assert (tmp_path / "argv.txt").read_text().endswith("-o mine python job.py")
    assert capsys.readouterr().out.startswith("mine.ncu-rep: 154 launches of 5 kernels")  # roofline ran on it


def test_which_maps_symptoms(capsys: pytest.CaptureFixture[str]) -> None:
    assert answers(["where", "are", "the", "gaps?"])[0].tool.startswith("Nsight Systems")
    assert answers(["one rank is slow"])[0].symptom.startswith("one rank")
    assert answers(["graph breaks"])[0].capture.startswith("TORCH_LOGS")
    assert len(answers([])) == len(PLAYBOOK)
    assert main(["which", "kernel", "stall", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["answers"][0]["tool"] == "Nsight Compute" and "ncu --set full" in doc["answers"][0]["capture"]
    assert main(["which", "xyzzy"]) == 1
