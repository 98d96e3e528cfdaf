"""``comm-exposed`` on runs with no GPU, from the calibration's gloo pairs (scripts/gen_traces/
calibration.py: two ranks on loopback; before, one dist.all_reduce per gradient after backward;
after, DDP) and the generated DDP captures. Calls, gradients and their order are read here from
the raw JSON: per ProfilerStep, the c10d collective ops on the step's thread (outermost among
collectives) and the AccumulateGrad engine nodes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import GENERATED, ROOT, diagnose_json, finding_of

CALIBRATION = ROOT / "tests" / "data" / "calibration"


def _raw(path: Path) -> list[tuple[int, int, bool]]:
    """Per step: (collective calls on the step's thread, AccumulateGrad nodes, whether the first
    call starts after the last autograd engine node ended)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in events if str(e["name"]).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    out = []
    for step in steps:
        def inside(e: dict[str, Any], s: dict[str, Any] = step) -> bool:
            return bool(s["ts"] <= e["ts"] < s["ts"] + s["dur"])
        calls = sorted((e for e in events if inside(e) and e["tid"] == step["tid"]
                        and str(e["name"]).startswith("c10d::")), key=lambda e: e["ts"])
        outer = [c for c in calls if not any(o is not c and o["ts"] <= c["ts"] < o["ts"] + o["dur"] for o in calls)]
        nodes = [e for e in events if inside(e) and str(e["name"]).startswith("autograd::engine::evaluate_function")]
        accumulate = [n for n in nodes if str(n["name"]).endswith("AccumulateGrad")]
        after = bool(outer) and bool(nodes) and outer[0]["ts"] >= max(n["ts"] + n["dur"] for n in nodes)
        out.append((len(outer), len(accumulate), after))
    return out


@pytest.mark.parametrize("repeat", [1, 2, 3, 4, 5])
def test_gradients_all_reduced_one_by_one_after_backward(repeat: int, capsys: pytest.CaptureFixture[str]) -> None:
    """12 gradients, 12 all-reduces per step, all after backward: the finding says so, explains
    the communication part and predicts the step with them hidden under backward (the replay
    calibrate.py measures against the DDP runs)."""
    path = CALIBRATION / f"grad_allreduce_before_{repeat}.pt.trace.json.gz"
    raw = _raw(path)
    assert {r[:2] for r in raw} == {(12, 12)} and all(r[2] for r in raw)
    f = finding_of(diagnose_json(path, capsys), "comm-exposed")
    assert f is not None and f["part"].startswith("communication: ")
    assert f["evidence"]["calls_per_step"] == 12 == f["evidence"]["gradients_per_step"]
    assert "one per gradient" in f["statement"] and "after backward" in f["statement"]
    assert "DistributedDataParallel" in f["next_step"]
    measured = f["evidence"]["measured_step_ns"]
    assert f["evidence"]["fix"] == "all_reduce hidden under compute"
    assert f["recoverable_ns_per_step"] == measured - f["predicted_step_ns"] > 0


@pytest.mark.parametrize("path", [
    *(CALIBRATION / f"grad_allreduce_after_{i}.pt.trace.json.gz" for i in (1, 2, 3, 4, 5)),
    GENERATED / "ddp_gloo_rank0.pt.trace.json.gz", GENERATED / "ddp_gloo_bcast_rank0.pt.trace.json.gz"],
    ids=lambda p: p.name.split(".")[0])
def test_ddp_starts_them_under_backward(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """DDP all-reduces buckets from backward's hooks: the first call starts before backward ends,
    so the cause of any wait left (a late rank, collectives slower than backward) is not this
    rule's to name; on the CPU the advice for it points at the ranks' skew, not at device streams."""
    raw = _raw(path)
    assert not any(r[2] for r in raw)
    doc = diagnose_json(path, capsys)
    assert finding_of(doc, "comm-exposed") is None
    for f in doc["findings"]:
        if f["code"] == "unexplained-part" and str(f["part"]).startswith("communication: "):
            assert "tracewhy ranks" in f["next_step"] and "overlap" not in f["next_step"]
