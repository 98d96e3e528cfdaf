"""Rules on two threads, and diff's two diagnoses at once (small traces only), change nothing:
the same findings in the same order as one after the other, each analysis computed once, and the
caller's context variables reach every rule."""

from __future__ import annotations

import threading
import time
from contextvars import ContextVar

import msgspec
import pytest

from conftest import shared_trace
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding
from tracewhy.readers import read_trace
from tracewhy.renderers.diagnose import diagnose_payload
from tracewhy.renderers.diff import comparison_payload
from tracewhy.renderers.jsonout import to_jsonable
from tracewhy.renderers.report import overview_payload
from tracewhy.reports import at_once
from tracewhy.reports import diagnose as diagnose_module
from tracewhy.reports.diagnose import diagnose
from tracewhy.reports.diff import compare
from tracewhy.reports.overview import overview

#: Small real traces of different kinds: inference with memory events, torch.compile training,
#: DDP with NCCL, and an Nsight Systems export.
_TRACES = (
    "tracelens/h100_bert-small_bs1_seq512.json.gz",
    "perfdigest/rtx4060laptop_torch_compiled_train.json.gz",
    "hta/a100_ddp2_rank0_nccl2.17.json.gz",
    "nsys/nsysai_mfu_2gpu_before.sqlite.gz",
)


def _encoded(value: object) -> bytes:
    return msgspec.json.encode(to_jsonable(value), order="sorted")


@pytest.mark.parametrize("relative", _TRACES)
def test_threaded_rules_find_what_sequential_rules_find(relative: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(at_once, "several_cpus", lambda: True)  # (also where this process has one CPU)
    trace = read_trace(shared_trace(relative))
    assert at_once.small(trace)  # the threaded path runs
    threaded = diagnose(trace)
    monkeypatch.setattr(at_once, "MAX_SLICES", -1)
    sequential = diagnose(read_trace(shared_trace(relative)))
    assert threaded.findings, relative
    assert _encoded(diagnose_payload(threaded)) == _encoded(diagnose_payload(sequential))


def test_diff_at_once_equals_diff_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    a = read_trace(shared_trace("hta/tracediff_test_v100_rank1of2.json.gz"))
    b = read_trace(shared_trace("hta/v100_ddp2_rank1_memprofile.json.gz"))
    monkeypatch.setattr(at_once, "several_cpus", lambda: True)
    assert at_once.small(a, b)
    together = compare(a, b)
    monkeypatch.setattr(at_once, "MAX_SLICES", -1)
    in_turn = compare(read_trace(a.meta.path), read_trace(b.meta.path))
    assert together.findings_compared
    assert _encoded(comparison_payload(together)) == _encoded(comparison_payload(in_turn))


def test_an_analysis_asked_for_by_two_threads_runs_once() -> None:
    ctx = Context(read_trace(shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz")))
    calls: list[int] = []
    started = threading.Event()

    def slow() -> object:
        calls.append(1)
        started.set()
        time.sleep(0.2)  # the second thread asks while this one is still computing
        return object()

    got: list[object] = []
    first = threading.Thread(target=lambda: got.append(ctx.cached("k", slow)))
    first.start()
    started.wait()
    got.append(ctx.cached("k", slow))
    first.join()
    assert len(calls) == 1
    assert got[0] is got[1]


_SEEN: ContextVar[str] = ContextVar("test_seen", default="unset")


def test_context_variables_reach_every_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []

    def rule(ctx: Context) -> list[Finding]:
        seen.append((_SEEN.get(), threading.current_thread().name))
        return []

    monkeypatch.setattr(diagnose_module, "RULES", (rule,) * 6)
    monkeypatch.setattr(at_once, "several_cpus", lambda: True)
    token = _SEEN.set("caller's value")
    try:
        diagnose(read_trace(shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz")))
    finally:
        _SEEN.reset(token)
    assert [value for value, _ in seen] == ["caller's value"] * 6
    assert all(name.startswith("tracewhy-rule") for _, name in seen)  # they did run on the pool


@pytest.mark.parametrize("relative", [_TRACES[0], _TRACES[3]])
def test_report_views_at_once_equal_views_in_turn(relative: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(at_once, "several_cpus", lambda: True)
    together = overview_payload(overview(read_trace(shared_trace(relative))))
    monkeypatch.setattr(at_once, "MAX_SLICES", -1)
    in_turn = overview_payload(overview(read_trace(shared_trace(relative))))
    assert together["findings"]
    assert _encoded(together) == _encoded(in_turn)
