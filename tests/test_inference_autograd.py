"""``autograd-in-inference``: an inference loop that records autograd for a backward that never
runs. Checked on the generated pair (``scripts/gen_traces/inference_traces.py``: the same
eval-mode MLP scored every step, once as written, once under ``torch.inference_mode()``),
against the ops that carry autograd's "Sequence number" in the raw JSON; and never on a loop
that trains (its forward records autograd for the backward that follows).

Before: the recorded loop read "Nothing here costs a meaningful share of the step: 93.1% of the
step is essential work (forward 93.1%)", with nothing said of the recording."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

from conftest import GENERATED, checked_report, shared_trace, the_finding
from tracewhy.findings.codes import Code

RECORDED = GENERATED / "cpu_inference_recorded.pt.trace.json.gz"
INFERENCE_MODE = GENERATED / "cpu_inference_mode.pt.trace.json.gz"


def _recorded_per_step(path: Path) -> list[int]:
    """Per ProfilerStep of the raw JSON, the ops that carry a "Sequence number"."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if re.fullmatch(r"ProfilerStep#\d+", e["name"])]
    return [sum(1 for e in events if "Sequence number" in e.get("args", {}) and s["ts"] <= e["ts"] < s["ts"] + s["dur"])
            for s in steps]


def test_an_inference_loop_that_records_autograd_is_told_so() -> None:
    f = the_finding(RECORDED, Code.AUTOGRAD_IN_INFERENCE)
    per_step = statistics.median(_recorded_per_step(RECORDED))
    assert per_step > 0 and round(f.evidence["recorded_ops_per_step"]) == per_step
    assert f.part == "forward" and f.recoverable_ns_per_step == 0
    assert "torch.inference_mode()" in f.next_step


def test_under_inference_mode_nothing_is_recorded_and_nothing_is_said() -> None:
    assert set(_recorded_per_step(INFERENCE_MODE)) == {0}
    assert Code.AUTOGRAD_IN_INFERENCE not in [x.code for x in checked_report(INFERENCE_MODE).findings]


def test_a_training_loop_or_a_single_window_is_not_told() -> None:
    """Training traces record autograd in forward for their backward: never this finding. Nor a
    capture without steps (perfdigest's RTX 4060 sample, one window): it may hold a training
    step's forward without its backward."""
    for path in (GENERATED / "cpu_eager_schedule.pt.trace.json.gz", GENERATED / "cpu_compile.pt.trace.json.gz",
                 shared_trace("kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"),
                 shared_trace("perfdigest/rtx4060laptop_torch_sample.json.gz")):
        assert Code.AUTOGRAD_IN_INFERENCE not in [x.code for x in checked_report(path).findings], path
