"""``diagnose`` finds each calibrated fix by itself: on the first before trace of every real pair
in tests/data/calibration (made by scripts/gen_traces/calibration.py, one planted cause each), a
finding proposes the very edit bench/calibrate.py measures against the pair (its ``evidence.fix``
is that edit's label), and on the matching after trace (the cause fixed by hand) no finding
proposes it for more than a quarter of what it claimed before. The planted causes are the
captures' own (their MANIFEST), not tracewhy's output."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

import pytest

from conftest import ROOT, diagnose_json

DATA = ROOT / "tests" / "data" / "calibration"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calibrate_named", ROOT / "bench" / "calibrate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


BENCH = _bench()
#: On a CPU-only run setting gradients to None makes the step slower (first-touch page faults):
#: diagnose names it and says so, with nothing to recover (docs/decisions.md).
NOTHING_TO_RECOVER = {"zero_grad_none"}


def _proposing(doc: dict[str, Any], labels: set[str]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["evidence"].get("fix") in labels]


@pytest.mark.parametrize("key", list(BENCH.EDITS))
def test_diagnose_proposes_the_calibrated_fix(key: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, edits = BENCH.EDITS[key]
    labels = {e.label for e in edits}
    before = _proposing(diagnose_json(DATA / f"{key}_before_1.pt.trace.json.gz", capsys), labels)
    assert before, f"no finding proposes {labels}"
    claimed = max(f["recoverable_ns_per_step"] for f in before)
    if key in NOTHING_TO_RECOVER:
        assert claimed == 0 and any(f["predicted_step_ns"] >= f["evidence"]["measured_step_ns"] for f in before)
    else:
        assert claimed > 0
    after = _proposing(diagnose_json(DATA / f"{key}_after_1.pt.trace.json.gz", capsys), labels)
    assert all(f["recoverable_ns_per_step"] <= 0.25 * claimed for f in after), [f["code"] for f in after]
