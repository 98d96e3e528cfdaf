"""Each dependency-graph edge's part of the step account (``PartRules.of_edges``), decided once
per step model: the account walks the measured paths, each prediction its replayed ones, and
an edit that removes a part every edge of its window; most edges are on several of these
(on a large export's whole-trace window, 17 M edges, the paths hold millions), and an edge is
decided from its own slice whichever other edges are decided with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from tracewhy.analyses.account_parts import PartRules
    from tracewhy.analyses.critical_path_graph import Graph

I64 = npt.NDArray[np.int64]

#: Edges decided at once: a whole-trace window of a large export has 17 M, and one call over
#: them all held 1.3 GB of per-edge columns at once.
EDGES_AT_ONCE: Final = 1 << 20
#: Held per edge in two bytes (-1: not decided yet); a model with more parts decides every call.
_MAX_PARTS: Final = np.iinfo(np.int16).max


class EdgeParts:
    """The parts decided so far, by edge id (two bytes an edge, made at the first call)."""

    def __init__(self, rules: PartRules, graph: Graph) -> None:
        self.rules, self.graph = rules, graph
        self._part: npt.NDArray[np.int16] | None = None

    def of(self, edges: I64, chunk: int = EDGES_AT_ONCE) -> I64:
        """The part of each of these edges (ids in the graph), those not decided yet ``chunk`` at a time."""
        rules, g = self.rules, self.graph
        if self._part is None:
            self._part = np.full(g.src.size, -1, dtype=np.int16)
        new = edges[self._part[edges] < 0]
        for lo in range(0, new.size, chunk):
            ids = new[lo:lo + chunk]
            self.remember(ids, rules.of_edges(g.kind[ids].astype(np.int64), g.attr[ids], rules.category[ids],
                                              g.src[ids], g.dst[ids])[0])
        if len(rules.parts) > _MAX_PARTS:  # (never seen: a few dozen parts)
            return rules.of_edges(g.kind[edges].astype(np.int64), g.attr[edges], rules.category[edges],
                                  g.src[edges], g.dst[edges])[0]
        out: I64 = self._part[edges].astype(np.int64)
        return out

    def remember(self, edges: I64, part: I64) -> None:
        """Parts a caller decided with ``of_edges`` itself (the account, which also wants items)."""
        if self._part is None:
            self._part = np.full(self.graph.src.size, -1, dtype=np.int16)
        if len(self.rules.parts) <= _MAX_PARTS:
            self._part[edges] = part
