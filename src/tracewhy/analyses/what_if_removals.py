"""Edits that take given work out of the step whatever it is: slices by id (the critical path's
gains) and a part of the step account (``what_if`` falls back to it for a part no fix names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.critical_path_replay import GraphEdit

if TYPE_CHECKING:  # what_if_edits imports this module
    from tracewhy.analyses.what_if_edits import WindowEdges


@dataclass(frozen=True)
class RemoveSlices:
    """These slices take no time (as the critical path's gains replay an item): the edges of
    these Edge kinds spent in them weigh nothing."""

    ids: tuple[int, ...]
    kinds: tuple[Edge, ...] = (Edge.HOST,)

    @property
    def label(self) -> str:
        return f"without {len(self.ids)} slice(s)"

    def edit(self, w: WindowEdges) -> GraphEdit:
        chosen = np.isin(w.attr, list(self.ids)) & np.isin(w.kind, [int(k) for k in self.kinds])
        return GraphEdit(scaled=w.ids[chosen], factor=np.zeros(int(chosen.sum())))


@dataclass(frozen=True)
class RemovePart:
    """The work of one part of the account leaves the step (logging moved out of the loop, a
    sleep removed): the edges the account puts in that part weigh nothing, waits among them go."""

    part: str

    @property
    def label(self) -> str:
        return f"without {self.part}"

    def edit(self, w: WindowEdges) -> GraphEdit:
        chosen = w.in_part(self.part)
        gpu = chosen & (w.kind == int(Edge.GPU))
        return w.removing(chosen & ~gpu, gpu)
