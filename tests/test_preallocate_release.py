"""A buffer allocated once instead of a tensor grown by ``torch.cat``: the untraced time where
the grown tensor is released leaves with the growth (``what_if_gaps.released_after``), checked
on a real decoding capture against its own raw events."""

from __future__ import annotations

import gzip
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from tracewhy.analyses.account import StepModel, step_model
from tracewhy.analyses.what_if import window_edges
from tracewhy.analyses.what_if_gaps import released_after
from tracewhy.readers import read_trace

GROWN = Path(__file__).parent / "data" / "calibration" / "cat_growth_before_2.pt.trace.json.gz"


@pytest.fixture(scope="module")
def model() -> StepModel:
    return step_model(read_trace(GROWN))


def _release_excess_ns(path: Path) -> dict[int, float]:
    """Per ProfilerStep (its start, ns): the untraced time after each aten::cat up to the next
    outermost op, and after the step's last op up to its end (the step's last ops are the
    decoding loop's own), each beyond the median gap between two neighbouring ops that are not
    cats."""
    with gzip.open(path) as f:
        events: list[dict[str, Any]] = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    out = {}
    for step in (e for e in events if e["name"].startswith("ProfilerStep#")):
        t0, t1 = step["ts"], step["ts"] + step["dur"]
        outer: list[dict[str, Any]] = []
        inside = (e for e in events if e is not step and t0 <= e["ts"] < t1)
        for e in sorted(inside, key=lambda e: (e["ts"], -e["dur"])):
            if not outer or e["ts"] >= outer[-1]["ts"] + outer[-1]["dur"]:
                outer.append(e)
        gaps = [b["ts"] - a["ts"] - a["dur"] for a, b in itertools.pairwise(outer)]
        cat = [e["name"] == "aten::cat" for e in outer]
        typical = statistics.median(g for g, a, b in zip(gaps, cat, cat[1:], strict=False) if not a and not b)
        after_cats = [g for g, a in zip(gaps, cat, strict=False) if a]
        assert len(after_cats) == 64 and outer[-1]["name"] == "aten::select"
        tail = t1 - outer[-1]["ts"] - outer[-1]["dur"]
        out[round(t0 * 1000)] = 1000 * sum(max(0.0, g - typical) for g in [*after_cats, tail])
    return out


def test_the_releases_of_the_grown_tensor_leave(model: StepModel) -> None:
    expected = _release_excess_ns(GROWN)
    rules, g = model.rules, model.graph
    for w in window_edges(model, max_steps=len(model.paths)):
        outer = rules.ctx.outer_op[w.attr[w.host()]]
        calls = sorted({int(o) for o in outer[outer >= 0].tolist() if rules.ctx.name(int(o)) == "aten::cat"})
        edit = released_after(w, calls)
        dur = (g.node_ts[g.dst[edit.scaled]] - g.node_ts[g.src[edit.scaled]]).astype(float)
        lost = float((dur * (1.0 - edit.factor)).sum())
        assert lost > 1_500_000  # the step's end alone waits about 2 ms in this capture
        assert abs(lost - expected[w.path.window_start]) < 2_000
