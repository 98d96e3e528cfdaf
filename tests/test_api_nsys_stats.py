"""``tracewhy.nsys_stats``: the tables ``nsys stats`` prints, from the Python API, equal to NVIDIA's
own CSVs (the same golden files tests/test_nsys_stats.py reads) and from a Kineto trace too."""

from __future__ import annotations

import polars as pl
import pytest

import tracewhy as tw
from conftest import shared_trace
from nsys_support import FIXTURES, golden, load


@pytest.mark.parametrize("name", FIXTURES[:3])
@pytest.mark.parametrize("report, count_col", [("cuda_gpu_kern_sum", "Instances"), ("cuda_api_sum", "Num Calls")])
def test_equals_nsys_stats_totals(name: str, report: str, count_col: str) -> None:
    rows = golden(name, f"stats_{report}")
    assert rows is not None
    table = tw.nsys_stats(load(name), report).table
    assert table.schema["name"] == pl.String  # plain strings at the API boundary
    assert int(table.get_column("count").sum()) == sum(int(r[count_col]) for r in rows)
    assert int(table.get_column("total_ns").sum()) == sum(int(r["Total Time (ns)"]) for r in rows)


def test_any_format_and_bad_report_names() -> None:
    t = tw.load(shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz"))
    k = tw.nsys_stats(t)
    assert int(k.table.get_column("count").sum()) == t.of_kind("kernel").height
    with pytest.raises(ValueError, match="cuda_gpu_kern_sum"):
        tw.nsys_stats(t, "cuda_gpu_kern")
