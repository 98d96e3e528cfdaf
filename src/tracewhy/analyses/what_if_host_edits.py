"""Edits for fixes that rewrite host work rather than move it: a per-sample loop vectorised, a
tensor grown by concatenation preallocated, gradients set to None instead of zeroed. Each edits
one window's dependency graph (``GraphEdit``) as ``what_if_edits``' fixes do; calibrated on the
before/after pairs of ``tests/data/calibration``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from tracewhy.analyses.account_host import HostPurpose
from tracewhy.analyses.critical_path_replay import GraphEdit
from tracewhy.analyses.what_if_edits import WindowEdges

#: The ops ``zero_grad(set_to_none=False)`` runs per gradient (PyTorch's torch/optim/optimizer.py
#: zeroes each grad with ``zero_()`` or, grouped by device and dtype, ``torch._foreach_zero_``).
ZEROING_OPS: Final = frozenset({"aten::zero_", "aten::_foreach_zero_"})


@dataclass(frozen=True)
class BatchLoop:
    """A per-sample Python loop in a named block vectorised over the batch: each op the block
    repeats keeps one call (the work of all samples, at the cost of the cheapest call: the
    ops' fixed cost is what the loop multiplied), and the block's own Python time shrinks with
    the number of calls it makes."""

    block: str

    @property
    def label(self) -> str:
        return f"the loop in {self.block} vectorised"

    def edit(self, w: WindowEdges) -> GraphEdit:
        ctx = w.model.rules.ctx
        attr = np.maximum(w.attr, 0)
        block = ctx.outer_block[attr]
        names = {int(b): ctx.name(int(b)) for b in np.unique(block[block >= 0]).tolist()}
        inside = (w.attr >= 0) & np.array([names.get(int(b)) == self.block for b in block], dtype=bool)
        ops, before, after = w.fewer_calls(w.host() & inside & (ctx.outer_op[attr] >= 0), None)
        own = w.host() & inside & (w.attr == block)  # the block's own time: the loop's Python
        if before == 0:
            return ops
        return ops + GraphEdit(scaled=w.ids[own], factor=np.full(int(own.sum()), after / before))


@dataclass(frozen=True)
class Preallocate:
    """A tensor grown by ``op`` (``torch.cat`` of the old tensor and the new rows) allocated
    once and written in place: each call then costs what the window's cheapest call of ``op``
    took (the first, smallest growth: a copy of the new rows and the op's fixed cost), instead
    of copying everything grown so far."""

    op: str = "aten::cat"

    @property
    def label(self) -> str:
        return f"a preallocated buffer instead of {self.op} growth"

    def edit(self, w: WindowEdges) -> GraphEdit:
        rules = w.model.rules
        outer = rules.ctx.outer_op[np.maximum(w.attr, 0)]
        ops = np.unique(outer[w.host() & (outer >= 0)]).tolist()
        calls = [int(o) for o in ops if rules.ctx.name(int(o)) == self.op]
        if len(calls) < 2:
            return GraphEdit()
        dur = (rules.slice_end[calls] - rules.slice_ts[calls]).astype(np.float64)
        factor = dict(zip(calls, (dur.min() / np.maximum(dur, 1)).tolist(), strict=True))
        chosen = w.host() & np.isin(outer, calls)
        return GraphEdit(scaled=w.ids[chosen], factor=np.array([factor[int(o)] for o in outer[chosen]]))


@dataclass(frozen=True)
class SetGradsToNone:
    """``zero_grad(set_to_none=True)``: the optimizer no longer zeroes the gradients (the
    zeroing ops under the optimizer leave). What backward then spends allocating new gradients
    instead of accumulating into the old ones is not in the trace, so it is not added."""

    @property
    def label(self) -> str:
        return "gradients set to None, not zeroed"

    def edit(self, w: WindowEdges) -> GraphEdit:
        ctx = w.model.rules.ctx
        outer = ctx.outer_op[np.maximum(w.attr, 0)]
        names = {int(o): ctx.name(int(o)) for o in np.unique(outer[outer >= 0]).tolist()}
        zeroing = np.array([names.get(int(o)) in ZEROING_OPS for o in outer], dtype=bool)
        chosen = w.host() & (w.context == int(HostPurpose.OPTIMIZER)) & zeroing
        return w.removing(chosen, np.zeros(w.ids.size, dtype=bool))
