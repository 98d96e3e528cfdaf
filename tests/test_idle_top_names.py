"""The idle-time findings name the three names (ops, Python frames, annotations) with the most
idle time of a class (``findings/idle._top_gaps``). Equal sums are common where steps repeat:
an inflated capture's copies of one step gave the third annotation ("ProfilerStep#13", "#18",
"#78") by polars' group order, which changes from run to run. Ties are broken by name, as
they are for the places whose syncs blocked longest (``_sync_sites``)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracewhy.analyses.gaps import GapClass, GapCol, class_col
from tracewhy.findings.idle import _top_gaps


@dataclass
class _Gaps:
    gaps: pl.DataFrame


@dataclass
class _Context:
    table: pl.DataFrame

    def gaps(self) -> _Gaps:
        return _Gaps(self.table)


def test_equal_sums_are_named_in_name_order() -> None:
    names = [f"ProfilerStep#{i}" for i in range(60)]
    table = pl.DataFrame({
        GapCol.GAP_CLASS: [GapClass.HOST.value] * (len(names) + 2),
        "host_annotation": ["Optimizer.step", None, *names],
        class_col(GapClass.HOST): [500, 900, *([100] * len(names))],
    })
    expected = ["Optimizer.step", *sorted(names)[:2]]
    for _ in range(5):  # (polars' group order is a hash order: one lucky run proves little)
        assert _top_gaps(_Context(table), GapClass.HOST, "host_annotation") == expected  # type: ignore[arg-type]


def test_sync_sites_with_equal_blocked_time_are_named_in_name_order() -> None:
    from tracewhy.findings.idle import _sync_sites

    ops = [f"aten::item_{i}" for i in range(60)]
    calls = pl.DataFrame({"python": [None] * 62, "op": ["aten::nonzero", None, *ops],
                          "annotation": [None] * 62, "blocked_ns": [900, 900, *([100] * len(ops))]})
    expected = ["aten::nonzero (1x)", "outside any op (1x)", f"{sorted(ops)[0]} (1x)"]
    for _ in range(5):
        assert _sync_sites(calls) == expected
