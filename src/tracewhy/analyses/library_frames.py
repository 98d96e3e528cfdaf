"""Where a user line's host time goes inside library code. The step account names host work by
the innermost user frame open on the thread ("host: train.py:52 step"), since that is the line a
user can change; but the time may be spent in the Python of the library functions that line
calls (torch.compile's per-call wrappers, a tokenizer, the profiler's own context managers), and
then what to change is how, or how often, the line calls them. This splits such a part's time on
the analysed steps' critical paths the way the account decides it (the innermost slice open at
each host edge's midpoint) by the innermost frame instead: a library function (a frame with a
source file that is not the user's, ``source_lines.is_library``) or the line's own code.
Traces with Python frames only (``with_stack``).
"""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.account import StepModel
from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.source_lines import parse_frame
from tracewhy.model.schema import Col, Kind


class LibraryTime(msgspec.Struct, frozen=True):
    """A library function on the part's path: ``path``/``line``/``function`` as its frame name
    gives them, and its time there, per analysed step (ns)."""

    path: str
    line: int
    function: str
    ns_per_step: int

    @property
    def label(self) -> str:
        return f"{self.path}:{self.line} {self.function}"


class PartFrames(msgspec.Struct, frozen=True):
    """A host part's time on the analysed paths per step (``part_ns``) and the library functions
    that hold it, largest first (the rest is the user line's own code, or no frame at all)."""

    part_ns: int
    library: list[LibraryTime]

    @property
    def library_ns(self) -> int:
        return sum(f.ns_per_step for f in self.library)

    @property
    def library_share(self) -> float:
        return self.library_ns / self.part_ns if self.part_ns else 0.0


def part_frames(model: StepModel, part: str) -> PartFrames:
    """``part``'s host edges on the analysed steps' critical paths, split by the innermost slice
    open at each edge's midpoint when that slice is a library Python frame."""
    rules, g = model.rules, model.graph
    index = next((i for i, p in enumerate(rules.parts) if p.name == part), None)
    if index is None or not model.paths:
        return PartFrames(0, [])
    names = model.trace.slices.get_column(Col.NAME)
    kinds = model.trace.slices.get_column(Col.KIND)
    total = 0
    inner_ids: list[npt.NDArray[np.int64]] = []
    inner_ns: list[npt.NDArray[np.int64]] = []
    for p in model.paths:
        e = p.edges
        if e.size == 0:
            continue
        decided, _, _ = rules.of_edges(g.kind[e].astype(np.int64), g.attr[e], rules.category[e], g.src[e], g.dst[e])
        sel = e[(decided == index) & (g.kind[e] == int(Edge.HOST))]
        if sel.size == 0:
            continue
        dur = g.node_ts[g.dst[sel]] - np.maximum(g.node_ts[g.src[sel]], p.window_start)
        total += int(dur.sum())
        # The thread: the attributed slice's, else the later instant's (as the account decides).
        owner = np.where(g.attr[sel] >= 0, g.attr[sel], g.node_slice[g.dst[sel]])
        inner = rules.innermost_open(owner, (g.node_ts[g.src[sel]] + g.node_ts[g.dst[sel]]) // 2)
        inner_ids.append(inner[inner >= 0])
        inner_ns.append(dur[inner >= 0].astype(np.int64))
    n = len(model.paths)
    if not inner_ids or sum(a.size for a in inner_ids) == 0:
        return PartFrames(round(total / n), [])
    ids, at = np.unique(np.concatenate(inner_ids), return_inverse=True)
    summed = np.bincount(at, weights=np.concatenate(inner_ns), minlength=ids.size).astype(np.int64)
    frames = pl.DataFrame({"name": names.gather(ids).cast(pl.String), "kind": kinds.gather(ids).cast(pl.String),
                           "ns": summed}).filter(
        pl.col("kind") == Kind.PYTHON.value).group_by("name").agg(pl.col("ns").sum()).sort(
        ["ns", "name"], descending=[True, False])
    library = []
    for name, ns in frames.iter_rows():
        file, line, function, user = parse_frame(str(name))
        if file and not user:
            library.append(LibraryTime(path=file, line=line, function=function, ns_per_step=round(ns / n)))
    return PartFrames(round(total / n), library)
