"""``tracewhy nvtx``: per range name, nsys ``nvtx_sum`` statistics and the ``nvtx_gpu_proj_sum``
projection, checked row by row against NVIDIA's golden CSVs; Kineto user annotations against
the raw JSON."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from conftest import shared_trace
from nsys_support import FIXTURES, WHOLE_NS, close, export_path, golden
from tracewhy.cli import main

KINETO = "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    out = json.loads(_run(capsys, *argv, "--json"))
    assert isinstance(out, dict) and out["command"] == "nvtx"
    return out


@pytest.mark.parametrize("name", FIXTURES)
def test_nvtx_matches_nvtx_sum_and_nvtx_gpu_proj_sum(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "nvtx", str(export_path(name)))
    ours = {(r["name"], r["style"]): r for r in out["ranges"]}
    sums = golden(name, "stats_nvtx_sum")
    if sums is None:  # nsys SKIPS a file without NVTX data (nsysai_mock_rtx3080)
        assert out["ranges"] == [] and out["note"] is not None and "no NVTX ranges" in out["note"]
        return
    assert set(ours) == {(r["Range"], r["Style"]) for r in sums}
    assert out["range_count"] == sum(int(r["Instances"]) for r in sums)
    assert out["total_ns"] == sum(int(r["Total Time (ns)"]) for r in sums)
    for r in sums:
        m = ours[(r["Range"], r["Style"])]
        assert (m["count"], m["total_ns"], m["min_ns"], m["max_ns"]) == (
            int(r["Instances"]), int(r["Total Time (ns)"]), int(r["Min (ns)"]), int(r["Max (ns)"])), r["Range"]
        for col, g in (("mean_ns", "Avg (ns)"), ("median_ns", "Med (ns)"), ("stddev_ns", "StdDev (ns)")):
            assert isinstance(m[col], int) and close(m[col], r[g], WHOLE_NS), (r["Range"], col)
        assert close(100 * m["share"], r["Time (%)"]), r["Range"]
    projected = golden(name, "stats_nvtx_gpu_proj_sum") or []
    for r in projected:
        m = ours[(r["Range"], r["Style"])]
        assert (m["proj_instances"], m["total_proj_ns"], m["total_gpu_ops"]) == (
            int(r["Range Instances"]), int(r["Total Proj Time (ns)"]), int(r["Total GPU Ops"])), r["Range"]
        assert (m["proj_min_ns"], m["proj_max_ns"]) == (int(r["Proj Min (ns)"]), int(r["Proj Max (ns)"]))
        for col, g in (("proj_mean_ns", "Proj Avg (ns)"), ("proj_median_ns", "Proj Med (ns)"),
                       ("proj_stddev_ns", "Proj StdDev (ns)")):
            assert isinstance(m[col], int) and close(m[col], r[g], WHOLE_NS), (r["Range"], col)
        assert m["total_gpu_time_ns"] is not None and m["total_gpu_busy_ns"] <= m["total_gpu_time_ns"]
    # Names nsys projects nothing onto have no projection at all (null, not 0).
    without = set(ours) - {(r["Range"], r["Style"]) for r in projected}
    assert all(ours[k]["total_proj_ns"] is None and ours[k]["total_gpu_ops"] is None for k in without)


def test_nvtx_output_is_deterministic_sorted_and_topped(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(export_path("nvfuser_xent_h200_2025.1"))
    first = _run(capsys, "nvtx", path, "--json")
    assert _run(capsys, "nvtx", path, "--json") == first
    out = json.loads(first)
    totals = [(-r["total_ns"], r["name"], r["style"]) for r in out["ranges"]]
    assert totals == sorted(totals)
    assert list(out) == sorted(out) and list(out["ranges"][0]) == sorted(out["ranges"][0])
    text = _run(capsys, "nvtx", path, "--top", "3")
    assert f"{len(out['ranges']) - 3} more names" in text
    body = [line for line in text.splitlines() if line.startswith("│")]
    assert len(body) == 3 and out["ranges"][0]["name"][:20] in body[0]


def test_nvtx_on_kineto_uses_user_annotations(capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_trace(KINETO)
    raw = json.loads(gzip.decompress(path.read_bytes()))
    steps = {e["name"]: e for e in raw["traceEvents"]
             if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")}
    assert steps
    out = _json(capsys, "nvtx", str(path))
    assert out["source"] == "user annotations"
    ours = {r["name"]: r for r in out["ranges"]}
    for name, e in steps.items():
        assert ours[name]["count"] == 1 and ours[name]["style"] == "PushPop"
        assert abs(ours[name]["total_ns"] - e["dur"] * 1000) <= 1
        assert ours[name]["total_gpu_ops"] > 0  # each training step launches kernels


def test_nvtx_without_ranges_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(export_path("nsysai_mock_rtx3080"))
    assert _run(capsys, "nvtx", path) == f"no NVTX ranges in {path}\n"
