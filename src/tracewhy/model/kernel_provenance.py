"""Where compiled kernels come from, as a table: for each kernel call in an inductor graph's
``call`` function, the user source lines of the FX nodes it fuses, each with its share of the
kernel's work (``readers/torch_logs/provenance`` reads a TORCH_TRACE directory or a
``TORCH_LOGS=output_code`` capture into it; ``analyses/kernel_lines`` joins it to a trace)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl


class ProvenanceCol:
    """Columns of ``KernelProvenance.table``: one row per (kernel call, source line)."""

    GRAPH: Final = "graph"  # the output code's file name (its hash name), as its frames name it
    COMPILE_ID: Final = "compile_id"  # "F/C" of the compile that wrote the graph (null if unknown)
    KERNEL: Final = "kernel"  # the generated kernel's name (cpp_fused_..., triton_poi_fused_...)
    #: 0-based position of the call among the C++ kernel calls of ``call`` (a CPU kernel runs as
    #: an unnamed ``<built-in function kernel>`` frame: its position is what names it); null for
    #: a kernel the trace names itself (Triton).
    CALL: Final = "call"
    FILE: Final = "file"
    LINE: Final = "line"
    FUNCTION: Final = "function"
    CODE: Final = "code"  # the source line's text, as the FX graph's "# File:" comment quotes it
    NODES: Final = "nodes"  # how many of the kernel's FX nodes are on this line
    #: This line's share of the kernel's work: elements its nodes produce (from the FX graph's
    #: shapes) over all the kernel's; per node when a shape is not known. Sums to 1 per call.
    WEIGHT: Final = "weight"


PROVENANCE_SCHEMA: Final = pl.Schema({
    ProvenanceCol.GRAPH: pl.String(), ProvenanceCol.COMPILE_ID: pl.String(), ProvenanceCol.KERNEL: pl.String(),
    ProvenanceCol.CALL: pl.Int64(), ProvenanceCol.FILE: pl.String(), ProvenanceCol.LINE: pl.Int64(),
    ProvenanceCol.FUNCTION: pl.String(), ProvenanceCol.CODE: pl.String(), ProvenanceCol.NODES: pl.Int64(),
    ProvenanceCol.WEIGHT: pl.Float64(),
})


@dataclass(frozen=True)
class KernelProvenance:
    """Kernel calls and their source lines (``table``, PROVENANCE_SCHEMA); ``kernels``: every
    generated kernel call found, with or without lines; ``graphs``: every output code's file
    name, with or without lines (so kernel runs without a line are counted too); ``warnings``:
    what could not be traced (a kernel with no source nodes, a graph with no FX dump)."""

    table: pl.DataFrame
    kernels: int
    warnings: tuple[str, ...]
    graphs: tuple[str, ...] = ()
