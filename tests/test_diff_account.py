"""``diff`` says where the step changed, part by part, from both runs' step accounts: checked on
real before/after pairs (tests/data/calibration: DataLoader workers added; a grown cache
preallocated) against ``tracewhy account --json`` run on each side alone, and on HTA's two
tracediff captures (an A100 and a V100 run of one job, GPU parts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, shared_trace
from tracewhy.cli import main

CALIBRATION = ROOT / "tests" / "data" / "calibration"


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main([*args, "--json", "--no-cache"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _parts(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, int]]:
    doc = _json(["account", str(path)], capsys)
    return doc["mean_step_ns"], {p["part"]: p["ns_per_step"] for p in doc["parts"]}


@pytest.mark.parametrize(("a", "b", "moved"), [
    (CALIBRATION / "dataloader_workers_before_1.pt.trace.json.gz",
     CALIBRATION / "dataloader_workers_after_1.pt.trace.json.gz", "data loading"),
    (CALIBRATION / "cat_growth_before_1.pt.trace.json.gz", CALIBRATION / "cat_growth_after_1.pt.trace.json.gz",
     "host: aten::cat"),
], ids=["dataloader", "cat_growth"])
def test_the_change_is_each_accounts_parts(a: Path, b: Path, moved: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every part's A and B are the two accounts' own (a part one run lacks is 0 there), the
    changes add up to the change of the mean step (each account's parts add up to its step
    within 1%), and the fixed cause moved most: the loading that workers took off the step, the
    concatenations a preallocated cache no longer makes."""
    step_a, parts_a = _parts(a, capsys)
    step_b, parts_b = _parts(b, capsys)
    doc = _json(["diff", str(a), str(b)], capsys)
    assert (doc["a_account_step_ns"], doc["b_account_step_ns"]) == (step_a, step_b)
    rows = {r["part"]: r for r in doc["account"]}
    assert set(rows) == set(parts_a) | set(parts_b)
    for part, r in rows.items():
        assert r["a_ns_per_step"] == round(parts_a.get(part, 0))
        assert r["b_ns_per_step"] == round(parts_b.get(part, 0))
        assert r["delta_ns_per_step"] == r["b_ns_per_step"] - r["a_ns_per_step"]
    total = sum(r["delta_ns_per_step"] for r in doc["account"])
    assert abs(total - (step_b - step_a)) <= 0.01 * (step_a + step_b)
    assert doc["account"][0]["part"] == moved and doc["account"][0]["delta_ns_per_step"] < 0
    sizes = [abs(r["delta_ns_per_step"]) for r in doc["account"]]
    assert sizes == sorted(sizes, reverse=True)


def test_the_terminal_names_the_parts_that_moved(capsys: pytest.CaptureFixture[str]) -> None:
    a = CALIBRATION / "dataloader_workers_before_1.pt.trace.json.gz"
    b = CALIBRATION / "dataloader_workers_after_1.pt.trace.json.gz"
    assert main(["diff", str(a), str(b), "--no-cache"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Where the step changed (step account, mean analysed step" in out
    assert "data loading 12.351 ms -> 841.8 µs" in out


def test_gpu_runs_compare_their_gpu_parts(capsys: pytest.CaptureFixture[str]) -> None:
    """HTA's tracediff pair: the V100 run's kernels and copies grow where the A100 run's host
    waited untraced; the diff's parts are the GPU account's (kernels by family, copies)."""
    a = shared_trace("hta/tracediff_control_a100_rank3of8.json.gz")
    b = shared_trace("hta/tracediff_test_v100_rank1of2.json.gz")
    doc = _json(["diff", str(a), str(b)], capsys)
    kinds = {r["kind"] for r in doc["account"]}
    assert {"kernels", "copies"} <= kinds
    step_a, parts_a = _parts(a, capsys)
    assert doc["a_account_step_ns"] == step_a
    assert {r["part"] for r in doc["account"] if r["a_ns_per_step"]} == {p for p, ns in parts_a.items() if round(ns)}
