"""Edits for fixes that rewrite host work rather than move it: a per-sample loop vectorised, a
tensor grown by concatenation preallocated, gradients set to None instead of zeroed, a tensor
made on the device instead of copied there. Each edits one window's dependency graph
(``GraphEdit``) as ``what_if_edits``' fixes do; all but the last are calibrated on the
before/after pairs of ``tests/data/calibration``.
"""

from __future__ import annotations

from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt

from tracewhy.analyses.account_host import HostPurpose
from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.critical_path_replay import GraphEdit
from tracewhy.analyses.what_if_comm import ACCUMULATE_NODE
from tracewhy.analyses.what_if_edits import I64
from tracewhy.analyses.what_if_gaps import released_after, untraced_around
from tracewhy.analyses.what_if_removals import RemovePart
from tracewhy.analyses.what_if_window import WindowEdges

#: The ops ``zero_grad(set_to_none=False)`` runs per gradient (PyTorch's torch/optim/optimizer.py
#: zeroes each grad with ``zero_()`` or, grouped by device and dtype, ``torch._foreach_zero_``).
ZEROING_OPS: Final = frozenset({"aten::zero_", "aten::_foreach_zero_"})
#: What AccumulateGrad runs to add a new gradient into an existing one (``variable_grad +=
#: new_grad`` in torch/csrc/autograd/functions/accumulate_grad.h).
ACCUMULATION_OPS: Final = frozenset({"aten::add_"})
#: What touching fresh pages first costs against a warm ``zero_()`` of the same bytes: the
#: kernel zeroes each 4 KiB page and traps once per page. Measured by bench/first_touch.py
#: (48 MiB, one thread, out of cache) on the 2-core KVM development machine: 12x.
FIRST_TOUCH_PER_ZEROING: Final = 12.0


class BatchLoop(msgspec.Struct, frozen=True):
    """A per-sample Python loop in a named block vectorised over the batch: each op the block
    repeats keeps one call (the work of all samples, at the cost of the cheapest call: the
    ops' fixed cost is what the loop multiplied), the loop's split and join leave (the op run
    once just before its first repeated call, ``aten::unbind`` where Python iterates a tensor,
    and the one just after its last, the ``torch.stack`` of the per-sample results: the
    vectorised code works on the batch as it is), and the block's own Python time shrinks with
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
        in_ops = w.host() & inside & (ctx.outer_op[attr] >= 0)
        ops, before, after = w.fewer_calls(in_ops, None)
        own = w.host() & inside & (w.attr == block)  # the block's own time: the loop's Python
        if before == 0:
            return ops
        ends = self._split_and_join(w, ctx.outer_op[attr][in_ops])
        gone = in_ops & np.isin(ctx.outer_op[attr], list(ends))
        after -= len(ends)
        return ops + GraphEdit(scaled=w.ids[own], factor=np.full(int(own.sum()), after / before)) + GraphEdit(
            scaled=w.ids[gone], factor=np.zeros(int(gone.sum())))

    @staticmethod
    def _split_and_join(w: WindowEdges, outer: I64) -> set[int]:
        """Of the block's outermost ops (``outer``), the one-off op just before the first call
        of a repeated op and the one just after the last (none where that op repeats too)."""
        rules = w.model.rules
        calls = np.unique(outer)
        calls = calls[np.argsort(rules.slice_ts[calls], kind="stable")]
        named = [rules.ctx.name(int(c)) for c in calls]
        counts = {n: named.count(n) for n in set(named)}
        repeated = [i for i, n in enumerate(named) if counts[n] > 1]
        if not repeated:
            return set()
        ends = {repeated[0] - 1, repeated[-1] + 1}
        return {int(calls[i]) for i in ends if 0 <= i < len(calls) and counts[named[i]] == 1}


class Preallocate(msgspec.Struct, frozen=True):
    """A tensor grown by ``op`` (``torch.cat`` of the old tensor and the new rows) allocated
    once and written in place: each call then costs what the window's cheapest call of ``op``
    took (the first, smallest growth: a copy of the new rows and the op's fixed cost), instead
    of copying everything grown so far; so do the copy kernels the calls launch, against the
    cheapest of them. ``calls``: the growing calls (``analyses/tensor_growth``), where the
    window holds other calls of ``op`` that grow nothing; empty: every call of ``op``."""

    op: str = "aten::cat"
    calls: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        return f"a preallocated buffer instead of {self.op} growth"

    def edit(self, w: WindowEdges) -> GraphEdit:
        rules = w.model.rules
        outer = rules.ctx.outer_op[np.maximum(w.attr, 0)]
        ops = np.unique(outer[w.host() & (outer >= 0)])
        if self.calls:
            calls = np.intersect1d(ops, np.asarray(self.calls, dtype=np.int64)).tolist()
        else:
            calls = [int(o) for o in ops.tolist() if rules.ctx.name(int(o)) == self.op]
        if len(calls) < 2:
            return GraphEdit()
        cheaper = self._cheapest(w, w.host() & np.isin(outer, calls), outer)
        launched = w.launch
        by_call = np.where(launched >= 0, rules.ctx.outer_op[np.maximum(launched, 0)], -1)
        kernels = (w.kind == int(Edge.GPU)) & np.isin(by_call, calls)
        return cheaper + self._cheapest(w, kernels, w.attr) + released_after(w, calls)

    @staticmethod
    def _cheapest(w: WindowEdges, chosen: npt.NDArray[np.bool_], unit: I64) -> GraphEdit:
        """The ``chosen`` edges scaled so that each ``unit`` (a call, a kernel) takes what the
        cheapest of them takes."""
        units = np.unique(unit[chosen])
        if units.size < 2:
            return GraphEdit()
        rules = w.model.rules
        dur = (rules.slice_end[units] - rules.slice_ts[units]).astype(np.float64)
        factor = np.minimum(dur.min() / np.maximum(dur, 1), 1.0)
        return GraphEdit(scaled=w.ids[chosen], factor=factor[np.searchsorted(units, unit[chosen])])


class SetGradsToNone(msgspec.Struct, frozen=True):
    """``zero_grad(set_to_none=True)``: the optimizer no longer zeroes the gradients (the
    zeroing ops under the optimizer leave).

    On a CPU-only trace more moves. Backward's ``AccumulateGrad`` then takes each new gradient
    as it is instead of adding it into the old one (its ``aten::add_`` leaves), but those new
    gradients stay alive until the next ``zero_grad`` frees them all at once, and glibc hands
    that much freed memory back to the OS: the next backward's gradients land on fresh pages,
    which the kernel zeroes on first touch, one fault per 4 KiB page. (With the gradients
    zeroed instead, each backward result was added in and freed at once, and the next one
    reused its memory.) The bytes are the ones the zeroing ops wrote, so that cost is their time
    times ``first_touch_per_zeroing`` (what a first touch costs against a warm ``zero_()`` of
    the same bytes: ``bench/first_touch.py`` measures it on the machine at hand), added where
    the gradients arrive, in the ``AccumulateGrad`` nodes. Measured on the calibration pairs,
    the fix made the CPU step slower. On a GPU the caching allocator keeps the freed blocks and
    the next backward reuses them without a fault, so a trace with GPU activity keeps the
    zeroing's saving alone."""

    first_touch_per_zeroing: float = FIRST_TOUCH_PER_ZEROING

    @property
    def label(self) -> str:
        return "gradients set to None, not zeroed"

    def edit(self, w: WindowEdges) -> GraphEdit:
        ctx = w.model.rules.ctx
        outer = ctx.outer_op[np.maximum(w.attr, 0)]
        names = {int(o): ctx.name(int(o)) for o in np.unique(outer[outer >= 0]).tolist()}
        # (Each op named once, each edge tested in one pass, not a lookup per edge.)
        zeroing = np.isin(outer, [o for o, name in names.items() if name in ZEROING_OPS])
        chosen = w.host() & (w.context == int(HostPurpose.OPTIMIZER)) & zeroing
        edit = w.removing(chosen, np.zeros(w.ids.size, dtype=bool))
        if not w.model.rules.cpu_only or not chosen.any():
            return edit
        return edit + self._fresh_gradients(w, outer, names, float(_durations(w)[chosen].sum()))

    def _fresh_gradients(self, w: WindowEdges, outer: I64, names: dict[int, str], zeroing_ns: float) -> GraphEdit:
        """The AccumulateGrad nodes' time: their accumulation leaves, the first touch of the
        gradients' pages comes in (spread over the nodes' edges in proportion to their time)."""
        ctx = w.model.rules.ctx
        node = w.host() & np.array([names.get(int(o), "").endswith(ACCUMULATE_NODE) for o in outer], dtype=bool)
        if not node.any():
            return GraphEdit()
        dur = _durations(w)
        accumulating = node & np.array([ctx.name(int(a)) in ACCUMULATION_OPS for a in np.maximum(w.attr, 0)],
                                       dtype=bool)
        total = float(dur[node].sum())
        after = total - float(dur[accumulating].sum()) + self.first_touch_per_zeroing * zeroing_ns
        factor = after / total if total > 0 else 1.0
        return GraphEdit(scaled=w.ids[node], factor=np.full(int(node.sum()), factor))


def _durations(w: WindowEdges) -> npt.NDArray[np.float64]:
    """Each edge's length in the trace, ns."""
    g = w.model.graph
    return (g.node_ts[w.dst] - g.node_ts[w.src]).astype(np.float64)


class RemoveCode(msgspec.Struct, frozen=True):
    """Code that runs ops removed (a monitoring hook's ``.item()`` reads, logging): the part's
    work leaves (``RemovePart``) and so does the Python that called it, the untraced time
    between those ops and around them (``what_if_gaps.untraced_around``)."""

    part: str

    @property
    def label(self) -> str:
        return f"without {self.part} and the code that runs it"

    def edit(self, w: WindowEdges) -> GraphEdit:
        chosen = w.in_part(self.part) & w.host()
        ops = w.model.rules.ctx.outer_op[np.maximum(w.attr[chosen], 0)]
        return RemovePart(self.part).edit(w) + untraced_around(w, {int(o) for o in np.unique(ops[ops >= 0])})


class BuildOnDevice(msgspec.Struct, frozen=True):
    """Tensors a step makes on the host and copies to the device, made on the device instead
    (``torch.randn(..., device=...)``): the copy ops (``copy_ops``, outermost) leave with all the
    host time under them (the copy call and any wait in it) and the copies they launched; the
    factory op stays, its host time standing for the kernel launch it makes instead."""

    copy_ops: tuple[int, ...]

    @property
    def label(self) -> str:
        return "tensors made on the device, not copied from the host"

    def edit(self, w: WindowEdges) -> GraphEdit:
        ctx = w.model.rules.ctx
        copying = np.isin(ctx.outer_op[np.maximum(w.attr, 0)], self.copy_ops)
        host = (w.attr >= 0) & copying & (w.kind != int(Edge.GPU))
        gpu = (w.launch >= 0) & np.isin(ctx.outer_op[np.maximum(w.launch, 0)], self.copy_ops)
        return w.removing(host, gpu)
