"""The account's tables group its edges by part and item codes and name the groups afterwards
(``account._tables``): naming every edge first held a string per edge (0.3 GB of part names and
0.7 GB of item texts over the 6.7 M path edges of a large export). Grouped either way the tables
must be the same: here the edges' rows are named first, as before, and grouped by the names."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest
from tests.conftest import shared_trace

from tracewhy.analyses import account
from tracewhy.analyses.account import AccountCol, step_account
from tracewhy.readers import read_trace

#: An nsys export, a DDP rank (communication and copies: bytes and bandwidth in the evidence) and
#: a trace of several steps (per_step rows).
TRACES = ("nsys/nsysai_mfu_2gpu_before.sqlite.gz", "hta/a100_ddp2_rank0_nccl2.17.json.gz",
          "tracelens/mi300x_resnet_actckpt_ddp8_rank0.json.gz")


@pytest.mark.parametrize("relative", TRACES)
def test_tables_grouped_by_codes_are_those_grouped_by_names(relative: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    tables = account._tables

    def capturing(m: Any, windows: pl.DataFrame, rows: pl.DataFrame | None, top: int) -> Any:
        seen.append((m, windows, rows))
        return tables(m, windows, rows, top)

    monkeypatch.setattr(account, "_tables", capturing)
    result = step_account(read_trace(shared_trace(relative)))
    (m, windows, rows), = seen
    assert rows is not None and rows.height and windows.height
    n = windows.height
    part_names = pl.Series([p.name for p in m.rules.parts], dtype=pl.String)
    named = rows.with_columns(part_names.gather(rows.get_column("_part")).alias(AccountCol.PART),
                              pl.Series(m.rules.items, dtype=pl.String).gather(rows.get_column("_item")).alias(
                                  AccountCol.ITEM))

    per_step = named.group_by(AccountCol.STEP, AccountCol.PART).agg(pl.col(AccountCol.NS).sum()).sort(
        AccountCol.STEP, AccountCol.NS, AccountCol.PART, descending=[False, True, False])
    assert result.per_step.select(AccountCol.STEP, AccountCol.PART, AccountCol.NS).rows() == per_step.rows()

    parts = named.group_by(AccountCol.PART).agg(pl.col(AccountCol.NS).sum()).filter(pl.col(AccountCol.NS) > 0).sort(
        AccountCol.NS, AccountCol.PART, descending=[True, False])
    assert result.parts.select(AccountCol.PART, AccountCol.NS_PER_STEP).rows() == [
        (part, round(ns / n)) for part, ns in parts.rows()]

    # Each evidence row is its (part, item) group's time per step, and the top items of each part.
    per_item = named.group_by(AccountCol.PART, AccountCol.ITEM).agg(pl.col(AccountCol.NS).sum())
    expected = {(part, item): round(ns / n) for part, item, ns in per_item.rows()}
    got = result.evidence.select(AccountCol.PART, AccountCol.ITEM, AccountCol.NS_PER_STEP).rows()
    assert got and all(expected[(part, item)] == ns for part, item, ns in got)
    for part in {p for p, _, _ in got}:
        mine = sorted(((ns, item) for (p, item), ns in expected.items() if p == part and ns > 0), reverse=True)
        shown = [ns for p, _, ns in got if p == part]
        assert shown == [ns for ns, _ in mine[:len(shown)]]
