"""emit_nvtx op ranges ("aten::to, seq = N, op_id = M": one name per call) are grouped by the
op's name the same way by every command: blocks, diff, collectives, and
`steps --step NAME` finds them. Checked on the nsys-ai MFU capture, which was taken with
torch.autograd.profiler.emit_nvtx."""

from __future__ import annotations

import re

import polars as pl

import tracewhy
from conftest import shared_trace
from tracewhy.analyses.api_names import op_range_name
from tracewhy.analyses.diff import diff
from tracewhy.analyses.steps import StepsOptions, steps

TRACE = "nsys/nsysai_mfu_2gpu_before.sqlite.gz"


def test_op_range_name() -> None:
    assert op_range_name("aten::to, op_id = 999599") == "aten::to"
    assert op_range_name("FlashAttnFunc, seq = 45368, op_id = 990812") == "FlashAttnFunc"
    assert op_range_name("train_step") == "train_step"
    assert op_range_name("loss, seq = x") == "loss, seq = x"


def test_steps_and_diff_group_op_ranges() -> None:
    trace = tracewhy.load(shared_trace(TRACE))
    names = trace.slices.filter(pl.col("kind") == "annotation").get_column("name").cast(pl.String)
    flash = [n for n in names.to_list() if re.match(r"^FlashAttnFunc, seq = \d+, op_id = \d+$", n)]
    assert flash
    r = steps(trace, StepsOptions(marker="FlashAttnFunc"))
    assert r.table.height > 0 and all(op_range_name(n) == "FlashAttnFunc" for n in r.table["name"].to_list())
    d = diff(trace, trace)
    listed = d.annotations.get_column("name").to_list()
    assert not any(", op_id = " in n for n in listed)
    to = d.annotations.filter(pl.col("name") == "aten::to").row(0, named=True)
    raw_to = sum(1 for n in names.to_list() if op_range_name(n) == "aten::to")
    assert to["a_calls_per_step"] == raw_to
