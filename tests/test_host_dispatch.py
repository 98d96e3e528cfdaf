"""GPU idle with the host busy is either a stretch of CPU work (data preparation, a Python loop)
or the model's own op-by-op dispatch: the host feeds the GPU one op at a time and each op's
Python and dispatch outlast its kernel. The advice differs (move the work off the step, or cut
the cost per op with a CUDA graph or compilation), and the trace tells them apart by structure:
how the host-class gaps fall between the step's launches (findings/idle.py, ``HostSpread``).

TraceLens' H100 BERT-small inference step is the second kind: 51 short host gaps between its 60
kernels; HTA's A100 event-sync example the first: two long gaps. The counts are checked against
``tracewhy gaps --json`` (another view of the same gaps) and the raw JSON's kernels."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from conftest import diagnose_json, finding_of, shared_trace
from tracewhy.cli import main

BERT = "tracelens/h100_bert-small_bs1_seq512.json.gz"
EVENT_SYNC = "hta/a100_cuda_event_sync_small.json.gz"


def _raw_kernels_in_steps(name: str) -> int:
    """Kernels whose launch call (runtime or driver API) starts inside a ProfilerStep (the raw JSON, by
    correlation)."""
    with gzip.open(shared_trace(name), "rt", encoding="utf-8") as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    return sum(1 for k in kernels if any(lo <= launches.get(k["args"].get("correlation"), -1) < hi
                                         for lo, hi in steps))


def test_op_by_op_dispatch_gets_per_op_advice(capsys: pytest.CaptureFixture[str]) -> None:
    f = finding_of(diagnose_json(shared_trace(BERT), capsys), "gpu-idle-host")
    assert f is not None and f["evidence"]["op_by_op_dispatch"]
    assert main(["gaps", str(shared_trace(BERT)), "--class", "host", "--json"]) == 0
    gaps = json.loads(capsys.readouterr().out)["gaps"]
    assert f["evidence"]["host_gaps_per_step"] == len(gaps) == 51  # one steady step
    longest = max(g["dur_ns"] for g in gaps) / sum(g["dur_ns"] for g in gaps)
    assert f["evidence"]["largest_host_gap_share"] == pytest.approx(longest, abs=1e-4)
    assert f["evidence"]["kernels_per_step"] == _raw_kernels_in_steps(BERT) == 60
    assert "op by op" in f["statement"] and "Capture the step in a CUDA graph" in f["next_step"]
    assert "off the critical path" not in f["next_step"]


def test_a_long_stretch_of_host_work_keeps_the_move_it_advice(capsys: pytest.CaptureFixture[str]) -> None:
    f = finding_of(diagnose_json(shared_trace(EVENT_SYNC), capsys), "gpu-idle-host")
    assert f is not None and not f["evidence"]["op_by_op_dispatch"]
    assert f["evidence"]["host_gaps_per_step"] < 8
    assert "off the critical path" in f["next_step"] and "op by op" not in f["statement"]


def test_a_compiled_step_is_not_told_to_compile(capsys: pytest.CaptureFixture[str]) -> None:
    """HTA's V100 DDP rank runs torch.compile'd regions (CompiledFunction in the raw events): its
    op-by-op host gaps get the compiled program's next move, not "torch.compile it"."""
    name = "hta/v100_ddp2_rank1_memprofile.json.gz"
    with gzip.open(shared_trace(name), "rt", encoding="utf-8") as fh:
        assert any(str(e.get("name", "")).startswith("CompiledFunction") for e in json.load(fh)["traceEvents"])
    f = finding_of(diagnose_json(shared_trace(name), capsys), "gpu-idle-host")
    assert f is not None and f["evidence"]["op_by_op_dispatch"]
    assert "already runs torch.compile'd code" in f["next_step"] and "mode='reduce-overhead'" in f["next_step"]
    assert "torch.compile it" not in f["next_step"]
