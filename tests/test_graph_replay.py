"""CUDA/HIP graph replays: the work a graph launch replays is charged to what launched the graph,
so per-op GPU time covers it, and a replay is never counted as idle.

Every figure is checked against sums computed here from the raw JSON: kernels by ``cat``, and a
kernel is a graph launch's when its ``correlation`` is that of a ``*GraphLaunch`` runtime event.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pytest

import tracewhy
from builders import KinetoBuilder
from conftest import shared_trace
from tracewhy.analyses.critical_path import PathCol, critical_path
from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.critical_path_graph import build_graph
from tracewhy.analyses.gaps import GapCol, gaps
from tracewhy.analyses.graph_replay import ChargedTo, GraphLaunchCol, graph_replays
from tracewhy.analyses.ops import OpCol, ops
from tracewhy.analyses.overlap import OverlapCol, overlap
from tracewhy.analyses.steps import steps
from tracewhy.model.schema import Col
from tracewhy.model.trace import Trace

FULLGRAPH = "tracelens/mi300x_vllm_decode_fullgraph_replay.json.gz"
PIECEWISE = "tracelens/mi300x_vllm_prefilldecode_piecewise_graph.json.gz"
SGLANG = "tracelens/mi300x_sglang_qwen3-8b_decode.json.gz"
ALLTOALL = "hta/a100_16rank_rank0_alltoall.json.gz"
GRAPH_TRACES = (FULLGRAPH, PIECEWISE, SGLANG, ALLTOALL)
#: The share of kernel time per-op GPU time must cover on a graph trace.
MIN_COVER = 0.9
_GRAPH_LAUNCH = re.compile(r"(cuda|hip|cu)GraphLaunch")
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass(frozen=True)
class Raw:
    """What the JSON itself says, in ns (Kineto's float microseconds, rounded as the reader does)."""

    kernel_ns: int  # every kernel
    launched_kernel_ns: int  # kernels whose correlation id has a runtime or driver call in the file
    gpu_ns: int  # kernels, copies and memsets
    graph_launches: int
    graph_kernels: list[tuple[int, int]]  # (start, end) of the kernels graph launches replayed
    graph_kernel_ns: int


def _raw(relative: str) -> Raw:
    with gzip.open(shared_trace(relative)) as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    calls = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    launched = {e["args"]["correlation"] for e in calls if "correlation" in e.get("args", {})}
    graph = {e["args"]["correlation"] for e in calls if _GRAPH_LAUNCH.fullmatch(str(e.get("name")))}
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]

    def ns(us: float) -> int:
        return round(us * 1000)

    replayed = [e for e in kernels if e["args"].get("correlation") in graph]
    return Raw(
        kernel_ns=sum(ns(e["dur"]) for e in kernels),
        launched_kernel_ns=sum(ns(e["dur"]) for e in kernels if e["args"].get("correlation") in launched),
        gpu_ns=sum(ns(e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") in _GPU_CATS),
        graph_launches=sum(1 for e in calls if _GRAPH_LAUNCH.fullmatch(str(e.get("name")))),
        graph_kernels=[(ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in replayed],
        graph_kernel_ns=sum(ns(e["dur"]) for e in replayed),
    )


@pytest.fixture(scope="module", params=GRAPH_TRACES)
def case(request: pytest.FixtureRequest) -> tuple[str, Trace, Raw]:
    relative: str = request.param
    return relative, tracewhy.load(shared_trace(relative)), _raw(relative)


def test_per_op_gpu_time_covers_the_kernels_of_a_graph_trace(case: tuple[str, Trace, Raw]) -> None:
    """Per-op GPU self time adds up to at least 90% of the kernel time the raw JSON holds, and to no
    more than its kernels, copies and memsets. On the vLLM and SGLang traces the graph launches sit
    under no CPU op (they replay from Python), so before graph replays were charged to what
    launched them, ops covered 1-4% of it. The HTA trace's 705 kernels launched before the window
    (correlation ids below its first runtime call, 14% of kernel time) have no launch to charge
    them to: its bar is the kernels whose launch the file holds."""
    relative, trace, raw = case
    r = ops(trace)
    self_ns = int(r.table.get_column(OpCol.GPU_SELF).sum())
    bar = raw.launched_kernel_ns if relative == ALLTOALL else raw.kernel_ns
    assert bar > 0 and raw.graph_kernel_ns > 0
    assert self_ns >= MIN_COVER * bar, f"{relative}: ops cover {self_ns / bar:.1%} of kernel time"
    assert self_ns <= raw.gpu_ns
    # Every replayed kernel is charged to some row of the table: none is left outside any op.
    replayed = graph_replays(trace)
    assert replayed.graph_gpu_ns >= raw.graph_kernel_ns
    assert (replayed.gpu_charged[replayed.replayed_rows] >= 0).all()


def test_graph_launches_are_charged_by_structure(case: tuple[str, Trace, Raw]) -> None:
    """A launch under a CPU op (HTA: torch.compile's CompiledFunction and its backward) is charged
    to that op; the vLLM and SGLang launches, under Python frames only, to the innermost user
    annotation around them (vLLM's execute_* range, SGLang's step[DECODE bs=32])."""
    relative, trace, raw = case
    launches = graph_replays(trace).launches
    assert launches.height == raw.graph_launches
    kinds = set(launches.get_column(GraphLaunchCol.CHARGED_KIND).to_list())
    names = set(launches.get_column(GraphLaunchCol.CHARGED_NAME).to_list())
    if relative == ALLTOALL:
        assert kinds == {ChargedTo.CPU_OP} and names == {"CompiledFunction", "CompiledFunctionBackward"}
    else:
        assert kinds == {ChargedTo.ANNOTATION}
        assert all(n.startswith(("execute_", "step[DECODE")) for n in names)
    assert int(launches.get_column(GraphLaunchCol.GPU_NS).sum()) >= raw.graph_kernel_ns


def test_no_graph_replay_is_counted_as_idle(case: tuple[str, Trace, Raw]) -> None:
    """No GPU idle gap overlaps a kernel a graph launch replayed (raw start and end), and the
    overlap table's idle time is at most its window less the union of the raw kernels."""
    _, trace, raw = case
    starts = np.array([s for s, _ in raw.graph_kernels])
    ends = np.array([e for _, e in raw.graph_kernels])
    for row in gaps(trace, steps(trace)).gaps.iter_rows(named=True):
        gap_start, gap_end = row[GapCol.START], row[GapCol.START] + row[GapCol.DUR]
        inside = (starts < gap_end - 1) & (ends > gap_start + 1)  # 1 ns: the reader's rounding
        assert not inside.any(), f"gap at {gap_start} overlaps a replayed kernel"
    devices = overlap(trace).devices
    assert devices.height == 1
    idle, span = devices.row(0, named=True)[OverlapCol.IDLE], devices.row(0, named=True)[OverlapCol.SPAN]
    assert idle <= span - _union_ns(raw.graph_kernels) + 2 * len(raw.graph_kernels)


def test_the_critical_path_waits_on_no_replayed_kernel(case: tuple[str, Trace, Raw]) -> None:
    """No GPU-side wait on the critical path (a launch edge, from a launch call to the work it
    launched, or a stream's gap between two activities) overlaps a kernel a graph launch replayed
    (raw start and end, 1 µs of slack for HIP's overlapping timestamps). Before, a graph kernel of
    vLLM's piecewise trace that overlapped the one before it by 112 ns had only the launch edge,
    and the path took 169 ms, the replay before it included, as launch overhead. (Host time on
    the path while the GPU runs a replay is the host being the bottleneck, not a replay idle.)"""
    _, trace, raw = case
    starts = np.array([s for s, _ in raw.graph_kernels])
    ends = np.array([e for _, e in raw.graph_kernels])
    waits = critical_path(trace).segments.filter(pl.col(PathCol.EDGE).is_in([Edge.LAUNCH.name.lower(),
                                                                             Edge.GAP.name.lower()]))
    assert waits.height
    for row in waits.iter_rows(named=True):
        lo, hi = row[Col.TS], row[Col.TS] + row[Col.DUR]
        inside = np.minimum(ends, hi) - np.maximum(starts, lo)
        assert not (inside > 1000).any(), f"{row[PathCol.EDGE]} at {lo} ({hi - lo} ns) overlaps a replayed kernel"


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def test_diagnose_says_where_replayed_work_goes(case: tuple[str, Trace, Raw]) -> None:
    """The cuda-graph-replay finding counts the replayed work (the raw sums), names its kernel
    families and what it is charged to, and says that none of it is matched to a capture."""
    relative, trace, raw = case
    found = [f for f in tracewhy.diagnose(trace).findings if f.code == "cuda-graph-replay"]
    assert len(found) == 1
    f = found[0]
    assert f.evidence["graph_launches"] == raw.graph_launches
    assert f.evidence["replayed_gpu_ns"] >= raw.graph_kernel_ns
    assert f.evidence["unmatched_to_capture_rows"] == f.evidence["replayed_gpu_rows"] >= len(raw.graph_kernels)
    assert sum(f.evidence["replayed_ns_by_family"].values()) <= f.evidence["replayed_gpu_ns"]
    assert "gemm" in f.evidence["replayed_ns_by_family"]
    assert "charged to what launched its graph" in f.statement and "gemm" in f.statement
    if relative == ALLTOALL:  # ProfilerStep markers: the split per step
        per_step = f.evidence["per_step"]
        assert per_step and all(s["replayed_ns"] > 0 and s["eager_ns"] > 0 for s in per_step)


def test_piecewise_graphs_show_what_ran_eagerly() -> None:
    """vLLM's piecewise graphs leave attention eager: the kernels launched one call each between
    the graphs are the raw kernels whose correlation is no graph launch's, and the finding names
    the op that launched most of them (vllm::unified_attention_with_output)."""
    trace = tracewhy.load(shared_trace(PIECEWISE))
    raw = _raw(PIECEWISE)
    replays = graph_replays(trace)
    assert replays.graph_gpu_ns + replays.eager_gpu_ns == raw.gpu_ns
    f = next(f for f in tracewhy.diagnose(trace).findings if f.code == "cuda-graph-replay")
    assert f.evidence["eager_gpu_ns"] == raw.gpu_ns - f.evidence["replayed_gpu_ns"]
    top = max(f.evidence["eager_ns_by_op"].items(), key=lambda kv: kv[1])
    assert top[0] == "vllm::unified_attention_with_output"
    assert "ran eagerly" in f.statement


def _replayed(b: KinetoBuilder, kernels: list[tuple[str, float, float]]) -> None:
    """More kernels of the graph launch ``b`` made last: the same correlation id, as Kineto
    writes every kernel a cudaGraphLaunch replays."""
    for name, ts, dur in kernels:
        b.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                         "args": {"device": 0, "stream": 7, "correlation": b._corr}})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    """A decode annotation around a graph launch of three kernels (the second overlapping the first
    by 0.1 µs, as HIP writes them), an eager aten::mm, and a second graph launch under nothing."""
    b = KinetoBuilder()
    b.annotation("decode", 0, 100)
    b.launch("gemm_a", 10, 5, gpu_ts=20, gpu_dur=10, api="cudaGraphLaunch")
    _replayed(b, [("gemm_b", 29.9, 10.1), ("norm_c", 40, 10)])
    b.op("aten::mm", 60, 10).launch("sm80_gemm", 62, 4, gpu_ts=70, gpu_dur=10)
    b.launch("gemm_d", 200, 5, gpu_ts=210, gpu_dur=10, api="cudaGraphLaunch")
    return tracewhy.load(b.write(tmp_path_factory.mktemp("graphs") / "tiny.json"))


def test_replayed_work_is_charged_to_the_op_then_the_annotation_then_the_call(tiny: Trace) -> None:
    launches = graph_replays(tiny).launches
    assert launches.select(GraphLaunchCol.CHARGED_KIND, GraphLaunchCol.CHARGED_NAME, GraphLaunchCol.GPU_ROWS,
                           GraphLaunchCol.GPU_NS).rows() == [
        (ChargedTo.ANNOTATION, "decode", 3, 30_100), (ChargedTo.LAUNCH, "cudaGraphLaunch", 1, 10_000)]
    table = ops(tiny).table
    names = table.get_column(OpCol.NAME).to_list()
    self_ns = dict(zip(names, table.get_column(OpCol.GPU_SELF).to_list(), strict=True))
    total_ns = dict(zip(names, table.get_column(OpCol.GPU_TOTAL).to_list(), strict=True))
    assert self_ns == {"decode": 30_100, "aten::mm": 10_000, "cudaGraphLaunch": 10_000}
    assert total_ns["decode"] == 40_100  # its own replay and the aten::mm nested in it
    assert ops(tiny).gpu_unattributed_ns == 0 and ops(tiny).gpu_graph_outside_op_ns == 40_100


def test_only_the_first_replayed_kernel_waits_on_the_launch_call(tiny: Trace) -> None:
    """The launch edge reaches gemm_a only; gemm_b, which starts 0.1 µs before gemm_a ends, waits
    on gemm_a running, so the path from gemm_b back runs through gemm_a, not the launch call."""
    graph = build_graph(tiny)
    names = tiny.slices.get_column(Col.NAME).cast(pl.String).to_numpy()
    launched = graph.dst[graph.kind == Edge.LAUNCH]
    assert sorted(names[graph.node_slice[launched]].tolist()) == ["gemm_a", "gemm_d", "sm80_gemm"]
    gemm_b = int(np.flatnonzero(names[graph.node_slice] == "gemm_b")[0])  # its start node
    bound = graph.bind_edge[gemm_b]
    assert graph.kind[bound] == Edge.GPU and names[graph.node_slice[graph.src[bound]]] == "gemm_a"
