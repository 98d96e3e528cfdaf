"""How much of the step's critical path communication holds, which bounds what hiding it under
compute (``what_if_edits.HideCollective``) can save: exposed communication (no compute kernel
beside it on the GPU) that runs while the path is on the host, or on compute the collectives
run beside, is off the path, and hiding it changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tracewhy.analyses.account import StepModel, WindowPath
from tracewhy.analyses.account_names import PartKind
from tracewhy.analyses.critical_path_edges import Edge


@dataclass(frozen=True)
class CommOnPath:
    """Means per analysed step (the account's): the collective kernels' time on the critical path,
    and the rest of communication's time there (host time in the collective calls, their launches,
    waits on them)."""

    kernels_ns: int
    calls_ns: int
    steps: int

    @property
    def total_ns(self) -> int:
        return self.kernels_ns + self.calls_ns


def comm_on_path(model: StepModel, paths: Sequence[WindowPath] | None = None) -> CommOnPath:
    """Communication's time on these steps' critical paths (default: every analysed step's),
    kernels apart from the rest."""
    rules, g = model.rules, model.graph
    paths = model.paths if paths is None else paths
    kernels = calls = 0
    for p in paths:
        e = p.edges
        if e.size == 0:
            continue
        part, _, _ = rules.of_edges(g.kind[e].astype(np.int64), g.attr[e], rules.category[e], g.src[e], g.dst[e])
        comm_parts = [i for i, x in enumerate(rules.parts) if x.kind == PartKind.COMMUNICATION]
        comm = np.isin(part, comm_parts)
        dur = g.node_ts[g.dst[e]] - np.maximum(g.node_ts[g.src[e]], p.window_start)
        running = g.kind[e] == int(Edge.GPU)
        kernels += int(dur[comm & running].sum())
        calls += int(dur[comm & ~running].sum())
    n = max(len(paths), 1)
    return CommOnPath(kernels_ns=round(kernels / n), calls_ns=round(calls / n), steps=len(paths))
