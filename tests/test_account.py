"""The step account: traces built inline where every part is known to the microsecond, the
windows found without step markers, the causes planted in the generated CPU traces, and the
copies of nsys-ai's H100 window checked against the export's own memcpy rows."""

from __future__ import annotations

import gzip
import itertools
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from tracewhy.analyses.account import AccountCol, AccountOptions, AccountResult, step_account
from tracewhy.analyses.account_names import PartKind, PartName
from tracewhy.analyses.iterations import WindowSource
from tracewhy.readers import read_trace

US = 1000  # the builders write microseconds
FETCH = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _account(tmp_path: Path, b: KinetoBuilder, **options: Any) -> AccountResult:
    return step_account(read_trace(b.write(tmp_path / "t.json")), AccountOptions(**options))


def _step(r: AccountResult, step: int = 0) -> dict[str, int]:
    """One step's parts, in µs."""
    rows = r.per_step.filter(pl.col(AccountCol.STEP) == step).select(AccountCol.PART, AccountCol.NS).iter_rows()
    return {part: ns // US for part, ns in rows}


def _gpu_step() -> KinetoBuilder:
    """Step 1 (0-1000 µs): aten::mm launches a gemm that runs 40-840, cudaDeviceSynchronize
    (100-850) waits for it, then aten::add (860-990); step 2 starts at 1000."""
    b = KinetoBuilder()
    b.annotation("ProfilerStep#1", 0, 1000).annotation("ProfilerStep#2", 1000, 100)
    b.op("aten::mm", 10, 50).launch("sm80_gemm_kernel", 20, 10, gpu_ts=40, gpu_dur=800)
    b.op("cudaDeviceSynchronize", 100, 750, cat="cuda_runtime")
    b.op("aten::add", 860, 130)
    return b


def test_a_gpu_bound_step_adds_up_to_its_window(tmp_path: Path) -> None:
    # The path: the step's first 10 µs with nothing but the marker open, mm to its launch,
    # launch latency to the kernel's start, the kernel, the sync returning, add, the end.
    r = _account(tmp_path, _gpu_step())
    assert _step(r) == {
        PartName.UNTRACED: 10 + 10 + 10, "host: aten::mm": 10, PartName.LAUNCH: 20, "kernels: gemm": 800,
        "sync: cudaDeviceSynchronize": 10, "host: aten::add": 130,
    }
    parts = {row[AccountCol.PART]: row for row in r.parts.iter_rows(named=True)}
    assert parts["kernels: gemm"][AccountCol.ESSENTIAL] and parts["kernels: gemm"][AccountCol.KIND] == PartKind.KERNELS
    assert not parts["sync: cudaDeviceSynchronize"][AccountCol.ESSENTIAL]
    assert r.windows.get_column(AccountCol.COVERED).to_list() == r.windows.get_column(AccountCol.WINDOW).to_list()


def test_a_scalar_read_names_the_ops_that_lead_up_to_it(tmp_path: Path) -> None:
    # Outside any phase, ops before aten::item on the same thread, with no block in between,
    # are the read's: the work a logging line forces. An op after it is on its own.
    b = KinetoBuilder()
    b.annotation("ProfilerStep#1", 0, 1000).annotation("ProfilerStep#2", 1000, 100)
    b.annotation("forward", 10, 290).op("aten::linear", 20, 270)
    b.op("aten::argmax", 310, 200).op("aten::mean", 520, 100).op("aten::item", 630, 50)
    b.op("aten::_local_scalar_dense", 640, 30)
    b.op("aten::randn", 700, 290)
    # (Between ops only the step marker is open: untraced Python, 10 + 10 + 10 + 10 + 20 + 10.)
    assert _step(_account(tmp_path, b)) == {
        PartName.FORWARD: 290, "host: up to aten::item": 200 + 100 + 50, "host: aten::randn": 290,
        PartName.UNTRACED: 70,
    }


def test_a_cpu_only_step_is_its_phases_and_they_are_essential(tmp_path: Path) -> None:
    # No GPU: the path is the host thread. A DataLoader fetch (with the batch's collate op in
    # it), forward and backward blocks; the model's own ops in the phases are essential.
    b = KinetoBuilder()
    b.annotation("ProfilerStep#1", 0, 1000).annotation("ProfilerStep#2", 1000, 100)
    b.annotation(FETCH, 10, 390).op("aten::stack", 300, 50)
    b.annotation("forward", 400, 200).op("aten::linear", 410, 180)
    b.annotation("backward", 600, 390).op("autograd::engine::evaluate_function: AddmmBackward0", 610, 370)
    r = _account(tmp_path, b)
    assert _step(r) == {PartName.DATA_LOADING: 390, PartName.FORWARD: 200, PartName.BACKWARD: 390,
                        PartName.UNTRACED: 20}
    essential = dict(r.parts.select(AccountCol.PART, AccountCol.ESSENTIAL).iter_rows())
    assert essential == {PartName.DATA_LOADING: False, PartName.FORWARD: True, PartName.BACKWARD: True,
                         PartName.UNTRACED: False}
    assert r.largest_avoidable() is not None and r.largest_avoidable()[AccountCol.PART] == PartName.DATA_LOADING  # type: ignore[index]


def test_a_copy_names_its_direction_and_host_memory(tmp_path: Path) -> None:
    # cudaMemcpyAsync from pageable memory returns after its copy: the path runs through it.
    b = KinetoBuilder()
    b.annotation("ProfilerStep#1", 0, 1000).annotation("ProfilerStep#2", 1000, 100)
    b.op("aten::to", 10, 490).launch("Memcpy HtoD (Pageable -> Device)", 20, 470, gpu_ts=30, gpu_dur=450,
                                     cat="gpu_memcpy", api="cudaMemcpyAsync", bytes=45_000_000)
    r = _account(tmp_path, b)
    assert _step(r) == {PartName.UNTRACED: 10 + 500, "host: aten::to": 10 + 10, PartName.LAUNCH: 10,
                        "copies: HtoD pageable": 450, "sync: cudaMemcpyAsync under aten::to": 10}
    ev = r.evidence.filter(pl.col(AccountCol.PART) == "copies: HtoD pageable").row(0, named=True)
    assert ev[AccountCol.BYTES_PER_STEP] == 45_000_000 // 2  # two steps analysed, one copy
    assert ev[AccountCol.GB_PER_S] == pytest.approx(45_000_000 / (450 * US))


def test_what_the_path_does_not_reach_is_unexplained_and_kept(tmp_path: Path) -> None:
    # A second thread's first call (400 µs in) has nothing recorded before it: the path from
    # the window's end stops there, and the 400 µs before are unexplained, never dropped.
    b = KinetoBuilder()
    b.op("aten::mm", 0, 100, tid=1).launch("sm80_gemm_kernel", 400, 10, gpu_ts=420, gpu_dur=500, tid=2)
    r = _account(tmp_path, b)
    assert r.source == WindowSource.WHOLE_TRACE and r.mean_step_ns == 920 * US
    assert _step(r) == {PartName.UNEXPLAINED: 400, PartName.LAUNCH: 20, "kernels: gemm": 500}
    assert r.named_share == pytest.approx(520 / 920)


# --- windows without step markers -----------------------------------------------------------------


def _without_markers(path: Path, tmp_path: Path) -> Path:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    out = tmp_path / f"{path.name}.no_steps.json"
    out.write_text(json.dumps(doc))
    return out


def test_iterations_from_dataloader_fetches(tmp_path: Path) -> None:
    # cpu_dataloader_slow with its ProfilerStep markers removed: one iteration per fetch,
    # fetch start to fetch start, as the raw events have them.
    path = _without_markers(GENERATED / "cpu_dataloader_slow.pt.trace.json.gz", tmp_path)
    starts = sorted(round(e["ts"] * US) for e in json.loads(path.read_text())["traceEvents"]
                    if e.get("name") == FETCH and e.get("ph") == "X")
    r = step_account(read_trace(path))
    assert r.source == WindowSource.DATALOADER and r.steps_found == len(starts) - 1
    found = dict(zip(r.windows.get_column(AccountCol.WINDOW_START).to_list(),
                     r.windows.get_column(AccountCol.WINDOW).to_list(), strict=True))
    for lo, hi in itertools.pairwise(starts):
        if lo in found:
            assert found[lo] == pytest.approx(hi - lo, abs=2)
    assert r.largest_avoidable()[AccountCol.PART] == PartName.DATA_LOADING  # type: ignore[index]


def test_iterations_from_optimizer_steps() -> None:
    # HTA's GP100 trace has no ProfilerStep: 5 Optimizer.step#SGD.step spans, 4 iterations
    # from one step's end to the next's.
    path = shared_trace("hta/gp100_step_sync_gpu_user_annotation_2023.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    ends = sorted(e["ts"] + e["dur"] for e in events if str(e.get("name", "")).startswith("Optimizer.step#")
                  and e.get("cat") in ("cpu_op", "user_annotation"))  # (not its GPU projection)
    r = step_account(read_trace(path))
    assert r.source == WindowSource.OPTIMIZER and r.steps_found == len(ends) - 1 == 4
    raw = [(b - a) * US for a, b in itertools.pairwise(ends)]
    assert r.windows.get_column(AccountCol.WINDOW).to_list() == pytest.approx(raw, rel=1e-3)


def test_the_whole_trace_when_nothing_repeats() -> None:
    # nsys-ai's H100 window: no steps, no DataLoader, no optimizer. One window, one process.
    r = step_account(read_trace(shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz")))
    assert r.source == WindowSource.WHOLE_TRACE and r.steps_analysed == 1
    assert r.note is not None and "2 processes" in r.note


# --- real traces: the copies of nsys-ai's H100 window --------------------------------------------------


def _raw_memcpy(path: Path, tmp_path: Path) -> pl.DataFrame:
    db = tmp_path / "h100.sqlite"
    with gzip.open(path) as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = con.execute("SELECT copyKind, srcKind, dstKind, bytes, end - start, globalPid / 16777216 % 16777216 "
                       "FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchall()
    con.close()
    return pl.DataFrame(rows, schema=["kind", "src", "dst", "bytes", "dur", "pid"], orient="row")


def test_pinned_htod_copies_lead_the_h100_window(tmp_path: Path) -> None:
    # 97% of the GPU time of this window is pinned HtoD copies (copyKind 1, srcKind 1): they are
    # the largest part, with the bytes and bandwidth nsys recorded for them.
    path = shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz")
    r = step_account(read_trace(path))
    top = r.parts.row(0, named=True)
    assert top[AccountCol.PART] == "copies: HtoD pinned" and top[AccountCol.KIND] == PartKind.COPIES
    assert not top[AccountCol.ESSENTIAL] and top[AccountCol.SHARE] > 0.9
    raw = _raw_memcpy(path, tmp_path)
    pid = r.windows.row(0, named=True)[AccountCol.PID]
    pinned = raw.filter((pl.col("kind") == 1) & (pl.col("src") == 1) & (pl.col("pid") == pid))
    ev = r.evidence.filter(pl.col(AccountCol.PART) == "copies: HtoD pinned").row(0, named=True)
    assert ev[AccountCol.BYTES_PER_STEP] == int(pinned.get_column("bytes").sum())
    assert ev[AccountCol.GB_PER_S] == pytest.approx(pinned.get_column("bytes").sum() / pinned.get_column("dur").sum())
    assert top[AccountCol.NS_PER_STEP] <= int(pinned.get_column("dur").sum())


# --- planted causes ------------------------------------------------------------------------------------


def _planted(name: str) -> AccountResult:
    return step_account(read_trace(GENERATED / name))


def test_a_slow_dataloader_is_the_largest_avoidable_part() -> None:
    r = _planted("cpu_dataloader_slow.pt.trace.json.gz")
    top = r.largest_avoidable()
    assert top is not None and top[AccountCol.PART] == PartName.DATA_LOADING and top[AccountCol.SHARE] > 0.8


def test_item_reads_in_the_loop_are_the_largest_avoidable_part() -> None:
    # loss.item(), a no_grad forward whose argmax goes through .cpu(), and accuracy .item(): on
    # CPU the reads cost little themselves; the work that leads up to them is the logging's.
    top = _planted("cpu_item_sync.pt.trace.json.gz").largest_avoidable()
    assert top is not None and top[AccountCol.PART] == "host: up to aten::item"


def test_a_recompile_is_the_largest_avoidable_part() -> None:
    # forward(x, n) with a new Python int n every step recompiles in every step (the MANIFEST's
    # plan): its compile phases are most of each step. (A recompile that happens once leaves its
    # step out of the account: test_account_one_time.py.)
    r = _planted("cpu_compile_recompile_every.pt.trace.json.gz")
    top = r.largest_avoidable()
    assert top is not None and top[AccountCol.PART] == PartName.COMPILATION
    assert r.one_time == ()
    for step, window in r.windows.select(AccountCol.STEP, AccountCol.WINDOW).iter_rows():
        assert _step(r, step)[PartName.COMPILATION] > 0.5 * window / US


def test_a_sleep_in_the_step_is_its_host_block() -> None:
    # time.sleep(0.005) inside record_function('planted_slowdown') before forward, every step.
    path = GENERATED / "cpu_slow_step_planted.pt.trace.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    sleeps = [e["dur"] * US for e in events if e.get("name") == "planted_slowdown"]
    r = step_account(read_trace(path))
    top = r.largest_avoidable()
    assert top is not None and top[AccountCol.PART] == "host: planted_slowdown"
    assert top[AccountCol.NS_PER_STEP] == pytest.approx(sum(sleeps) / len(sleeps), rel=0.01)


def test_a_sleep_under_python_frames_is_its_user_line() -> None:
    # ddp_gloo_bcast_rank1: with_stack, the straggler sleeps in record_function('straggler_delay')
    # between forward and backward; the innermost user frame open there names it.
    r = _planted("ddp_gloo_bcast_rank1.pt.trace.json.gz")
    top = r.largest_avoidable()
    assert top is not None and top[AccountCol.PART].startswith("host: ddp_traces.py:")
