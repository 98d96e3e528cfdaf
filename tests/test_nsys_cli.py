"""The existing commands accept Nsight Systems input, sniffed by content (plain or gzipped
SQLite), and say what they can on it; bad nsys input exits 3 with one line."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from nsys_support import ExportBuilder, export_path, golden
from tracewhy.cli import main


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert isinstance(out, dict)
    return out


@pytest.mark.parametrize("name", ["nsysai_h100_2gpu_1s", "nvfuser_xent_h200_2025.1"])
def test_kernels_command_matches_nsys_stats(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "kernels", str(export_path(name)))
    rows = golden(name, "stats_cuda_gpu_kern_sum")
    assert rows is not None
    assert out["total_count"] == sum(int(r["Instances"]) for r in rows)
    assert out["total_time_ns"] == sum(int(r["Total Time (ns)"]) for r in rows)
    ours = {k["name"]: k for k in out["kernels"]}  # type: ignore[attr-defined]
    for r in rows:
        k = ours[r["Name"]]
        assert (k["count"], k["total_ns"], k["min_ns"], k["max_ns"]) == (
            int(r["Instances"]), int(r["Total Time (ns)"]), int(r["Min (ns)"]), int(r["Max (ns)"]))


def test_info_steps_and_ops_on_nsys_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # A plain SQLite copy with a misleading name: the content decides.
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress(export_path("nvfuser_xent_h200_2025.1").read_bytes()))
    info = _json(capsys, "info", str(plain))["info"]
    assert isinstance(info, dict)
    assert info["format"] == "nsys" and info["versions"]["nsys"] == "2025.1.1.110"
    assert info["devices"][0]["name"] == "NVIDIA H200"
    assert info["step_marker"] == "FusionExecutorCache::runFusionWithInputs" and info["step_count"] == 2
    st = _json(capsys, "steps", str(plain), "--step", "FusionKernelRuntime::runWithInputs")
    assert st["marker"] == "FusionKernelRuntime::runWithInputs" and len(st["steps"]) == 2  # type: ignore[arg-type]
    # nsys input has no CPU operators: every GPU ns is unattributed (see nvtx projection instead).
    ops = _json(capsys, "ops", str(plain))
    assert ops["ops"] == [] and ops["gpu_unattributed_ns"] == ops["gpu_time_ns"]
    assert main(["kernels", str(plain)]) == 0
    assert "18 kernels, 10.168 ms total" in capsys.readouterr().out


def test_bad_nsys_input_exits_3(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"\x00private")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    monkeypatch.delenv("TRACEWHY_NSYS", raising=False)
    assert main(["info", str(report)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nsys export --type sqlite" in err
    # An export with no events at all still loads: info says so.
    empty = ExportBuilder().write(tmp_path / "empty.sqlite")
    shutil.copy(empty, tmp_path / "e2.sqlite")
    out = _json(capsys, "info", str(tmp_path / "e2.sqlite"))["info"]
    assert isinstance(out, dict) and any("no CUDA, NVTX" in w for w in out["warnings"])
