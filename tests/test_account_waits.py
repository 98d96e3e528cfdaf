"""Untraced host time that waits on a collective another thread runs (``account_waits``): a gloo
all-reduce recorded on its worker thread while the caller waits untraced. Built traces where the
cover is known to the microsecond, and the calibration's real gloo pair checked against the
gloo ranges' own time read straight from its slices."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from builders import KinetoBuilder
from conftest import ROOT
from tracewhy.analyses.account import AccountCol, AccountResult, step_account
from tracewhy.analyses.account_names import PartName
from tracewhy.model.schema import Col
from tracewhy.readers import read_trace

US = 1000  # the builders write microseconds
GLOO_PAIR = ROOT / "tests" / "data" / "calibration" / "grad_allreduce_before_1.pt.trace.json.gz"


def _step(tmp_path: Path, gloo: tuple[float, float] | None, tid: int = 2, gpu: bool = False) -> dict[str, int]:
    """Step 0-1000 µs on thread 1: backward's op (10-100), c10d::allreduce_ (100-120), nothing
    recorded until aten::div_ (600-610), the optimizer's op (620-990); ``gloo``: a
    gloo:all_reduce range (start, length) on thread ``tid``; ``gpu``: the optimizer's op launches
    a kernel."""
    b = KinetoBuilder()
    b.annotation("ProfilerStep#1", 0, 1000).annotation("ProfilerStep#2", 1000, 100)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 10, 90)
    b.op("c10d::allreduce_", 100, 20).op("aten::div_", 600, 10).op("aten::add_", 620, 370)
    if gpu:
        b.launch("elementwise_kernel", 630, 10, gpu_ts=650, gpu_dur=20)
    if gloo is not None:
        b.annotation("gloo:all_reduce", gloo[0], gloo[1], tid=tid)
    r: AccountResult = step_account(read_trace(b.write(tmp_path / "t.json")))
    rows = r.per_step.filter(pl.col(AccountCol.STEP) == 0).select(AccountCol.PART, AccountCol.NS).iter_rows()
    return {part: ns // US for part, ns in rows}


def test_the_wait_on_a_collective_of_another_thread_is_the_collectives(tmp_path: Path) -> None:
    # gloo's thread runs the all-reduce 125-590, over the caller's untraced 120-600 (465 of its
    # 480 µs): that stretch is the collective's, beside the call's own 20 µs.
    parts = _step(tmp_path, (125, 465))
    assert parts["communication: all_reduce"] == 20 + 480
    assert parts.get(PartName.UNTRACED, 0) == 10 + 10 + 10  # before backward, around div_: not covered


def test_without_such_a_range_the_wait_stays_untraced(tmp_path: Path) -> None:
    assert _step(tmp_path, None)[PartName.UNTRACED] == 10 + 480 + 10 + 10
    # A range that covers under half the stretch (200 of 480 µs) does not take it.
    assert _step(tmp_path, (130, 200))[PartName.UNTRACED] == 10 + 480 + 10 + 10
    # Nor does a range on the waiting thread itself: what runs there is recorded as itself.
    assert "communication: all_reduce" in _step(tmp_path, (125, 465), tid=1)
    # Beside a GPU a collective's range is a thread issuing NCCL kernels, which nothing waits on.
    assert _step(tmp_path, (125, 465), gpu=True)[PartName.UNTRACED] >= 480


def test_the_gloo_pair_waits_on_gloos_threads() -> None:
    # The real pair: each gradient all-reduced by hand after backward, the caller waiting while
    # gloo's two worker threads run gloo:all_reduce. Independently of the account, the ranges'
    # time per step on the clock (their union within each step), read from the slices.
    trace = read_trace(GLOO_PAIR)
    r = step_account(trace)
    s = trace.slices.with_columns(pl.col(Col.NAME).cast(pl.String))
    steps = s.filter(pl.col(Col.NAME).str.starts_with("ProfilerStep#")).sort(Col.TS)
    ranges = s.filter(pl.col(Col.NAME) == "gloo:all_reduce").sort(Col.TS)
    per_step = []
    for ts, dur in steps.select(Col.TS, Col.DUR).iter_rows():
        inside = ranges.filter((pl.col(Col.TS) >= ts) & (pl.col(Col.TS) < ts + dur))
        covered, reach = 0, 0
        for start, length in inside.select(Col.TS, Col.DUR).iter_rows():
            covered += max(0, start + length - max(start, reach))
            reach = max(reach, start + length)
        per_step.append(covered)
    parts = {row[AccountCol.PART]: row[AccountCol.NS_PER_STEP] for row in r.parts.iter_rows(named=True)}
    gloo_ns = sorted(per_step)[len(per_step) // 2]
    assert parts["communication: all_reduce"] >= 0.8 * gloo_ns  # 29.5 ms against gloo's 27 ms
    assert parts.get(PartName.UNTRACED, 0) < 0.05 * r.mean_step_ns  # it was 49.5% of the step
