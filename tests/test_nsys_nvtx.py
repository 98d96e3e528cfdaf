"""NVTX GPU projection against nsys's ``nvtx_gpu_proj_trace`` / ``nvtx_gpu_proj_sum`` golden
CSVs and JAX-Toolbox's recipe output, plus inline cases for its semantics and the default step
marker on nsys input."""

from __future__ import annotations

import csv
import io
import lzma
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from conftest import shared_trace
from nsys_support import FIXTURES, ExportBuilder, close, golden, load, raw_db
from tracewhy.analyses import nvtx_work
from tracewhy.analyses.nvtx import gpu_projection, nvtx_step_marker, range_tree
from tracewhy.analyses.steps import steps
from tracewhy.model.schema import Col, NvtxCol
from tracewhy.readers.nsys.reader import read_nsys

WITH_NVTX = [n for n in FIXTURES if n != "nsysai_mock_rtx3080"]


@pytest.mark.parametrize("name", WITH_NVTX)
def test_projection_matches_nvtx_gpu_proj_trace(name: str) -> None:
    """Every projected range, by RangeId (the NVTX row id): name, projected start and
    duration, original start and duration, thread, number of GPU ops, level, projected
    children, parent and range stack. nsys's row without a name (GPU ops launched inside no
    range) is our ``unattributed``."""
    rows = golden(name, "stats_nvtx_gpu_proj_trace")
    assert rows is not None
    p = gpu_projection(load(name))
    named = [r for r in rows if r["Name"]]
    unnamed = [r for r in rows if not r["Name"]]
    ours = {r[NvtxCol.RANGE_ID]: r for r in p.table.iter_rows(named=True)}
    assert len(ours) == p.table.height == len(named)
    for r in named:
        m = ours[int(r["RangeId"])]
        assert (m[Col.NAME], m["style"], m[Col.PID], m[Col.TID]) == (
            r["Name"], r["Style"], int(r["PID"]), int(r["TID"]))
        assert (m["proj_start_ns"], m["proj_dur_ns"]) == (
            int(r["Projected Start (ns)"]), int(r["Projected Duration (ns)"]))
        assert (m[Col.TS], m[Col.DUR]) == (int(r["Orig Start (ns)"]), int(r["Orig Duration (ns)"]))
        assert (m["num_gpu_ops"], m["level"], m["num_child"]) == (
            int(r["NumGPUOps"]), int(r["Lvl"]), int(r["NumChild"]))
        assert m["parent_range_id"] == (int(r["ParentId"]) if r["ParentId"] else None)
        assert m["range_stack"] == r["RangeStack"]
        # Our additions stay inside the span.
        assert 0 < m["gpu_busy_ns"] <= m["gpu_time_ns"] and m["gpu_busy_ns"] <= m["proj_dur_ns"]
    # nsys means to order by projected start, but its ORDER BY names a column alias it does not
    # have ("Projected Start" vs "Projected Start:ts_ns"), which SQLite takes as a constant
    # string: its rows come in RangeId order. Ours are sorted as documented.
    assert [int(r["RangeId"]) for r in named] == sorted(ours)
    starts = p.table.get_column("proj_start_ns")
    assert starts.is_sorted()
    if unnamed:
        (u,) = unnamed
        assert p.unattributed is not None
        assert (p.unattributed.start_ns, p.unattributed.dur_ns, p.unattributed.num_ops) == (
            int(u["Projected Start (ns)"]), int(u["Projected Duration (ns)"]), int(u["NumGPUOps"]))
    else:
        assert p.unattributed is None


@pytest.mark.parametrize("name", WITH_NVTX)
def test_projection_summary_matches_nvtx_gpu_proj_sum(name: str) -> None:
    rows = golden(name, "stats_nvtx_gpu_proj_sum")
    assert rows is not None
    ours = {(r[Col.NAME], r["style"]): r for r in gpu_projection(load(name)).summary.iter_rows(named=True)}
    assert set(ours) == {(r["Range"], r["Style"]) for r in rows}
    for r in rows:
        m = ours[(r["Range"], r["Style"])]
        assert m["total_proj_ns"] == int(r["Total Proj Time (ns)"])
        assert m["total_range_ns"] == int(r["Total Range Time (ns)"])
        assert m["instances"] == int(r["Range Instances"])
        assert m["total_gpu_ops"] == int(r["Total GPU Ops"])
        assert (m["proj_min_ns"], m["proj_max_ns"]) == (int(r["Proj Min (ns)"]), int(r["Proj Max (ns)"]))
        for col, g in (("proj_mean_ns", "Proj Avg (ns)"), ("proj_median_ns", "Proj Med (ns)"),
                       ("proj_stddev_ns", "Proj StdDev (ns)"), ("mean_gpu_ops", "Avg GPU Ops"),
                       ("mean_level", "Avg Range Lvl"), ("mean_num_child", "Avg Num Child")):
            assert close(m[col], r[g]), (r["Range"], col)


JAX = "nsys/jax_toolbox_pax_fsdp4_4proc_proc0"


@pytest.mark.parametrize("name", WITH_NVTX)
def test_projection_is_the_same_in_small_chunks(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The projection aggregates (range, operation) rows chunk by chunk of ranges; chunks of a
    row (every range in a chunk of its own) give the same table as one chunk."""
    trace = load(name)
    whole = gpu_projection(trace)
    monkeypatch.setattr(nvtx_work, "_PROJECT_CHUNK", 1)
    chunked = gpu_projection(trace)
    assert whole.table.height > 1
    assert_frame_equal(chunked.table, whole.table)
    assert chunked.unattributed == whole.unattributed


def test_range_tree_reproduces_jax_toolbox_projection() -> None:
    """JAX-Toolbox ships the *output* of ``nsys recipe nvtx_gpu_proj_trace`` and of
    ``nsys stats -r nvtx_pushpop_trace`` for a 4-process PAX run, but not the export: there
    are no GPU operations or CUDA API calls, so projected starts, durations and op counts
    cannot be recomputed. What the inputs allow is checked: from the push/pop ranges alone our
    range tree gives every projected range's parent, level and stack, and the projected
    children per range give NumChild. The recipe's rows also obey the projection's
    containment rules, which our own projections obey too (checked on a real export)."""
    folder = shared_trace(JAX)
    proj = pl.read_parquet(folder / "nvtx_gpu_proj_trace" / "trace.parquet")
    text = lzma.decompress((folder / "report_nvtx_pushpop_trace.csv.xz").read_bytes()).decode()
    pp = list(csv.DictReader(io.StringIO(text)))
    threads = {k: i for i, k in enumerate(sorted({(r["PID"], r["TID"]) for r in pp}))}
    thread = np.array([threads[(r["PID"], r["TID"])] for r in pp], dtype=np.int64)
    start = np.array([int(r["Start (ns)"]) for r in pp], dtype=np.int64)
    end = np.array([int(r["End (ns)"]) for r in pp], dtype=np.int64)
    rid = np.array([int(r["RangeId"]) for r in pp], dtype=np.int64)
    parent, level = range_tree(thread, start, end, rid)
    ours = {int(rid[i]): (int(rid[parent[i]]) if parent[i] >= 0 else None, int(level[i]), int(start[i]))
            for i in range(rid.size)}
    # The push/pop report's own tree agrees with ours for all 27891 ranges.
    assert all(ours[int(r["RangeId"])][:2] == (int(r["ParentId"]) if r["ParentId"] else None, int(r["Lvl"]))
               for r in pp)
    named = proj.filter(pl.col("RangeId").is_not_null()).with_columns(
        pl.col("RangeId", "ParentId", "Lvl", "Orig Start").cast(pl.Int64))
    assert named.height == 14304
    stack: dict[int, str] = {}
    for row in named.iter_rows(named=True):
        i = row["RangeId"]
        assert ours[i][0] == row["ParentId"] and ours[i][1] == row["Lvl"] and ours[i][2] == row["Orig Start"]
        chain, j = [], i
        while j is not None:
            chain.append(j)
            j = ours[j][0]
        stack[i] = "".join(f":{k}" for k in reversed(chain))
        assert stack[i] == row["RangeStack"]
    children = named.filter(pl.col("ParentId").is_not_null()).group_by("ParentId").len()
    expected_children = dict(children.iter_rows())
    assert all(row["NumChild"] == expected_children.get(row["RangeId"], 0) for row in named.iter_rows(named=True))
    for table, start_col, dur_col, ops_col, id_col, parent_col in (
        (named, "Projected Start", "Projected Duration", "NumGPUOps", "RangeId", "ParentId"),
        (gpu_projection(load("nsysai_h100_2gpu_1s")).table, "proj_start_ns", "proj_dur_ns",
         "num_gpu_ops", NvtxCol.RANGE_ID, "parent_range_id"),
    ):
        spans = {r[id_col]: (r[start_col], r[start_col] + r[dur_col], r[ops_col]) for r in table.iter_rows(named=True)}
        for r in table.iter_rows(named=True):
            p = spans.get(r[parent_col])
            if p is not None:  # a child's GPU work is also its parent's
                s, e, n = spans[r[id_col]]
                assert p[0] <= s and e <= p[1] and n <= p[2]


# --- semantics on tiny exports ------------------------------------------------------------------


def _projection_export(tmp_path: Path) -> Path:
    b = ExportBuilder()
    b.nvtx("step", 100, 1000)
    b.nvtx("forward", 150, 500)
    b.nvtx("other thread", 100, 1000, tid=99)
    b.nvtx("io", 100, 1000, event_type=60, end_tid=98)  # ended elsewhere: not projected
    c1 = b.api("cudaLaunchKernel_v7000", 200, 210)
    b.kernel("a()", 2000, 2100, c1)
    c2 = b.api("cudaLaunchKernel_v7000", 490, 510)  # overruns "forward": only "step" contains it
    b.kernel("b()", 2200, 2250, c2)
    b.kernel("b()", 2300, 2350, c2)  # a graph launch: two ops, one call
    c3 = b.api("cudaMemsetAsync_v3020", 1100, 1110)  # outside every range
    b.memset(2500, 2600, c3)
    return b.write(tmp_path / "proj.sqlite")


def test_projection_semantics(tmp_path: Path) -> None:
    t = read_nsys(_projection_export(tmp_path))
    p = gpu_projection(t)
    rows = p.table.select(Col.NAME, "proj_start_ns", "proj_dur_ns", "num_gpu_ops", "gpu_time_ns",
                          "gpu_busy_ns", "level", "num_child").rows()
    assert rows == [
        # step holds all three kernels: span 2000..2350, 2 launching calls, 200 ns of kernels.
        ("step", 2000, 350, 2, 200, 200, 0, 1),
        ("forward", 2000, 100, 1, 100, 100, 1, 0),
    ]
    assert p.unattributed is not None and (p.unattributed.start_ns, p.unattributed.num_ops) == (2500, 1)


def test_default_step_marker_on_nsys_input(tmp_path: Path) -> None:
    b = ExportBuilder()
    for i in range(3):
        b.nvtx("iteration", 1000 * i, 1000 * i + 900)
        b.nvtx("forward", 1000 * i + 10, 1000 * i + 500)  # nested: not a candidate
        b.kernel("k()", 1000 * i + 600, 1000 * i + 700, b.api("cudaLaunchKernel_v7000", 1000 * i + 20, 1000 * i + 30))
    b.nvtx("setup", 5000, 5100)
    # Host-only bookkeeping that repeats more often than the loop: not a step.
    for i in range(5):
        b.nvtx("logging", 3000 + 100 * i, 3000 + 100 * i + 50)
    t = read_nsys(b.write(tmp_path / "loop.sqlite"))
    chosen = nvtx_step_marker(t)
    assert chosen is not None and (chosen.name, chosen.repeats) == ("iteration", 3)
    r = steps(t)
    assert r.marker == "iteration" and r.table.height == 3
    assert r.note is not None and "'iteration', the one most often with GPU work" in r.note
    assert "'logging' repeats more, 5 times, but launches no GPU work" in r.note
    assert r.table.get_column("kernel_count").to_list() == [1, 1, 1]
    # ProfilerStep#N wins when present; --step overrides both.
    b.nvtx("ProfilerStep#7", 6000, 6500)
    t2 = read_nsys(b.write(tmp_path / "loop2.sqlite"))
    assert nvtx_step_marker(t2) is None and steps(t2).marker == "ProfilerStep"
    from tracewhy.analyses.steps import StepsOptions

    assert steps(t, StepsOptions(marker="setup")).table.height == 1


def test_profiler_step_test_skips_marks_and_reaches_nested_ranges(tmp_path: Path) -> None:
    # The ProfilerStep test reads the names of all ranges, not only top-level ones, and never a
    # mark's (the marker is matched on distinct names before any row becomes a string).
    b = ExportBuilder()
    for i in range(3):
        b.nvtx("iteration", 1000 * i, 1000 * i + 900)
        b.kernel("k()", 1000 * i + 600, 1000 * i + 700, b.api("cudaLaunchKernel_v7000", 1000 * i + 20, 1000 * i + 30))
    b.nvtx("ProfilerStep#3", 4000, None, event_type=34)  # a mark (NvtxMark): not a range
    marked = nvtx_step_marker(read_nsys(b.write(tmp_path / "mark.sqlite")))
    assert marked is not None and (marked.name, marked.repeats) == ("iteration", 3)
    b.nvtx("ProfilerStep#1", 1100, 1200)  # nested in an iteration
    assert nvtx_step_marker(read_nsys(b.write(tmp_path / "nested.sqlite"))) is None


def test_default_step_marker_on_real_exports() -> None:
    # nvFuser's benchmark runs its fusion twice on the main thread.
    xent = steps(load("nvfuser_xent_h200_2025.1"))
    assert xent.marker == "FusionExecutorCache::runFusionWithInputs" and xent.table.height == 2
    # emit_nvtx names every op call uniquely ("aten::mul, op_id = 314339"): nothing repeats on a
    # thread, so there is no default marker and the note says how to choose one.
    h100 = steps(load("nsysai_h100_2gpu_1s"))
    assert h100.table.height == 0 and h100.note is not None and "--step NAME" in h100.note
    assert nvtx_step_marker(load("nsysai_mock_rtx3080")) is None  # no NVTX at all


def test_host_only_loop_is_chosen_only_when_nothing_drives_the_gpu(tmp_path: Path) -> None:
    b = ExportBuilder()
    for i in range(4):
        b.nvtx("poll", 100 * i, 100 * i + 50)
    t = read_nsys(b.write(tmp_path / "host.sqlite"))
    chosen = nvtx_step_marker(t)
    assert chosen is not None and chosen.name == "poll"
    assert "no repeated top-level range has GPU work" in chosen.note


def test_default_step_marker_is_the_range_that_drives_the_gpu() -> None:
    """nvFuser's matmul gtest repeats host-only bookkeeping ranges (15 x
    ``transform_replay.cpp::getMatchedLeafPosWithoutReplayCasP``) around one range that
    launches the kernels; the most repeated range made every step read 0 % GPU. The expected
    marker is found here from the raw tables: the top-level range names with a kernel whose
    launching call lies inside them on the same thread."""
    name = "nvfuser_matmul_h200_2024.6"
    db = raw_db(name)
    launching = {row[0] for row in db.execute(
        """SELECT DISTINCT coalesce(n.text, s.value) FROM NVTX_EVENTS AS n
        LEFT JOIN StringIds AS s ON s.id = n.textId
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r ON r.globalTid = n.globalTid
            AND r.start >= n.start AND r."end" <= n."end"
        JOIN CUPTI_ACTIVITY_KIND_KERNEL AS k ON k.correlationId = r.correlationId
            AND k.globalPid = (r.globalTid & -16777216)
        WHERE n.eventType = 59 AND NOT EXISTS (
            SELECT 1 FROM NVTX_EVENTS AS o WHERE o.globalTid = n.globalTid AND o.eventType = 59
            AND o.rowid != n.rowid AND o.start <= n.start AND o."end" >= n."end")"""
    )}
    assert len(launching) == 1
    t = load(name)
    r = steps(t)
    assert {r.marker} == launching
    assert r.table.height >= 1 and (r.table.get_column("kernel_count") > 0).all()
    assert (r.table.get_column("gpu_busy_ns") > 0).all()
    assert r.note is not None and "the only one with GPU work projected onto it" in r.note
    assert "but launches no GPU work" in r.note


def test_thread_codes_match_pid_and_tid_pairs() -> None:
    """Two rows share a thread code exactly when they share (pid, tid), a null equal to a null,
    within a frame and across the two (the codes come from ranks, not a join)."""
    rng = pl.DataFrame({Col.PID: [1, 1, 2, None, 2, None], Col.TID: [7, 8, 7, 7, None, None]},
                       schema={Col.PID: pl.Int64, Col.TID: pl.Int64})
    calls = pl.DataFrame({Col.PID: [2, None, 1, 3], Col.TID: [None, 7, 8, 7]},
                         schema={Col.PID: pl.Int64, Col.TID: pl.Int64})
    r, c = nvtx_work.thread_codes(rng, calls)
    rows = rng.rows() + calls.rows()
    codes = r.tolist() + c.tolist()
    assert all((codes[i] == codes[j]) == (rows[i] == rows[j]) for i in range(len(rows)) for j in range(len(rows)))


def test_thread_codes_match_equal_threads_null_with_null() -> None:
    from tracewhy.analyses.nvtx_work import thread_codes

    rng = pl.DataFrame({Col.PID: [1, 1, None, 2], Col.TID: [5, None, None, 5]})
    calls = pl.DataFrame({Col.PID: [2, 1, None, 1], Col.TID: [5, 5, None, 7]})
    r, c = thread_codes(rng, calls)
    assert r[0] == c[1] and r[2] == c[2] and r[3] == c[0]  # (1, 5), (null, null), (2, 5)
    assert len({*r.tolist(), c[3]}) == 5  # (1, null), (1, 7) and the others all differ
