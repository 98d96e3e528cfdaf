"""Memory conclusions that fit the evidence, on real CPU captures (scripts/gen_traces/memory_step_traces.py)
and a V100 trace: a leak is growth in every steady step, named by op and line; a buffer allocated
lazily and kept is none; the phase at the peak picks the advice; a small peak gets none. Each
expectation is checked against the raw events or the planted sizes, not against tracewhy's output."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import GENERATED, shared_trace
from tracewhy.analyses.memory import analyze_memory
from tracewhy.cli import main
from tracewhy.findings.memory import memory_findings
from tracewhy.readers import read_trace

KiB, MiB = 1 << 10, 1 << 20
GROWTH = GENERATED / "cpu_memory_growth.pt.trace.json.gz"
FSDP = GENERATED / "cpu_fsdp2_memory_rank0.pt.trace.json.gz"
OPTIMIZER_PEAK = GENERATED / "cpu_optimizer_peak_memory.pt.trace.json.gz"
ADAM = GENERATED / "cpu_adam_memory.pt.trace.json.gz"
#: What make_growth keeps each step: a 48 x 512 float32 clone and a 16 x 512 float32 row block.
PLANTED_CLONE, PLANTED_CAT = 48 * 512 * 4, 16 * 512 * 4


def _events(path: Path) -> list[dict[str, Any]]:
    return [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if isinstance(e, dict)]


def _raw_ends_per_step(path: Path) -> list[int]:
    """Total Allocated after the last [memory] event inside each ProfilerStep#, from the raw JSON."""
    events = _events(path)
    steps = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                   if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))
    memory = sorted((float(e["ts"]), int(e["args"]["Total Allocated"])) for e in events if e.get("name") == "[memory]")
    return [[total for ts, total in memory if lo <= ts < hi][-1] for lo, hi in steps]


def _diagnose_findings(path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    assert main(["diagnose", "--json", str(path)]) == 0
    return list(json.loads(capsys.readouterr().out)["findings"])


def test_steady_growth_is_a_leak_named_by_op_and_line_in_diagnose(capsys: pytest.CaptureFixture[str]) -> None:
    """Every step ends 128 KiB above the one before (the raw events say so); at 0.2% of the peak a
    step the share rule stayed silent in diagnose. Now it names both planted sites, with the bytes
    each keeps a step, and the fix for each."""
    ends = _raw_ends_per_step(GROWTH)
    assert all(b - a == PLANTED_CLONE + PLANTED_CAT for a, b in itertools.pairwise(ends))
    found = [f for f in _diagnose_findings(GROWTH, capsys) if f["code"] == "memory-growth"]
    assert len(found) == 1
    leak = found[0]
    assert leak["severity"] == "medium"  # 128 KiB a step is under 0.5% of the ~55 MiB peak
    sites = {(s["op"], s["frame"]): s["kept_bytes_per_step"] for s in leak["evidence"]["sites"]}
    assert sites == {("aten::clone", "memory_step_traces.py:111 keep_history"): PLANTED_CLONE,
                     ("aten::cat", "memory_step_traces.py:115 grow_buffer"): PLANTED_CAT}
    assert "keep_history" in leak["statement"] and "grow_buffer" in leak["statement"]
    assert "preallocate" in leak["next_step"] and "in place" in leak["next_step"]
    assert leak["evidence"]["growth_bytes_per_step"] == PLANTED_CLONE + PLANTED_CAT


def test_lazily_allocated_buffers_kept_are_not_a_leak() -> None:
    """FSDP2 with gradient accumulation: allocated at a step's end goes up and down with the
    micro-batches (the raw events), and ends above where it began, so a fitted slope is positive
    and called it a high leak. It does not rise in every step: no memory-growth."""
    ends = _raw_ends_per_step(FSDP)
    steady = ends[1:]
    assert steady[-1] > steady[0]  # what the slope saw
    assert any(b < a for a, b in itertools.pairwise(steady))  # what the rule sees
    r = analyze_memory(read_trace(FSDP))
    assert "memory-growth" not in {f.code for f in memory_findings(r)}
    (cpu,) = r.devices
    assert not cpu.growth.rises_every_step and cpu.growth.sites.height == 0


def _inside(events: list[dict[str, Any]], name_start: str, ts: float) -> bool:
    return any(e.get("ph") == "X" and str(e.get("name", "")).startswith(name_start)
               and float(e["ts"]) <= ts <= float(e["ts"]) + float(e["dur"]) for e in events)


def test_a_peak_in_the_optimizer_step_gets_optimizer_state_advice() -> None:
    """The raw events' highest Total Allocated falls inside Optimizer.step (foreach Adam's
    temporaries beside 128 MiB of parameters and as much in gradients): the advice is the
    optimizer's (sharding, 8-bit or fused states, freeing gradients), not the largest ledger
    part's (temporaries: torch.compile) nor checkpointing."""
    events = _events(OPTIMIZER_PEAK)
    peak_ts = max((int(e["args"]["Total Allocated"]), float(e["ts"])) for e in events if e.get("name") == "[memory]")[1]
    assert _inside(events, "Optimizer.step#Adam.step", peak_ts)
    r = analyze_memory(read_trace(OPTIMIZER_PEAK))
    (peak,) = [f for f in memory_findings(r) if f.code == "memory-peak"]
    assert "optimizer step" in peak.next_step and "sharding the optimizer state" in peak.next_step
    assert "8-bit" in peak.next_step and "checkpoint" not in peak.next_step
    assert r.devices[0].peak_phase == "optimizer"


@pytest.mark.parametrize("path", [GROWTH, ADAM], ids=["growth-55MiB", "adam-565KiB"])
def test_a_small_cpu_peak_gets_no_advice_to_lower_it(path: Path) -> None:
    """Peaks of a few MiB on CPU (the raw events' Total Allocated) are under 128 MiB, 1% of the
    smallest data-centre GPU: no checkpointing, no fusing, nothing to lower."""
    raw_peak = max(int(e["args"]["Total Allocated"]) for e in _events(path) if e.get("name") == "[memory]")
    assert raw_peak < 128 * MiB
    (peak,) = [f for f in memory_findings(analyze_memory(read_trace(path))) if f.code == "memory-peak"]
    assert "lower it by" not in peak.next_step and "checkpoint" not in peak.next_step
    assert "The peak is small" in peak.next_step


def test_an_activation_peak_in_backward_keeps_checkpointing_advice() -> None:
    """The V100 DDP trace peaks at 6.2 GiB inside backward (a CompiledFunctionBackward engine node
    encloses the peak's event) with activations the largest part the trace explains:
    checkpointing is the advice there."""
    r = analyze_memory(read_trace(shared_trace("hta/v100_ddp2_rank1_memprofile.json.gz")))
    gpu = next(d for d in r.devices if d.device == "cuda:1")
    assert gpu.peak_phase == "backward" and gpu.peak_allocated_bytes > 6 * (1 << 30)
    (peak,) = [f for f in memory_findings(r) if f.code == "memory-peak" and f.evidence["device"] == "cuda:1"]
    assert "activation checkpointing" in peak.next_step
