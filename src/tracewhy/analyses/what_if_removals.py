"""Edits that take given work out of the step whatever it is: slices by id (the critical path's
gains) and a part of the step account (``what_if`` falls back to it for a part no fix names)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec
import numpy as np
import numpy.typing as npt

from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.critical_path_replay import GraphEdit
from tracewhy.analyses.edge_parts import EDGES_AT_ONCE

if TYPE_CHECKING:  # what_if_window imports this module
    from tracewhy.analyses.what_if_window import WindowEdges

#: A window's edges whose parts are decided at once (``window_parts``).
PART_CHUNK: Final = EDGES_AT_ONCE


class RemoveSlices(msgspec.Struct, frozen=True):
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


class RemovePart(msgspec.Struct, frozen=True):
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


def window_parts(w: WindowEdges) -> npt.NDArray[np.integer[Any]]:
    """The part (``PartRules.of_edges``) of each of the window's edges, as its number in the
    fewest bytes (held for the rest of the run), decided PART_CHUNK edges at a time where the
    account or a prediction has not decided them already (``StepModel.edge_parts``). Edges that
    share a key are decided alike, so a chunk of edges gets the parts one call over them all gives."""
    parts = w.model.edge_parts.of(w.ids, PART_CHUNK)
    out: npt.NDArray[np.integer[Any]] = parts.astype(np.min_scalar_type(max(len(w.model.rules.parts), 1)))
    return out
