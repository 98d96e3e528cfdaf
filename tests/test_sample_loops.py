"""``per-sample-loop`` and the account's blocks that make no autograd node, on real captures: the
calibration's host-loop pairs (scripts/gen_traces/calibration.py: ``preprocess`` normalises 64
samples one by one, then vectorised) and a generated step it was not written for
(scripts/gen_traces/loop_traces.py: ``augment`` indexes 32 images one by one beside an
``encoder`` block of 12 identical layers). Iterations and ops are counted here from the raw
JSON: the outermost ops of each block call (ops nested in no other op), in order."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conftest import GENERATED, ROOT, diagnose_json, finding_of

CALIBRATION = ROOT / "tests" / "data" / "calibration"
CODE = "per-sample-loop"


def _raw_block_ops(path: Path, block: str) -> list[list[str]]:
    """Per call of the block, the names of its outermost ops in time order."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    out = []
    for call in (e for e in events if e["name"] == block and e.get("cat") == "user_annotation"):
        inside = [e for e in ops if e["tid"] == call["tid"] and call["ts"] <= e["ts"] < call["ts"] + call["dur"]]
        outermost: list[dict[str, Any]] = []
        for e in inside:
            if not (outermost and e["ts"] < outermost[-1]["ts"] + outermost[-1]["dur"]):
                outermost.append(e)
        out.append([e["name"] for e in outermost])
    return out


def _diagnose(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    return diagnose_json(path, capsys)


def _finding(doc: dict[str, Any]) -> dict[str, Any] | None:
    return finding_of(doc, CODE)


@pytest.mark.parametrize("repeat", [1, 2, 3, 4, 5])
def test_the_calibration_loop_is_found_and_priced(repeat: int, capsys: pytest.CaptureFixture[str]) -> None:
    """``for x in batch`` over 64 samples: one aten::unbind, then mean, sub, std, add, div 64 times
    each; the account gives the block's ops to ``host: preprocess`` (they make no autograd node,
    though recorded in grad mode), which the finding explains with a shorter step predicted."""
    path = CALIBRATION / f"host_loop_before_{repeat}.pt.trace.json.gz"
    calls = _raw_block_ops(path, "preprocess")
    counts = Counter(calls[0])
    assert calls[0][0] == "aten::unbind" and counts["aten::mean"] == 64
    doc = _diagnose(path, capsys)
    f = _finding(doc)
    assert f is not None and f["part"] == "host: preprocess"
    e = f["evidence"]
    assert e["iterations"] == 64 and e["walk"] == "aten::unbind"
    assert e["ops"] == [n for n in dict.fromkeys(calls[0][1:]) if counts[n] >= 64]
    assert 0 < f["predicted_step_ns"] < e["measured_step_ns"]
    parts = {p["part"]: p for p in doc["account"]}
    assert parts["host: preprocess"]["essential"] is False
    assert "aten::std" not in parts["forward"]["evidence"]


@pytest.mark.parametrize("repeat", [1, 2, 3, 4, 5])
def test_the_vectorised_block_is_no_loop(repeat: int, capsys: pytest.CaptureFixture[str]) -> None:
    path = CALIBRATION / f"host_loop_after_{repeat}.pt.trace.json.gz"
    assert max(Counter(_raw_block_ops(path, "preprocess")[0]).values()) < 8
    assert _finding(_diagnose(path, capsys)) is None


def test_an_indexing_loop_beside_repeated_layers(capsys: pytest.CaptureFixture[str]) -> None:
    """``augment`` indexes ``batch[i]`` 32 times per call (aten::select once per image); ``encoder``
    runs Linear and GELU 12 times each, once per layer on the whole batch, and indexes nothing:
    only the first is a loop over samples."""
    path = GENERATED / "cpu_loop_augment.pt.trace.json.gz"
    augment = _raw_block_ops(path, "augment")
    assert {Counter(c)["aten::select"] for c in augment} == {32}
    encoder = _raw_block_ops(path, "encoder")
    assert {Counter(c)["aten::linear"] for c in encoder} == {12} and all("aten::select" not in c for c in encoder)
    f = _finding(_diagnose(path, capsys))
    assert f is not None and f["evidence"]["block"] == "augment"
    assert f["evidence"]["iterations"] == 32 and f["evidence"]["walk"] == "aten::select"
    assert f["part"] == "host: augment" and f["recoverable_ns_per_step"] > 0
