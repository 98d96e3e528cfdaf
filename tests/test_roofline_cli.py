"""``tracewhy roofline`` end to end: tables, JSON ready for plotting, and one-line errors."""

from __future__ import annotations

import importlib
import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import shared_trace
from tracewhy.cli import EXIT_BAD_INPUT, EXIT_OK, main


def _needs_ncu_report() -> None:
    try:
        importlib.import_module("ncu_report")
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI must install the [ncu] extra: pip install ncu-report")
        pytest.skip("ncu_report not installed")


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["roofline", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_ncu_report_table(capsys: pytest.CaptureFixture[str]) -> None:
    _needs_ncu_report()
    code, out, _ = _run(capsys, str(shared_trace("ncu/v100_ncar_miniweather_baseline.ncu-rep")))
    assert code == EXIT_OK
    assert "compute_tendencies_x_279_gpu" in out and "compute-bound" in out
    assert "clocks were locked" in out and "ncu SOLBottleneck" in out


def test_ncu_report_json_has_plot_ready_points(capsys: pytest.CaptureFixture[str]) -> None:
    _needs_ncu_report()
    code, out, _ = _run(capsys, str(shared_trace("ncu/v100_ncar_miniweather_baseline.ncu-rep")), "--json")
    assert code == EXIT_OK
    doc = json.loads(out)
    assert doc["command"] == "roofline" and doc["source"] == "ncu"
    assert len(doc["kernels"]) == 5 and len(doc["launches"]) == 5
    roof = doc["roofline"]
    assert roof["ceilings"]["dram_bytes_per_s"] > 0 and roof["ceilings"]["flop_per_s"]["fp64"] > 0
    points = {p["name"]: p for p in roof["points"]}
    hot = points["compute_tendencies_x_279_gpu"]
    # The point lies under the roof: FLOP/s <= min(peak, AI x bandwidth) of its precision.
    peak = roof["ceilings"]["flop_per_s"][hot["precision"]]
    assert hot["flop_per_s"] <= min(peak, hot["arithmetic_intensity"] * roof["ceilings"]["dram_bytes_per_s"]) * 1.05


def test_per_launch_view(capsys: pytest.CaptureFixture[str]) -> None:
    _needs_ncu_report()
    code, out, _ = _run(capsys, str(shared_trace("ncu/h100_appliedai_stochround_sizesweep.ncu-rep")), "--launches")
    assert code == EXIT_OK and "launches by GPU time" in out
    assert "latency" in out and "memory" in out


def test_csv_export_with_device_for_peaks(capsys: pytest.CaptureFixture[str]) -> None:
    # The RTX 5070 --metrics exports carry DRAM bytes but no device name: --device supplies peaks.
    path = str(shared_trace("ncu/csv_rtx5070_olajide/saxpy.csv"))
    code, out, _ = _run(capsys, path, "--json", "--device", "GeForce RTX 5070")
    assert code == EXIT_OK
    launch = json.loads(out)["launches"][0]
    # saxpy streams x and y: (134,221,568 + 43,631,104) bytes in 292,928 ns = 607 GB/s, 90% of
    # the card's 672 GB/s: memory-bound.
    assert launch["dram_bytes_per_s"] == pytest.approx((134_221_568 + 43_631_104) / 292_928e-9)
    assert launch["bound"] == "memory-bound"


def test_naive_transpose_stores_are_flagged_uncoalesced(capsys: pytest.CaptureFixture[str]) -> None:
    # A naive transpose writes a column per warp: 32 threads, 32 different rows, 32 sectors per
    # store request (the export: 4,194,304 sectors / 131,072 requests). The tiled one writes rows.
    naive = json.loads(_run(capsys, str(shared_trace("ncu/csv_rtx5070_olajide/transpose_naive.csv")), "--json")[1])
    tiled = json.loads(_run(capsys, str(shared_trace("ncu/csv_rtx5070_olajide/transpose_tiled.csv")), "--json")[1])
    assert naive["launches"][0]["sectors_per_store"] == 32 and naive["launches"][0]["uncoalesced"] is True
    assert tiled["launches"][0]["sectors_per_store"] == 4 and tiled["launches"][0]["uncoalesced"] is False


def test_kineto_trace_shape_based(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(shared_trace("tracelens/h100_qwen1.5-0.5b_bs16_seq2048.json.gz"))
    code, out, _ = _run(capsys, path)
    assert code == EXIT_OK and "shape-based roofline" in out and "furthest below their roof" in out
    code, out, _ = _run(capsys, path, "--json")
    doc = json.loads(out)
    assert doc["source"] == "shapes" and doc["roofline"]["ceilings"]["device"] == "H100 SXM"
    assert doc["roofline"]["points"] and doc["furthest_below_roof"]
    lost = [row["lost_ns"] for row in doc["furthest_below_roof"]]
    assert lost == sorted(lost, reverse=True)


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("garbage.csv", b"hello\nworld\n", 'header line starting with "ID"'),
        ("empty.csv", b"", "empty"),
        ("x.ncu-rep", b"NVR\x00\x02\x00\x00\x00", "truncated"),
        ("x.ncu-rep.bin", b"\x00\x01binary", "not a PyTorch profiler trace"),
    ],
)
def test_bad_input_is_one_line_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                                      content: bytes, fragment: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    code, _, err = _run(capsys, str(path))
    assert code == EXIT_BAD_INPUT and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and fragment in lines[0], err


def test_truncated_real_report_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = shared_trace("ncu/rtx3060ti_llmc_adamw.ncu-rep")
    path = tmp_path / "cut.ncu-rep"
    shutil.copyfile(src, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    code, _, err = _run(capsys, str(path))
    assert code == EXIT_BAD_INPUT and "truncated" in err and len(err.strip().splitlines()) == 1


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, str(tmp_path / "nope.ncu-rep"))
    assert code == EXIT_BAD_INPUT and "no such file" in err


def test_hostile_kernel_name_prints_plainly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A kernel name is text from someone else's file: no terminal escapes, no rich markup.
    hostile = "k\x1b[31m[red]x[/red]\u202e"
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Section Name",'
              '"Metric Name","Metric Unit","Metric Value"')
    rows = [f'"0","1","app","h","{hostile}","1","7","SOL","{label}","{unit}","{value}"'
            for label, unit, value in (("Duration", "ns", "1000"), ("Compute (SM) Throughput", "%", "85"),
                                       ("Memory Throughput", "%", "20"))]
    path = tmp_path / "hostile.csv"
    path.write_text("\n".join([header, *rows]))
    code, out, _ = _run(capsys, str(path))
    assert code == EXIT_OK
    assert "\x1b" not in out and "\u202e" not in out and "[red]x[/red]" in out
    code, out, _ = _run(capsys, str(path), "--json")
    assert json.loads(out)["kernels"][0]["name"] == hostile  # JSON keeps the exact name
