"""Exposed communication against the step's critical path: the comm-exposed finding says how much
of the path communication holds, and its statement and its prediction agree (a reader never sees
"13 ms on the critical path" beside "hiding it saves 1.4 ms")."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from builders import KinetoBuilder
from conftest import shared_trace
from tracewhy.analyses.account import AccountCol, step_account, step_model
from tracewhy.analyses.account_names import PartKind
from tracewhy.analyses.what_if import window_edges
from tracewhy.analyses.what_if_comm import comm_on_path
from tracewhy.cli import main
from tracewhy.readers import read_trace

NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float"
DDP = "hta/a100_ddp2_rank0_nccl2.17.json.gz"
ALLTOALL = "hta/a100_16rank_rank0_alltoall.json.gz"


def _comm_finding(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["diagnose", str(path), "--json", "--no-cache"]) == 0
    doc = json.loads(capsys.readouterr().out)
    found: dict[str, Any] = next(f for f in doc["findings"] if f["code"] == "comm-exposed")
    return found


def _saved_ms(statement: str) -> float:
    m = re.search(r"hidden under compute it saves (\d+\.\d\d) ms per step", statement)
    assert m, statement
    return float(m.group(1))


def _host_bound_allreduce(tmp_path: Path) -> Path:
    """Three 1000 µs steps; in each (µs from its start), backward's host work holds the step:

    host:      AccumulateGrad node [10, 990): nccl:all_reduce [20, 40) launches the all-reduce
    stream 20: all-reduce [100, 500)   (nothing waits for it: the optimizer is not traced)
    stream 7:  relu [950, 980)         (launched at 940)

    The all-reduce runs with no compute beside it (400 µs exposed, 40% of the step) but the path
    is the host's: no collective kernel lies on it, and hiding it cannot move the step's end."""
    b = KinetoBuilder()
    for i in range(3):
        o = 1000.0 * i
        b.annotation(f"ProfilerStep#{i}", o, 1000)
        b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", o + 10, 980)
        b.annotation("nccl:all_reduce", o + 20, 20)
        b.launch(NCCL, o + 25, 5, gpu_ts=o + 100, gpu_dur=400, stream=20)
        b.launch("vectorized_elementwise_kernel relu", o + 940, 5, gpu_ts=o + 950, gpu_dur=30, stream=7)
    return b.write(tmp_path / "host_bound.json")


def test_an_allreduce_beside_host_work_is_off_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _host_bound_allreduce(tmp_path)
    m = step_model(read_trace(path))
    c = comm_on_path(m)
    assert c.steps >= 1 and c.kernels_ns == 0
    f = _comm_finding(path, capsys)
    s = f["statement"]
    assert s.startswith("communication runs with no compute beside it for 0.40 ms/step")
    assert "critical path for" not in s  # the exposed time is not said to be on the path
    assert "collective kernels 0.00 ms" in s
    # What the statement says hiding saves is the finding's own prediction.
    assert _saved_ms(s) == pytest.approx((f["evidence"]["measured_step_ns"] - f["predicted_step_ns"]) / 1e6, abs=0.006)
    assert _saved_ms(s) <= c.total_ns / 1e6 + 0.005
    assert "The rest of the exposed time runs beside the work that holds the step: backward" in s


def test_ddp_allreduce_is_exposed_but_the_host_holds_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    # HTA's A100 DDP step: 13 ms of all-reduce per step runs with no compute beside it, while the
    # host runs forward and backward (GPU busy about a quarter of the step). The step's path is
    # the host's: the account's host, idle and launch parts cover nearly all of it, and no
    # collective kernel is on it; hiding the all-reduce takes off at most communication's time
    # on the path (the host's collective calls).
    path = shared_trace(DDP)
    m = step_model(read_trace(path))
    a = step_account(m.trace, model=m)
    hostish = a.parts.filter(pl.col(AccountCol.KIND).is_in(
        [PartKind.HOST, PartKind.IDLE, PartKind.LAUNCH])).get_column(AccountCol.NS_PER_STEP).sum()
    assert hostish > 0.97 * a.mean_step_ns
    c = comm_on_path(m, [w.path for w in window_edges(m)])
    assert c.kernels_ns == 0 and 0 < c.calls_ns < 3_000_000
    f = _comm_finding(path, capsys)
    exposed = f["evidence"]["comm_exposed_ns"]
    assert exposed > 5 * c.total_ns  # the overlap analysis' exposed time is not path time
    saved = f["evidence"]["measured_step_ns"] - f["predicted_step_ns"]
    assert 0 <= saved <= c.total_ns
    assert _saved_ms(f["statement"]) == pytest.approx(saved / 1e6, abs=0.006)
    assert "The rest of the exposed time runs beside the work that holds the step: forward" in f["statement"]


def test_alltoall_on_the_path_saves_what_it_holds_less_what_stays(capsys: pytest.CaptureFixture[str]) -> None:
    # HTA's 16-rank all-to-all: here collective kernels do hold the path (24 ms per step); hiding
    # them saves that less the collectives outside backward, which the edit keeps (their results
    # are read by the work after them): the statement names what stays.
    path = shared_trace(ALLTOALL)
    m = step_model(read_trace(path))
    c = comm_on_path(m, [w.path for w in window_edges(m)])
    assert c.kernels_ns > 10_000_000
    f = _comm_finding(path, capsys)
    saved = f["evidence"]["measured_step_ns"] - f["predicted_step_ns"]
    kept = re.search(r"communication still holds (\d+\.\d\d) ms of the path", f["statement"])
    assert kept is not None
    assert saved == pytest.approx(c.total_ns - float(kept.group(1)) * 1e6, abs=0.5e6)
    assert f["evidence"]["comm_kernels_on_critical_path_ns"] == c.kernels_ns
