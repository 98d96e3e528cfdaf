"""``activation-recompute`` on real captures: the calibration's checkpointing pairs (CPU captures
made by scripts/gen_traces/calibration.py: 8 blocks of Linear, GELU, Linear under
torch.utils.checkpoint, and the same blocks without it) and TraceLens' MI300X ResNet with
activation checkpointing (its recompute-detection test trace; DDP rank 0 of 8). The ops backward
reruns are counted here from the raw JSON without tracewhy: ops autograd records as forward ops
(a ``Sequence number`` arg; not an engine node, a ``*Backward`` function or AccumulateGrad) inside
an ``autograd::engine::evaluate_function`` span of their thread, outermost only."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, shared_trace
from tracewhy.cli import main

DATA = ROOT / "tests" / "data" / "calibration"
_BACKWARD_FUNCTION = re.compile(r"Backward\d*$")


def _raw_reruns(path: Path) -> tuple[float, float]:
    """Per step (a ProfilerStep annotation's start to the next one's), the median count and the
    mean total duration (µs) of the rerun forward ops (the account's figures are means over its
    analysed steps: here every step of the capture)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    nodes: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        if str(e["name"]).startswith("autograd::engine::evaluate_function"):
            nodes.setdefault(e["tid"], []).append(e)
    steps = sorted((e for e in events if str(e["name"]).startswith("ProfilerStep#")
                    and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])

    def inside(e: dict[str, Any], w: dict[str, Any]) -> bool:
        return bool(w["ts"] <= e["ts"] and e["ts"] + e["dur"] <= w["ts"] + w["dur"])

    forward = [e for e in events if e.get("cat") == "cpu_op" and "Sequence number" in e.get("args", {})
               and not str(e["name"]).startswith("autograd::") and not _BACKWARD_FUNCTION.search(str(e["name"]))
               and "AccumulateGrad" not in str(e["name"])]
    reruns = sorted((e for e in forward if any(inside(e, n) for n in nodes.get(e["tid"], []))),
                    key=lambda e: (str(e["tid"]), e["ts"], -e["dur"]))
    outermost: list[dict[str, Any]] = []
    for e in reruns:
        if not (outermost and outermost[-1]["tid"] == e["tid"] and inside(e, outermost[-1])):
            outermost.append(e)
    counts, times = [], []
    for step, following in zip(steps, [*steps[1:], None], strict=True):
        end = following["ts"] if following is not None else float("inf")
        mine = [e for e in outermost if step["ts"] <= e["ts"] < end]
        counts.append(len(mine))
        times.append(sum(e["dur"] for e in mine))
    return statistics.median(counts), statistics.mean(times)


def _finding(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any] | None:
    assert main(["diagnose", str(path), "--json", "--no-cache"]) == 0
    found = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["code"] == "activation-recompute"]
    return found[0] if found else None


@pytest.mark.parametrize("repeat", [1, 2, 3])
def test_backward_reruns_are_counted_timed_and_priced(repeat: int, capsys: pytest.CaptureFixture[str]) -> None:
    """The rerun ops per step are the raw file's (24: the 3 forward ops of 8 blocks); their time on
    the critical path is at most the ops' own and, the CPU run being one thread, most of it; the
    finding explains backward and predicts a shorter step (the replay calibrate.py checks
    against the pair's measured step)."""
    count, micros = _raw_reruns(DATA / f"checkpointing_before_{repeat}.pt.trace.json.gz")
    assert count == 24
    f = _finding(DATA / f"checkpointing_before_{repeat}.pt.trace.json.gz", capsys)
    assert f is not None and f["part"] == "backward"
    assert f["evidence"]["recomputed_ops_per_step"] == count
    on_path = f["evidence"]["recompute_ns_per_step"]
    assert 0.5 * micros * 1e3 <= on_path <= 1.05 * micros * 1e3
    measured = f["evidence"]["measured_step_ns"]
    assert f["predicted_step_ns"] < measured - on_path  # the hooks go too: more than the ops' time
    assert f["recoverable_ns_per_step"] == measured - f["predicted_step_ns"]
    assert "selective checkpointing" in f["next_step"]


@pytest.mark.parametrize("repeat", [1, 2, 3])
def test_without_checkpointing_there_is_no_finding(repeat: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert _raw_reruns(DATA / f"checkpointing_after_{repeat}.pt.trace.json.gz")[0] == 0
    assert _finding(DATA / f"checkpointing_after_{repeat}.pt.trace.json.gz", capsys) is None


def test_a_gpu_trace_reruns_are_counted(capsys: pytest.CaptureFixture[str]) -> None:
    """TraceLens' checkpointed ResNet: 89 rerun ops per step (conv2d, batch_norm, relu_, the
    residual add_ and clone), all on the backward thread; on a GPU they are mostly the kernels they
    launch, and with the all-reduce on the path the replay gives back less than their time."""
    path = shared_trace("tracelens/mi300x_resnet_actckpt_ddp8_rank0.json.gz")
    count, _ = _raw_reruns(path)
    f = _finding(path, capsys)
    assert f is not None and count == 89 == f["evidence"]["recomputed_ops_per_step"]
    assert 0 < f["recoverable_ns_per_step"] < f["evidence"]["recompute_ns_per_step"]
