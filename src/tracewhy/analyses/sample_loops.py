"""Python loops over a batch inside a block: a user annotation (``record_function``) whose calls
run the same ops once per item of a tensor, where one call of each over the whole batch would do.

A block call is such a loop when its outermost ops repeat: most of its repeated ops run the same
number of times, at least MIN_ITERATIONS, those that run at least that often make most of the
block's op time, and the repetition walks a tensor: the block splits it before the first repeated op (Python
iterating a tensor: ``for x in batch``) or indexes it once per iteration (``batch[i]``). The
last condition tells a loop over samples from a model whose layers repeat (the same ops once per
layer, each on the whole batch), which indexes nothing. Names only give the two ways Python walks
a tensor (ITERATING_OPS, INDEXING_OPS, with their source); which block loops is decided from
nesting, repetition and order. ``findings/sample_loops.py`` prices it with the step replayed
vectorised (``what_if_host_edits.BatchLoop``).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Final

import msgspec
import numpy as np

from tracewhy.analyses.account_host import HostContext
from tracewhy.model.schema import Col
from tracewhy.model.trace import Trace

#: ``for x in batch`` calls ``Tensor.__iter__``, which is ``iter(self.unbind(0))``
#: (torch/_tensor.py): one ``aten::unbind`` before the loop's first iteration.
ITERATING_OPS: Final = frozenset({"aten::unbind"})
#: ``batch[i]`` with an integer index records ``aten::select`` (torch/csrc/autograd/python_variable_indexing.cpp).
INDEXING_OPS: Final = frozenset({"aten::select"})
#: Iterations per block call below which a repetition is not called a loop over a batch.
MIN_ITERATIONS: Final = 8
#: The share of the block's op time the most repeated ops must hold.
MIN_REPEATED_SHARE: Final = 0.5


class SampleLoop(msgspec.Struct, frozen=True):
    """A block whose calls loop over a batch, in the steady steps."""

    block: str
    ids: tuple[int, ...]  # the looping block calls
    steps: int
    iterations: float  # per call, the median over its calls
    ops: tuple[str, ...]  # the ops run once per iteration, in the first iteration's order
    walk: str  # the op that walks the tensor (ITERATING_OPS or INDEXING_OPS)
    ns_per_step: float  # the looping calls' time (their durations summed), per step

    @property
    def calls_per_step(self) -> float:
        return len(self.ids) / max(self.steps, 1)


def sample_loops(trace: Trace, host: HostContext, slice_ts: np.ndarray, slice_end: np.ndarray,
                 windows: list[tuple[int, int]]) -> list[SampleLoop]:
    """The blocks that loop over a batch in these step windows ([start, end) ns), most time first:
    a block name counts when at least half its calls in the windows loop."""
    n = host.outer_op.size
    ids = np.arange(n)
    outermost = ids[host.outer_op == ids]
    blocks = host.outer_block[outermost]
    mine = blocks >= 0
    outermost, blocks = outermost[mine], blocks[mine]
    in_window = np.zeros(outermost.size, dtype=bool)
    for start, end in windows:
        in_window |= (slice_ts[blocks] >= start) & (slice_ts[blocks] < end)
    outermost, blocks = outermost[in_window], blocks[in_window]
    # Only block calls with enough ops and an op that walks a tensor can loop over one: found with
    # whole-array steps, so the per-op Python below sees those calls alone.
    walks = trace.slices.get_column(Col.NAME).is_in(list(ITERATING_OPS | INDEXING_OPS)).fill_null(False).to_numpy()
    calls_in, at, sizes = np.unique(blocks, return_inverse=True, return_counts=True)
    keep = np.isin(blocks, blocks[walks[outermost]]) & (sizes[at] >= MIN_ITERATIONS)
    if not keep.any():
        return []
    all_calls = Counter(host.name(int(b)) for b in calls_in.tolist())
    outermost, blocks = outermost[keep], blocks[keep]
    order = np.lexsort((slice_ts[outermost], blocks))
    by_block: dict[int, list[int]] = defaultdict(list)
    for b, op in zip(blocks[order].tolist(), outermost[order].tolist(), strict=True):
        by_block[b].append(op)
    calls: dict[str, list[tuple[int, float, tuple[str, ...], str]]] = defaultdict(list)
    for b, ops in by_block.items():
        name = host.name(b)
        loop = _loop(host, ops, slice_ts, slice_end)
        if loop is not None:
            calls[name].append((b, *loop))
    out = []
    for name, looping in calls.items():
        if 2 * len(looping) < all_calls[name]:
            continue
        out.append(SampleLoop(
            block=name, ids=tuple(c[0] for c in looping), steps=len(windows),
            iterations=statistics.median(c[1] for c in looping), ops=looping[0][2],
            walk=Counter(c[3] for c in looping).most_common(1)[0][0],
            ns_per_step=float(sum(int(slice_end[c[0]] - slice_ts[c[0]]) for c in looping)) / len(windows)))
    return sorted(out, key=lambda x: -x.ns_per_step)


def _loop(host: HostContext, ops: list[int], ts: np.ndarray,
          end: np.ndarray) -> tuple[float, tuple[str, ...], str] | None:
    """(iterations, the ops of one iteration, the walking op) when one block call's outermost ops
    (in time order) loop over a tensor; else None. The iterations are the count most of the
    repeated ops share (an op run twice per item, or only on some items, counts otherwise), the
    loop's ops those run at least that often."""
    names = [host.name(o) for o in ops]
    counts = Counter(names)
    shared = Counter(c for c in counts.values() if c >= MIN_ITERATIONS)
    if not shared:
        return None
    iterations = max(shared, key=lambda c: (shared[c], c))
    repeated = {name for name, c in counts.items() if c >= iterations}
    dur = (end[ops] - ts[ops]).astype(np.float64)
    in_loop = np.array([name in repeated for name in names])
    if dur[in_loop].sum() < MIN_REPEATED_SHARE * max(dur.sum(), 1.0):
        return None
    first = int(np.argmax(in_loop))
    indexing = [name for name in INDEXING_OPS if counts[name] == iterations]
    if indexing:
        walk = indexing[0]
    elif any(name in ITERATING_OPS for name in names[:first]):
        walk = next(name for name in names[:first] if name in ITERATING_OPS)
    else:
        return None
    one = [names[first]]
    for name in names[first + 1:]:
        if name == names[first]:
            break
        if name in repeated and name not in one:
            one.append(name)
    return float(iterations), tuple(one), walk
