"""The step account is left out where it would not fit in the memory available
(``analyses/account_memory``): the memory read from /proc and the cgroup files, the threshold,
and diagnoses of real traces made with little memory. Those diagnoses never build the graph
or the step model, say so in a trust finding, and keep every other rule's findings."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import msgspec
import pytest

from conftest import shared_trace
from tracewhy.analyses import account_memory, critical_path_graph
from tracewhy.analyses.account_memory import (
    BYTES_PER_SLICE,
    FIXED_BYTES,
    HEADROOM,
    REST_BYTES_PER_SLICE,
    available_bytes,
    short_of_memory,
)
from tracewhy.analyses.critical_path_graph import GRAPH_HOST_KINDS
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Severity
from tracewhy.model.schema import GPU_ACTIVITY_KINDS
from tracewhy.readers import read_trace
from tracewhy.reports import at_once
from tracewhy.reports.diagnose import Report, diagnose
from tracewhy.reports.export import ExportOptions, export_report

BERT = "tracelens/h100_bert-small_bs1_seq512.json.gz"
NSYS = "nsys/nsysai_h100_2gpu_1s.sqlite.gz"
MEMORY = "hta/v100_ddp2_rank1_memprofile.json.gz"
#: Evidence ``findings/explain`` adds from the account and its replays, and ``consolidate``'s note
#: of a severity it capped (a finding without a predicted saving claims no medium or high).
_EXPLAINED = ("fix", "measured_step_ns", "on_critical_path", "parts", "saved_alone_ns", "severity_capped",
              "severity_uncapped")


def _files(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


MEMINFO = "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n"


@pytest.mark.parametrize(("files", "want"), [
    ({"meminfo": MEMINFO}, 20_000_000 * 1024),  # no cgroup files: the machine's
    ({"meminfo": MEMINFO, "self": "0::/job\n", "cg/job/memory.max": "4294967296\n",
      "cg/job/memory.current": "1073741824\n"}, 3 << 30),  # v2, a limit below the machine's
    ({"meminfo": MEMINFO, "self": "0::/job\n", "cg/job/memory.max": "max\n", "cg/job/memory.current": "5\n"},
     20_000_000 * 1024),  # v2 without a limit
    ({"meminfo": MEMINFO, "self": "4:memory:/a/b\n0::/\n", "cg/memory/a/b/memory.limit_in_bytes": "2147483648\n",
      "cg/memory/a/b/memory.usage_in_bytes": "1073741824\n"}, 1 << 30),  # v1 (hybrid: no memory.max at /)
    ({"meminfo": MEMINFO, "self": "4:memory:/\n", "cg/memory/memory.limit_in_bytes": "9223372036854771712\n",
      "cg/memory/memory.usage_in_bytes": "7\n"}, 20_000_000 * 1024),  # v1's "no limit"
    ({"meminfo": MEMINFO, "self": "0::/job\n", "cg/job/memory.max": "1000\n", "cg/job/memory.current": "4000\n"},
     0),  # over its limit already
    ({"self": "0::/job\n", "cg/job/memory.max": "4096\n", "cg/job/memory.current": "1024\n"}, 3072),  # no meminfo
    ({"meminfo": "MemTotal: 5 kB\n"}, None),  # neither says
    ({"meminfo": "MemAvailable: lots\n", "self": "0::/job\n", "cg/job/memory.max": "x\n"}, None),  # nonsense
    ({}, None),  # not Linux
])
def test_available_memory_is_the_machines_or_the_cgroups_lower(tmp_path: Path, files: dict[str, str],
                                                               want: int | None) -> None:
    root = _files(tmp_path, files)
    assert available_bytes(root / "meminfo", root / "cg", root / "self") == want


def test_on_this_machine_something_is_read() -> None:
    """Linux, where CI and this project run: MemAvailable at least."""
    available = available_bytes()
    assert available is not None and available > 0


def test_the_account_is_left_out_only_beyond_the_headroom(monkeypatch: pytest.MonkeyPatch) -> None:
    """The diagnosis with the account (the account's need, per graph slice, and the other analyses',
    per slice of the trace) against HEADROOM of the memory available."""
    trace = read_trace(shared_trace(NSYS))
    slices = trace.count(*GRAPH_HOST_KINDS, *GPU_ACTIVITY_KINDS)
    need = FIXED_BYTES + BYTES_PER_SLICE * slices
    whole = need + REST_BYTES_PER_SLICE * trace.slices.height
    assert 10_000 < slices < trace.slices.height  # (an emit_nvtx export: NVTX ranges are no graph slices)
    enough = int(whole / HEADROOM) + 1
    monkeypatch.setattr(account_memory, "available_bytes", lambda: enough)
    assert short_of_memory(trace) is None
    monkeypatch.setattr(account_memory, "available_bytes", lambda: enough - 2)
    short = short_of_memory(trace)
    assert short is not None
    assert (short.slices, short.need_bytes, short.with_account_bytes, short.available_bytes) == (
        slices, need, whole, enough - 2)
    assert short.short_bytes == round(whole / HEADROOM) - (enough - 2)
    monkeypatch.setattr(account_memory, "available_bytes", lambda: None)
    assert short_of_memory(trace) is None  # memory unknown: the account is made


@pytest.fixture
def little_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 MiB available, and a diagnosis that builds the graph or the step model fails."""
    monkeypatch.setattr(account_memory, "available_bytes", lambda: 16 << 20)

    def built(self: Context) -> None:
        raise AssertionError("the graph or the step model was built")
    monkeypatch.setattr(Context, "step_model", built)
    monkeypatch.setattr(Context, "graph", built)


#: Rules that read no account (compared where the full diagnosis makes them).
_ACCOUNT_FREE = ("gpu-low-utilization", "capture-heavy-options", "nsys-sync-api", "few-steady-steps",
                 "no-step-markers", "reader-warnings", "nsys-async-memcpy-pageable", "gpu-saturated",
                 "memory-peak", "memory-fragmentation", "tensor-cores-unused")


def _measured(evidence: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in evidence.items() if k not in _EXPLAINED}


def _codes(r: Report) -> list[str]:
    return [f.code.value for f in r.findings]


@pytest.mark.parametrize("path", [BERT, NSYS, MEMORY])
def test_a_diagnosis_short_of_memory_says_so_and_keeps_the_other_findings(path: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    full = diagnose(read_trace(shared_trace(path)))
    assert full.account is not None and full.replayed is not None
    with monkeypatch.context() as m:
        m.setattr(account_memory, "available_bytes", lambda: 16 << 20)
        m.setattr(Context, "step_model", lambda self: pytest.fail("the step model was built"))
        m.setattr(Context, "graph", lambda self: pytest.fail("the graph was built"))
        short = diagnose(read_trace(shared_trace(path)))
    assert short.account is None and short.replayed is None and short.together is None and short.lead is None
    skipped = [f for f in short.findings if f.code == Code.ACCOUNT_SKIPPED]
    assert len(skipped) == 1 and skipped[0].severity is Severity.TRUST
    f = skipped[0]
    assert f.evidence["available_bytes"] == 16 << 20 and f.evidence["with_account_bytes"] > HEADROOM * (16 << 20)
    assert f.evidence["with_account_bytes"] > f.evidence["need_bytes"] > FIXED_BYTES
    assert "16.0 MiB was available" in f.statement and f"{f.evidence['graph_slices']:,} host and GPU" in f.statement
    shorter = "nsys profile --capture-range=cudaProfilerApi" if path == NSYS else "torch.profiler.schedule("
    assert shorter in f.next_step
    # Every other finding is one the full diagnosis makes too (those that rest on the account are
    # left out), and the rules that read no account say what they said there: the same statement
    # and evidence, less what joining a finding to the account and its replays adds (``explain``).
    others = [c for c in _codes(short) if c != Code.ACCOUNT_SKIPPED.value]
    assert others and set(others) <= set(_codes(full))
    compared = 0
    for code in _ACCOUNT_FREE:
        if code in _codes(full):
            was = next(x for x in full.findings if x.code.value == code)
            now = next(x for x in short.findings if x.code.value == code)
            assert now.statement == was.statement
            assert msgspec.json.encode(_measured(now.evidence)) == msgspec.json.encode(_measured(was.evidence))
            compared += 1
    assert compared >= 3
    assert short.steps.table.equals(full.steps.table) and short.gaps.gaps.equals(full.gaps.gaps)
    if path == MEMORY:  # the memory analysis finds the host contexts itself: the same peaks and ledger
        assert full.memory is not None and short.memory is not None
        assert [f for f in short.findings if f.code.value.startswith("memory")] == \
            [f for f in full.findings if f.code.value.startswith("memory")]


def test_a_large_traces_diagnosis_starts_no_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a large trace the rules run in turn and the graph is built on a thread from the start
    (``Context.start_graph``): short of memory, that thread is not started."""
    built: list[object] = []
    monkeypatch.setattr(at_once, "MAX_SLICES", -1)  # every trace is large
    monkeypatch.setattr(critical_path_graph, "build_graph", lambda trace: built.append(trace))
    monkeypatch.setattr(account_memory, "available_bytes", lambda: 16 << 20)
    r = diagnose(read_trace(shared_trace(NSYS)))
    assert r.findings[0].code == Code.ACCOUNT_SKIPPED and built == []
    monkeypatch.setattr(account_memory, "available_bytes", lambda: 1 << 40)
    r = diagnose(read_trace(shared_trace(NSYS)))  # (the step model builds its graph itself then)
    assert r.account is not None and len(built) == 1  # with memory, the thread starts


def test_report_and_export_leave_out_the_critical_path(little_memory: None) -> None:
    r = export_report(shared_trace(BERT), ExportOptions(annotated=True))
    assert r.overview is not None and r.overview.critical_path is None
    assert r.overview.report.findings[0].code == Code.ACCOUNT_SKIPPED


def test_the_command_line_says_it(little_memory: None) -> None:
    from tracewhy.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["diagnose", str(shared_trace(NSYS)), "--no-cache"])
    assert code == 0, err.getvalue()
    assert "account-skipped" in out.getvalue() and "16.0 MiB" in out.getvalue()
    with redirect_stdout(out := io.StringIO()), redirect_stderr(io.StringIO()):
        assert main(["diagnose", str(shared_trace(NSYS)), "--no-cache", "--json"]) == 0
    doc = msgspec.json.decode(out.getvalue())
    assert doc["account"] == [] and doc["replayed"] is None and doc["findings"][0]["code"] == "account-skipped"
