"""Small traces with large costs (``hostile_traces``): each command's work on them is bounded
by structure, not timed here (bench/bench_small_inputs.py measures time and peak RSS): what is
built has a size bounded by the input's, and a run that would take minutes is stopped by a
generous subprocess timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hostile_traces as ht
from tracewhy.analyses.critical_path import MAX_PATH_STEPS
from tracewhy.analyses.lines import MAX_STACK_FRAMES, StackCol, lines
from tracewhy.analyses.utilization import MAX_SERIES_ROWS, MIN_BINS, utilization
from tracewhy.readers import read_trace
from tracewhy.reports.critical_path import CriticalPathReportOptions, critical_path_report


def test_a_deep_recursion_makes_stacks_of_bounded_depth(tmp_path: Path) -> None:
    depth = 3 * MAX_STACK_FRAMES
    r = lines(read_trace(ht.write(ht.deep_python_frames(depth), tmp_path / "deep.json")))
    sizes = r.stacks.get_column(StackCol.FRAMES).list.len()
    # One stack per depth up to the bound (the old code: one per frame, 3 x 512 frames deep at
    # the bottom, 1.2 M frame references in all; 10,000 frames deep took 2 GB).
    assert int(sizes.max() or 0) == MAX_STACK_FRAMES
    assert r.stacks.height == MAX_STACK_FRAMES and int(sizes.sum()) <= MAX_STACK_FRAMES * (MAX_STACK_FRAMES + 1) // 2
    # No time is lost: the self time below the bound goes to the deepest stack kept.
    assert int(r.stacks.get_column(StackCol.HOST).sum()) == int(r.table.get_column("host_self_ns").sum())
    deepest = r.stacks.filter(sizes == MAX_STACK_FRAMES).get_column(StackCol.HOST)[0]
    assert deepest > 100 * r.stacks.filter(sizes == 10).get_column(StackCol.HOST)[0]


def test_critical_path_analyses_a_bounded_number_of_steps(tmp_path: Path) -> None:
    # 20,000 one-kernel steps (15 MB) ran past 90 s: every step was walked and replayed.
    assert CriticalPathReportOptions().max_steps == MAX_PATH_STEPS
    trace = ht.write(ht.one_kernel_steps(300), tmp_path / "steps.json")
    r = critical_path_report(trace, CriticalPathReportOptions(max_steps=50))
    assert r.steps_total == 300 and r.steps.height == 50
    assert r.steps.get_column("steady").all()  # steady ones first: the warm-up step is left out
    assert r.note is not None and "the path of 50 of the 300 steps" in r.note


def test_nesting_queries_take_log_depth_rounds_not_depth_squared() -> None:
    # A chain 300,000 deep, every row marked: the old walks (every row through its parents, or
    # one whole-array step per marked level) did ~4.5e10 element steps, minutes; pointer
    # jumping takes 19 rounds, well under a second, so a generous timeout tells them apart.
    code = """
import numpy as np
from tracewhy.analyses.account_host import _outermost
from tracewhy.analyses.host_tree import HostTree
from tracewhy.analyses.syncs import _under
n = 300_000
parent = np.arange(-1, n - 1, dtype=np.int64)
depth = np.arange(n, dtype=np.int64)
mark = np.ones(n, dtype=bool)
z = np.zeros(n, dtype=np.int64)
tree = HostTree(parent=parent, depth=depth, ts=z, dur=z, is_python=~mark, is_op=mark, is_sync=~mark, gpu_self=z)
assert _under(parent, mark).sum() == n - 1
assert (_outermost(tree, mark) == 0).all()
assert (tree.nearest(mark, strict=True) == parent).all()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}, check=True)
    assert done.stdout.strip() == "ok"


@pytest.mark.slow
def test_diagnose_of_1e5_nested_ops_ends(tmp_path: Path) -> None:
    trace = ht.write(ht.deep_cpu_ops(100_000), tmp_path / "ops.json")
    done = subprocess.run([sys.executable, "-m", "tracewhy", "diagnose", str(trace), "--no-cache"],
                          capture_output=True, text=True, timeout=180,
                          env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr


def test_the_utilization_series_is_bounded_however_many_devices(tmp_path: Path) -> None:
    # 2,000 devices made 400,000 rows of series and a 52 MB HTML report: each device now gets
    # fewer bins, and every device keeps its row and its busy time.
    r = utilization(read_trace(ht.write(ht.many_devices(300), tmp_path / "devices.json")))
    assert r.devices.height == 300
    assert 0 < r.series.height <= MAX_SERIES_ROWS
    assert r.series.get_column("device").n_unique() == 300
    assert r.series.group_by("device").len().get_column("len").min() >= MIN_BINS
