"""``tensor-grown-by-concat`` on real captures it was not written for: a decoder whose key/value
caches grow by torch.cat every token and the same decoder with a static cache
(scripts/gen_traces/growth_traces.py, record_shapes), an evaluation loop gathering embeddings
by torch.cat without shapes, the calibration's growth pairs (scripts/gen_traces/calibration.py,
no shapes), and the shared traces with the most concatenations per step, which grow nothing.
Counts, shapes and elements are read here from the raw JSON without tracewhy."""

from __future__ import annotations

import gzip
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from conftest import GENERATED, ROOT, diagnose_json, finding_of, shared_trace
from tracewhy.analyses import tensor_growth
from tracewhy.readers import read_trace

CALIBRATION = ROOT / "tests" / "data" / "calibration"
CODE = "tensor-grown-by-concat"


def _raw_steps(path: Path) -> list[list[dict[str, Any]]]:
    """Per ProfilerStep (its start to the next one's; the last to its end), its aten::cat calls in order."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in events if str(e["name"]).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    cats = sorted((e for e in events if e["name"] == "aten::cat"), key=lambda e: e["ts"])
    ends = [s["ts"] for s in steps[1:]] + [steps[-1]["ts"] + steps[-1]["dur"]]
    return [[c for c in cats if s["ts"] <= c["ts"] < end] for s, end in zip(steps, ends, strict=True)]


def _diagnose(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    return diagnose_json(path, capsys)


def _finding(doc: dict[str, Any]) -> dict[str, Any] | None:
    return finding_of(doc, CODE)


def test_a_growing_kv_cache_is_found_from_its_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    """Two caches of [32, 4, t, 64] grow by one token 40 times per step: 80 calls whose first
    input is the previous output; the elements they write are summed from the raw dims."""
    path = GENERATED / "cpu_growth_kv_cache.pt.trace.json.gz"
    raw = _raw_steps(path)
    growing = [[c for c in step if len(c["args"]["Input Dims"][0][0]) == 4] for step in raw]
    assert {len(g) for g in growing} == {80}
    written = [sum(math.prod([*d[0][:2], d[0][2] + d[1][2], d[0][3]])
                   for d in (c["args"]["Input Dims"][0] for c in g)) for g in growing]
    assert len(set(written)) == 1
    f = _finding(_diagnose(path, capsys))
    assert f is not None and f["part"] == "host: aten::cat"
    e = f["evidence"]
    assert e["evidence"] == "shapes" and e["tensors"] == 2 and e["axis"] == 2
    assert e["calls_per_step"] == 80
    assert e["first_shapes"] == growing[0][0]["args"]["Input Dims"][0]
    assert e["last_shapes"] == growing[0][-1]["args"]["Input Dims"][0]
    assert e["elements_written_per_step"] == written[0]
    assert e["elements_new_per_step"] == 80 * 32 * 4 * 64
    assert "torch.cat once at the end" in f["next_step"] and "record_shapes" not in f["next_step"]


@pytest.mark.parametrize("name", ["cpu_growth_kv_cache", "cpu_growth_collect"])
def test_the_prediction_gives_back_most_of_the_growth(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Written in place, each call costs what the cheapest took: the step is predicted shorter by
    most of the calls' own time, and by no more than it with the releases of the replaced
    tensors (the untraced time after each call). The calibration's growth pairs
    (bench/calibrate.py) measure the same replay against real after runs; these two captures
    have no after run made alongside them (the static-cache decoder was captured on its own, so
    its step time is not a measured pair)."""
    f = _finding(_diagnose(GENERATED / f"{name}.pt.trace.json.gz", capsys))
    assert f is not None
    saved = f["evidence"]["measured_step_ns"] - f["predicted_step_ns"]
    assert f["recoverable_ns_per_step"] == saved
    assert 0.5 * f["evidence"]["ns_per_step"] < saved <= 1.25 * f["evidence"]["ns_per_step"]


def test_fixed_size_concatenations_grow_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """The static-cache decoder still concatenates its query with a position every token (40
    calls per step of [32, 256] + [32, 1]), more calls than the threshold, but nothing grows."""
    path = GENERATED / "cpu_growth_static_cache.pt.trace.json.gz"
    assert {len(s) for s in _raw_steps(path)} == {40}
    assert tensor_growth.MIN_CALLS_PER_STEP < 40
    assert _finding(_diagnose(path, capsys)) is None


def test_without_shapes_rising_durations_decide(capsys: pytest.CaptureFixture[str]) -> None:
    """The evaluation loop records no shapes: 48 calls per step whose time rises along the
    step (raw: the last third's median over 3x the first third's in every step)."""
    path = GENERATED / "cpu_growth_collect.pt.trace.json.gz"
    raw = _raw_steps(path)
    assert all("Input Dims" not in c["args"] for s in raw for c in s)
    assert {len(s) for s in raw} == {48}
    for s in raw:
        dur = [c["dur"] for c in s]
        assert statistics.median(dur[-16:]) > 3 * statistics.median(dur[:16])
    f = _finding(_diagnose(path, capsys))
    assert f is not None and f["evidence"]["evidence"] == "durations"
    assert f["evidence"]["calls_per_step"] == 48 and f["evidence"]["first_shapes"] is None
    assert "record_shapes=True" in f["next_step"]
    assert f["severity"] in ("high", "medium") and f["recoverable_ns_per_step"] > 0


@pytest.mark.parametrize("repeat", [1, 2, 3, 4, 5])
def test_the_calibration_growth_pairs(repeat: int, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a key cache grown by torch.cat 64 times per step (no shapes): found, and the step
    predicted shorter; after: the cache preallocated (no aten::cat at all): nothing."""
    before = CALIBRATION / f"cat_growth_before_{repeat}.pt.trace.json.gz"
    assert {len(s) for s in _raw_steps(before)} == {64}
    f = _finding(_diagnose(before, capsys))
    assert f is not None and f["evidence"]["calls_per_step"] == 64
    assert f["predicted_step_ns"] < f["evidence"]["measured_step_ns"]
    after = CALIBRATION / f"cat_growth_after_{repeat}.pt.trace.json.gz"
    assert _finding(_diagnose(after, capsys)) is None


@pytest.mark.parametrize("name", ["hta/a100_16rank_rank0_alltoall.json.gz",
                                  "hta/tracediff_control_a100_rank3of8.json.gz"])
def test_many_concatenations_per_step_that_grow_nothing(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared traces with the most aten::cat calls per step (36 and 18, with shapes) grow
    nothing, whether their shapes decide or, with the shapes ignored, their durations."""
    from tracewhy.analyses.steps import StepCol, steps

    path = shared_trace(name)
    trace = read_trace(path)
    steady = steps(trace).table.filter(steps(trace).table[StepCol.STEADY])
    windows = list(zip(steady[StepCol.TS].to_list(), steady[StepCol.WINDOW_END].to_list(), strict=True))
    raw = _raw_steps(path)
    assert max(len(s) for s in raw) >= 18
    assert tensor_growth.tensor_growth(trace, windows) == []
    monkeypatch.setattr(tensor_growth, "_by_shapes", lambda *a: (False, None))
    assert tensor_growth.tensor_growth(trace, windows) == []


def test_the_account_line_points_at_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    """The account calls the concatenations essential work (their copies are the op's own); the
    "Where the step goes" line says which finding makes that work cheaper, by how much."""
    from tracewhy.cli import main

    assert main(["diagnose", str(GENERATED / "cpu_growth_collect.pt.trace.json.gz"), "--no-cache"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "host: aten::cat" in ln and "%" in ln)
    number = next(ln for ln in out.splitlines() if f"] {CODE}" in ln).strip().split(".")[0]
    assert "essential" in line and f"see {number}. {CODE}: step " in line and " shorter" in line
