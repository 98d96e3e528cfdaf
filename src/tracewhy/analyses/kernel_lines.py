"""Compiled kernels in a trace joined to the source lines they come from
(``model/kernel_provenance``): each run of an inductor kernel, its host or GPU time and the
lines it fuses, with each line's share. ``lines`` puts that time on those lines.

Structure decides which kernel a run is. An inductor C++ kernel runs as an unnamed Python frame
``<built-in function kernel>`` (compile_markers.CPU_KERNEL_FRAME) directly under the ``call``
frame of the graph's output-code file (``<cache>/xx/<hash>.py(N): call``); the file names the
graph and the frame's position among the kernel frames of that call names the kernel (``call``
runs its kernels in the order written). A GPU kernel is named in the trace (``triton_...``) and
is matched by name within the graphs that define it, only where one graph does.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses import compile_markers as M
from tracewhy.analyses.host_tree import HostTree
from tracewhy.analyses.source_lines import parse_frame
from tracewhy.model.kernel_provenance import KernelProvenance, ProvenanceCol
from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import Trace


class KernelRunCol:
    """Columns of ``CompiledLines.runs``: one row per (kernel run, source line)."""

    ID: Final = "id"  # the host slice that holds the run: the kernel frame, or a GPU kernel's launch
    HOST: Final = "host_ns"  # this line's share of the run's host time (C++ kernels run on the host)
    GPU: Final = "gpu_ns"  # this line's share of the run's GPU time
    RUN_HOST: Final = "run_host_ns"  # the whole run's host time (what the frame above it gives up)
    RUN_GPU: Final = "run_gpu_ns"
    FILE: Final = ProvenanceCol.FILE
    LINE: Final = ProvenanceCol.LINE
    FUNCTION: Final = ProvenanceCol.FUNCTION
    KERNEL: Final = ProvenanceCol.KERNEL


RUNS_SCHEMA: Final = pl.Schema({
    KernelRunCol.ID: pl.Int64(), KernelRunCol.HOST: pl.Float64(), KernelRunCol.GPU: pl.Float64(),
    KernelRunCol.RUN_HOST: pl.Int64(), KernelRunCol.RUN_GPU: pl.Int64(), KernelRunCol.FILE: pl.String(),
    KernelRunCol.LINE: pl.Int64(), KernelRunCol.FUNCTION: pl.String(), KernelRunCol.KERNEL: pl.String(),
})


@dataclass(frozen=True)
class CompiledLines:
    """``runs`` (RUNS_SCHEMA); ``kernel_runs``: compiled kernel runs seen in the trace (C++
    kernel frames under a known graph's ``call``, GPU kernels of a known name); ``attributed``:
    how many of them got source lines."""

    runs: pl.DataFrame
    kernel_runs: int
    attributed: int


def compiled_lines(trace: Trace, tree: HostTree, provenance: KernelProvenance) -> CompiledLines:
    """Each compiled kernel run in ``trace`` with the source lines ``provenance`` gives it."""
    table = provenance.table
    graphs = set(provenance.graphs) | set(table.get_column(ProvenanceCol.GRAPH).drop_nulls().to_list())
    cpu = _cpu_runs(trace, tree, graphs)
    gpu = _gpu_runs(trace, table)
    runs = pl.concat([cpu, gpu], how="vertical")
    cpu_lines = cpu.drop(ProvenanceCol.KERNEL).join(table.drop_nulls(ProvenanceCol.CALL),
                                                    on=[ProvenanceCol.GRAPH, ProvenanceCol.CALL], how="inner")
    gpu_lines = gpu.join(_unique_by_name(table), on=ProvenanceCol.KERNEL, how="inner", suffix="_p")
    joined = pl.concat([cpu_lines.select(_RUN_COLUMNS), gpu_lines.select(_RUN_COLUMNS)], how="vertical")
    out = joined.select(
        pl.col("_id").alias(KernelRunCol.ID),
        (pl.col("_host") * pl.col(ProvenanceCol.WEIGHT)).alias(KernelRunCol.HOST),
        (pl.col("_gpu") * pl.col(ProvenanceCol.WEIGHT)).alias(KernelRunCol.GPU),
        pl.col("_host").alias(KernelRunCol.RUN_HOST), pl.col("_gpu").alias(KernelRunCol.RUN_GPU),
        ProvenanceCol.FILE, ProvenanceCol.LINE, ProvenanceCol.FUNCTION, ProvenanceCol.KERNEL,
    ).cast(dict(RUNS_SCHEMA))  # type: ignore[arg-type]
    return CompiledLines(runs=out, kernel_runs=runs.height,
                         attributed=out.select(pl.col(KernelRunCol.ID).n_unique()).item())


def compiled_frame_lines(trace: Trace, provenance: KernelProvenance) -> dict[int, str]:
    """Each compiled C++ kernel frame (slice id) with the line that has the largest share of it,
    as "file.py:LINE function (compiled)" (the step account names host parts so)."""
    top = _top_lines(compiled_lines(trace, HostTree.of(trace), provenance).runs).filter(
        pl.col(KernelRunCol.RUN_HOST) > 0)
    return {sid: f"{posixpath.basename(file)}:{line} {function} (compiled)" for sid, file, line, function in
            top.select(KernelRunCol.ID, KernelRunCol.FILE, KernelRunCol.LINE, KernelRunCol.FUNCTION).iter_rows()}


def compiled_kernel_runs(trace: Trace, provenance: KernelProvenance) -> pl.DataFrame:
    """One row per traced kernel run: ``id`` (its host slice: the kernel frame, or a GPU
    kernel's launch), ``name`` ("kernel (file.py:LINE function)", its largest line), and the
    run's ``host_ns`` and ``gpu_ns`` (``ops`` lists compiled kernels so)."""
    top = _top_lines(compiled_lines(trace, HostTree.of(trace), provenance).runs)
    return top.select(
        KernelRunCol.ID,
        pl.format("{} ({}:{} {})", KernelRunCol.KERNEL,
                  pl.col(KernelRunCol.FILE).map_elements(posixpath.basename, return_dtype=pl.String),
                  KernelRunCol.LINE, KernelRunCol.FUNCTION).alias("name"),
        pl.col(KernelRunCol.RUN_HOST).alias("host_ns"), pl.col(KernelRunCol.RUN_GPU).alias("gpu_ns"))


def _top_lines(runs: pl.DataFrame) -> pl.DataFrame:
    """Each run's row of its largest line (ties: the first line)."""
    return runs.sort([KernelRunCol.ID, KernelRunCol.HOST, KernelRunCol.GPU, KernelRunCol.LINE],
                     descending=[False, True, True, False]).unique(KernelRunCol.ID, keep="first", maintain_order=True)


_RUN_COLUMNS: Final = ("_id", "_host", "_gpu", ProvenanceCol.FILE, ProvenanceCol.LINE, ProvenanceCol.FUNCTION,
                       ProvenanceCol.WEIGHT, ProvenanceCol.KERNEL)
_RUNS: Final = {"_id": pl.Int64, "_host": pl.Int64, "_gpu": pl.Int64, ProvenanceCol.GRAPH: pl.String,
                ProvenanceCol.CALL: pl.Int64, ProvenanceCol.KERNEL: pl.String}


def _cpu_runs(trace: Trace, tree: HostTree, graphs: set[str]) -> pl.DataFrame:
    """C++ kernel frames whose parent is the ``call`` frame of a known graph's file, each with
    its position among the kernel frames of that call."""
    names = trace.slices.get_column(Col.NAME)
    kernel = np.flatnonzero(tree.is_python & (names == M.CPU_KERNEL_FRAME).fill_null(False).to_numpy())
    parent = tree.parent[kernel]
    kernel, parent = kernel[parent >= 0], parent[parent >= 0]
    graph_of: dict[int, str] = {}
    for p in np.unique(parent).tolist():
        file, _, function, _ = parse_frame(str(names[p]))
        base = file.rsplit("/", 1)[-1]
        if function == "call" and base in graphs:
            graph_of[p] = base
    keep = np.array([p in graph_of for p in parent.tolist()], dtype=bool)
    kernel, parent = kernel[keep], parent[keep]
    order = np.lexsort((tree.ts[kernel], parent))
    kernel, parent = kernel[order], parent[order]
    first = np.r_[0, np.flatnonzero(np.diff(parent)) + 1] if parent.size else np.zeros(0, dtype=np.int64)
    position = np.arange(parent.size) - np.repeat(first, np.diff(np.r_[first, parent.size]))
    return pl.DataFrame({
        "_id": kernel, "_host": tree.dur[kernel], "_gpu": np.zeros(kernel.size, dtype=np.int64),
        ProvenanceCol.GRAPH: [graph_of[p] for p in parent.tolist()], ProvenanceCol.CALL: position,
        ProvenanceCol.KERNEL: pl.Series([None] * kernel.size, dtype=pl.String),
    }, schema=_RUNS)


def _gpu_runs(trace: Trace, table: pl.DataFrame) -> pl.DataFrame:
    """GPU kernels (with their launch) whose name is a kernel some graph defines."""
    named = table.filter(pl.col(ProvenanceCol.CALL).is_null()).get_column(ProvenanceCol.KERNEL).unique()
    kernels = trace.of_kind(Kind.KERNEL).filter(pl.col(Col.LAUNCH).is_not_null()
                                                & pl.col(Col.NAME).cast(pl.String).is_in(named.implode()))
    return kernels.select(
        pl.col(Col.LAUNCH).alias("_id"), pl.lit(0, pl.Int64).alias("_host"), pl.col(Col.DUR).alias("_gpu"),
        pl.lit(None, pl.String).alias(ProvenanceCol.GRAPH), pl.lit(None, pl.Int64).alias(ProvenanceCol.CALL),
        pl.col(Col.NAME).cast(pl.String).alias(ProvenanceCol.KERNEL),
    ).cast(_RUNS)  # type: ignore[arg-type]


def _unique_by_name(table: pl.DataFrame) -> pl.DataFrame:
    """Lines of the named (GPU) kernels defined in exactly one graph, called once there: a name
    two graphs reuse (kernel names restart at 0 per graph) says nothing about which ran."""
    named = table.filter(pl.col(ProvenanceCol.CALL).is_null())
    calls = named.group_by(ProvenanceCol.KERNEL).agg(
        pl.struct(ProvenanceCol.GRAPH, ProvenanceCol.COMPILE_ID).n_unique().alias("_graphs"))
    unique = calls.filter(pl.col("_graphs") == 1).get_column(ProvenanceCol.KERNEL)
    return named.filter(pl.col(ProvenanceCol.KERNEL).is_in(unique.implode())).unique(
        [ProvenanceCol.KERNEL, ProvenanceCol.FILE, ProvenanceCol.LINE, ProvenanceCol.FUNCTION]).drop(
        ProvenanceCol.GRAPH, ProvenanceCol.CALL)
