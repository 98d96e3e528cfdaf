"""Kineto files that read cleanly into wrong figures, made from a real trace (HTA's A100
multistream capture: 3 kernels, 3 memsets, 39 runtime calls): each is read as it is, and a
warning the user sees says which figures not to trust."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import shared_trace
from tracewhy.cli import main
from tracewhy.model.schema import Kind
from tracewhy.readers import read_trace

US_PER_DAY = 86_400 * 10**6


def _events() -> list[dict[str, Any]]:
    doc = json.loads(gzip.decompress(shared_trace("hta/a100_cuda_event_sync_multistream.json.gz").read_bytes()))
    events: list[dict[str, Any]] = doc["traceEvents"] if isinstance(doc, dict) else doc
    return events


def _kernels(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]


def _one_correlation(events: list[dict[str, Any]]) -> None:
    for e in events:
        if isinstance(e.get("args"), dict) and "correlation" in e["args"]:
            e["args"]["correlation"] = 1
        if e.get("cat") == "ac2g":
            e["id"] = 1


def _days_early(events: list[dict[str, Any]]) -> None:
    for e in _kernels(events):
        e["ts"] -= 3 * US_PER_DAY


def _years_late(events: list[dict[str, Any]]) -> None:
    _kernels(events)[0]["ts"] += 31 * 365 * US_PER_DAY


def _instants(events: list[dict[str, Any]]) -> None:
    for e in _kernels(events):
        e["ph"] = "i"
        del e["dur"]


@pytest.mark.parametrize(("mutate", "warning"), [
    (_one_correlation, "runtime launches share 1 correlation id(s) with other launches: their GPU work cannot be "
                       "told apart"),
    (_days_early, "3 GPU activities start more than 1 s before the call that launched them (up to 2.59e+05 s)"),
    (_years_late, "1 GPU activities start more than 1 h after the call that launched them (up to 9.78e+08 s)"),
    (_instants, "3 events: GPU activity written as an instant (ph 'i', no duration): not read as GPU work"),
], ids=["one-correlation-id", "days-before-launch", "years-after-launch", "kernels-as-instants"])
def test_a_silent_wrong_answer_gets_a_warning(mutate: Callable[[list[dict[str, Any]]], None], warning: str,
                                              tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = _events()
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps({"traceEvents": events}))
    assert not [w for w in read_trace(clean).meta.warnings if "launch" in w or "instant" in w]
    mutate(events)
    path = tmp_path / "mutated.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = read_trace(path)
    assert [w for w in trace.meta.warnings if warning in w], trace.meta.warnings
    if mutate is _instants:
        assert trace.of_kind(Kind.KERNEL).height == 0
    assert main(["kernels", str(path)]) == 0
    assert warning in capsys.readouterr().err
