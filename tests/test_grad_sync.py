"""``reduce-every-microbatch``: a step that accumulates gradients over micro-batches and
all-reduces them after every backward pass. Checked on the calibration pair made for it
(``scripts/gen_traces/calibration.py``, ``grad_accumulation``: DDP over two gloo ranks, four
micro-batches per optimizer step; after: ``no_sync()`` on the first three), against the
collective calls and forward blocks counted here in the raw JSON and the micro-batch count
read from the generating script; and not on a DDP run with one backward per step.

Before: the run's communication was an ``unexplained-part`` whose advice said to all-reduce
less often "(gradient accumulation, DDP's no_sync())" to a loop that already accumulates."""

from __future__ import annotations

import ast
import gzip
import json
import re
import statistics
from pathlib import Path

from conftest import GENERATED, ROOT, checked_report, the_finding
from tracewhy.findings.codes import Code

SCRIPT = ROOT / "scripts" / "gen_traces" / "calibration.py"
DATA = ROOT / "tests" / "data" / "calibration"
BEFORE = DATA / "grad_accumulation_before_1.pt.trace.json.gz"
AFTER = DATA / "grad_accumulation_after_1.pt.trace.json.gz"


def _micro_batches() -> int:
    """ACCUM_MICRO in the generating script (``ACCUM_MICRO, ACCUM_BATCH = 4, 8``)."""
    for node in ast.parse(SCRIPT.read_text(encoding="utf-8")).body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)
                and isinstance(node.value, ast.Tuple)):
            for target, value in zip(node.targets[0].elts, node.value.elts, strict=True):
                if isinstance(target, ast.Name) and target.id == "ACCUM_MICRO" and isinstance(value, ast.Constant):
                    return int(value.value)
    raise AssertionError("no ACCUM_MICRO in the script")


def _per_step(path: Path, name: str) -> list[int]:
    """Per ProfilerStep of the raw JSON, the calls of ``name`` that start in it (any thread)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if re.fullmatch(r"ProfilerStep#\d+", e["name"])]
    return [sum(1 for e in events if e["name"] == name and s["ts"] <= e["ts"] < s["ts"] + s["dur"]) for s in steps]


def test_a_step_that_reduces_after_every_micro_batch_is_named_and_priced() -> None:
    micro = _micro_batches()
    f = the_finding(BEFORE, Code.REDUCE_EVERY_MICROBATCH)
    ev = f.evidence
    forwards = _per_step(BEFORE, "DistributedDataParallel.forward")
    calls = _per_step(BEFORE, "c10d::allreduce_")
    assert statistics.median(forwards) == micro == ev["backward_passes_per_step"] == ev["reducing_passes_per_step"]
    assert ev["collective_calls_per_step"] == statistics.median(calls)
    assert ev["wrapper"] == "DDP" and "no_sync()" in f.next_step
    assert f.part == "communication: all_reduce"
    assert ev["saved_ns"] > 0 and ev["predicted_step_ns"] < ev["measured_step_ns"]
    assert f.predicted_step_ns == ev["predicted_step_ns"]


def test_no_sync_on_the_earlier_micro_batches_ends_it() -> None:
    """The after capture: the same four forwards, all-reduces from the last backward only."""
    micro = _micro_batches()
    assert statistics.median(_per_step(AFTER, "DistributedDataParallel.forward")) == micro
    before_calls = statistics.median(_per_step(BEFORE, "c10d::allreduce_"))
    assert statistics.median(_per_step(AFTER, "c10d::allreduce_")) * micro == before_calls
    assert Code.REDUCE_EVERY_MICROBATCH not in [x.code for x in checked_report(AFTER).findings]


def test_one_backward_per_step_is_no_accumulation() -> None:
    """ddp_gloo_rank0: DDP, one forward and one backward per step: its all-reduce is needed."""
    path = GENERATED / "ddp_gloo_rank0.pt.trace.json.gz"
    assert set(_per_step(path, "DistributedDataParallel.forward")) <= {0, 1}
    assert Code.REDUCE_EVERY_MICROBATCH not in [x.code for x in checked_report(path).findings]


def test_fsdp2_is_told_its_switch_and_its_gathers_are_not_reductions() -> None:
    """FSDP2 re-gathers the parameters in every backward (all-gathers it needs either way): only
    the reduce-scatters count. Without set_requires_gradient_sync(False) every backward
    reduce-scatters (raw JSON: the reduce-scatter calls per step are the micro-batches times one
    pass's); with it, only the last does, and the rule is quiet."""
    sync = GENERATED / "cpu_fsdp2_accumulate_sync_rank0.pt.trace.json.gz"
    fixed = GENERATED / "cpu_fsdp2_accumulate_fixed_rank0.pt.trace.json.gz"
    f = the_finding(sync, Code.REDUCE_EVERY_MICROBATCH)
    assert f.evidence["wrapper"] == "FSDP2" and "set_requires_gradient_sync(False)" in f.next_step
    assert f.evidence["collectives"] == ["c10d::_reduce_scatter_base_"]
    scatters = statistics.median(_per_step(sync, "c10d::_reduce_scatter_base_"))
    assert f.evidence["collective_calls_per_step"] == scatters
    assert statistics.median(_per_step(fixed, "c10d::_reduce_scatter_base_")) * f.evidence["backward_passes_per_step"] \
        == scatters
    assert statistics.median(_per_step(fixed, "c10d::_allgather_base_")) > 0  # gathers in every pass
    assert f.part == "communication: reduce_scatter"
    assert Code.REDUCE_EVERY_MICROBATCH not in [x.code for x in checked_report(fixed).findings]
