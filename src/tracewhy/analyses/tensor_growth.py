"""Tensors grown by concatenation: a loop that appends to a tensor with ``torch.cat([t, new])``
allocates a new tensor every call and copies everything grown so far into it, so a step that
grows a tensor to n slices copies about n²/2 slices where n would do (a key/value cache grown
token by token, predictions gathered batch by batch).

Two kinds of evidence decide, the stronger first:

- **Shapes** (``record_shapes``): the calls of one concatenation op on one thread in one step
  that concatenate tensors of the same shape apart from the concatenated axis form a family;
  a call *continues* another when its first input is as long along that axis as the other
  call's whole output (the other's inputs summed): the output of one call is the input of the
  next. A family whose calls mostly continue earlier ones grows a tensor; the number of
  tensors it grows side by side is its calls over its distinct lengths.
- **Durations**, where the trace records no shapes: a concatenation op called many times per
  step whose calls take longer the later they run within the step (their rank correlation
  with call order, and the last third's median against the first third's). That fits one
  tensor grown by every call, and is said as such, weaker.

Names only find the concatenation ops (CONCAT_OPS, with their source); which calls grow a
tensor is decided from shapes and time alone. ``findings/tensor_growth.py`` judges and prices
it with the step replayed with a preallocated buffer (``what_if_host_edits.Preallocate``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Final

import msgspec
import numpy as np
import polars as pl

from tracewhy.analyses.op_inputs import OpInputs
from tracewhy.model.schema import Col, Kind, OpAttrCol
from tracewhy.model.trace import Trace

#: The ATen ops that copy their input tensors into one new tensor: ``torch.cat``, its aliases
#: ``torch.concat`` and ``torch.concatenate`` (aten/src/ATen/native/TensorShape.cpp: both call
#: ``at::cat``, so the profiler records them around an ``aten::cat``; the outermost is counted),
#: and ``aten::_cat``, its name before PyTorch 1.10.
CONCAT_OPS: Final = frozenset({"aten::cat", "aten::concat", "aten::concatenate", "aten::_cat"})
#: Calls per step below which a repeated concatenation is not called a growing tensor: a few
#: concatenations per step (a U-Net's skip connections) copy little, whatever their shapes.
MIN_CALLS_PER_STEP: Final = 8
#: Shapes: the share of a family's calls that must continue an earlier call of it.
MIN_CONTINUED_SHARE: Final = 0.8
#: Durations: the rank correlation of the calls' durations with their order in the step, and
#: the last third's median over the first third's, that a growing tensor shows in the median step.
MIN_RANK_CORRELATION: Final = 0.6
MIN_LATE_OVER_EARLY: Final = 3.0


class GrownTensors(msgspec.Struct, frozen=True):
    """Calls of one concatenation op that grow tensors, over the steps looked at."""

    op: str
    ids: tuple[int, ...]  # the growing calls, every step
    steps: int
    #: "shapes" (one call's output is the next one's input) or "durations" (calls slow down along the step).
    evidence: str
    ns_per_step: float  # the calls' own time (their durations summed), per step
    early_ns: float  # median duration of the first third of a step's calls (median over steps)
    late_ns: float  # ... of the last third
    rank_correlation: float  # of duration with call order, median over steps
    tensors: int = 0  # grown side by side (shapes only)
    axis: int = -1
    first_shapes: tuple[tuple[int, ...], ...] = ()  # the first call's inputs (shapes only)
    last_shapes: tuple[tuple[int, ...], ...] = ()
    copied_per_step: float = 0.0  # elements the calls write (their outputs), per step
    new_per_step: float = 0.0  # elements appended (the inputs after the first), per step

    @property
    def calls_per_step(self) -> float:
        return len(self.ids) / max(self.steps, 1)


def tensor_growth(trace: Trace, windows: list[tuple[int, int]]) -> list[GrownTensors]:
    """The concatenation ops that grow tensors in these step windows ([start, end) ns), most
    time first."""
    if not windows:
        return []
    s = trace.slices
    # Names compared as the categorical's own strings, not a cast of every row.
    calls = s.filter(pl.col(Col.NAME).is_in(list(CONCAT_OPS)) & (pl.col(Col.KIND) == Kind.CPU_OP.value))
    if calls.height == 0:
        return []
    parent = s.get_column(Col.PARENT).fill_null(-1).to_numpy()
    concat_ids = set(calls.get_column(Col.ID).to_list())
    outer = calls.filter([int(parent[i]) not in concat_ids for i in calls.get_column(Col.ID).to_list()])
    attrs = dict(trace.op_attrs.filter(pl.col(OpAttrCol.ID).is_in(outer.get_column(Col.ID).implode())).select(
        OpAttrCol.ID, pl.concat_str([OpAttrCol.INPUT_DIMS, OpAttrCol.CONCRETE_INPUTS], separator="\x00",
                                    ignore_nulls=False).alias("inputs")).iter_rows())
    out = []
    for op in sorted(set(outer.get_column(Col.NAME).cast(pl.String).to_list())):
        mine = outer.filter(pl.col(Col.NAME).cast(pl.String) == op).sort(Col.TS)
        per_step = _per_step(mine, windows)
        recorded, grown = _by_shapes(op, per_step, attrs, len(windows))
        if not recorded:  # shapes decide where the trace has them: durations only without
            grown = _by_durations(op, per_step, len(windows))
        if grown is not None:
            out.append(grown)
    return sorted(out, key=lambda g: -g.ns_per_step)


def _per_step(calls: pl.DataFrame, windows: list[tuple[int, int]]) -> list[list[tuple[int, int, int, int]]]:
    """Per window, its calls as (id, tid, ts, dur) in time order."""
    ts = calls.get_column(Col.TS).to_numpy()
    rows = list(zip(calls.get_column(Col.ID).to_list(), calls.get_column(Col.TID).fill_null(-1).to_list(),
                    ts.tolist(), calls.get_column(Col.DUR).to_list(), strict=True))
    out = []
    for start, end in windows:
        lo, hi = np.searchsorted(ts, [start, end])
        out.append(rows[lo:hi])
    return out


def _stats(steps: list[list[tuple[int, int, int, int]]]) -> tuple[float, float, float]:
    """(early, late, rank correlation): medians over the steps of their calls' durations'
    first and last thirds and of the rank correlation of duration with call order."""
    early, late, rho = [], [], []
    for calls in steps:
        dur = np.array([c[3] for c in calls], dtype=np.float64)
        if dur.size < 3:
            continue
        third = dur.size // 3
        early.append(float(np.median(dur[:third])))
        late.append(float(np.median(dur[-third:])))
        ranks = np.argsort(np.argsort(dur, kind="stable"), kind="stable")
        rho.append(float(np.corrcoef(np.arange(dur.size), ranks)[0, 1]) if np.ptp(ranks) else 0.0)
    if not rho:
        return 0.0, 0.0, 0.0
    return float(np.median(early)), float(np.median(late)), float(np.median(rho))


def _by_durations(op: str, steps: list[list[tuple[int, int, int, int]]], n: int) -> GrownTensors | None:
    if min(len(c) for c in steps) < MIN_CALLS_PER_STEP:
        return None
    early, late, rho = _stats(steps)
    if rho < MIN_RANK_CORRELATION or late < MIN_LATE_OVER_EARLY * max(early, 1.0):
        return None
    ids = tuple(c[0] for calls in steps for c in calls)
    return GrownTensors(op=op, ids=ids, steps=n, evidence="durations",
                        ns_per_step=sum(c[3] for calls in steps for c in calls) / n,
                        early_ns=early, late_ns=late, rank_correlation=rho)


class _Concat(msgspec.Struct, frozen=True):
    id: int
    dur: int
    shapes: tuple[tuple[int, ...], ...]
    axis: int


def _parse(text: str | None) -> tuple[tuple[tuple[int, ...], ...], int] | None:
    """A concatenation's input shapes (its TensorList) and axis, from its recorded inputs."""
    if not text:
        return None
    dims, _, concrete = text.partition("\x00")
    x = OpInputs.parse(dims, None, concrete or None)
    if x is None or not x.dims or not isinstance(x.dims[0], list):
        return None
    shapes = tuple(tuple(d) for d in x.dims[0] if isinstance(d, list) and all(isinstance(v, int) for v in d))
    if len(shapes) < 2 or len({len(d) for d in shapes}) != 1 or not shapes[0]:
        return None
    rank = len(shapes[0])
    axis = x.value(1)
    if not isinstance(axis, int):  # not recorded: the one axis the shapes differ on, else the first
        differ = [a for a in range(rank) if len({d[a] for d in shapes}) > 1]
        axis = differ[0] if len(differ) == 1 else 0
    return (shapes, axis % rank) if -rank <= axis < rank else None


def _by_shapes(op: str, steps: list[list[tuple[int, int, int, int]]], attrs: dict[int, str | None],
               n: int) -> tuple[bool, GrownTensors | None]:
    """(whether the calls record shapes, the families (thread, axis, shapes off the axis) whose
    calls continue each other when every step has at least MIN_CALLS_PER_STEP such calls)."""
    grown: list[list[_Concat]] = []
    parsed_any = False
    for calls in steps:
        families: dict[tuple[object, ...], list[_Concat]] = defaultdict(list)
        for cid, tid, _ts, dur in calls:
            p = _parse(attrs.get(cid))
            if p is None:
                continue
            parsed_any = True
            shapes, axis = p
            off_axis = tuple(d[:axis] + d[axis + 1:] for d in shapes)
            families[(tid, axis, off_axis)].append(_Concat(cid, dur, shapes, axis))
        mine = [c for family in families.values() if _continued(family) for c in family]
        grown.append(sorted(mine, key=lambda c: c.id))
    if not parsed_any or min(len(g) for g in grown) < MIN_CALLS_PER_STEP:
        return parsed_any, None
    first, last = grown[0][0], max(grown[0], key=lambda c: c.shapes[0][c.axis])
    lengths = Counter(c.shapes[0][c.axis] for c in grown[0])
    early, late, rho = _stats([[(c.id, 0, 0, c.dur) for c in g] for g in grown])
    return True, GrownTensors(
        op=op, ids=tuple(c.id for g in grown for c in g), steps=n, evidence="shapes",
        ns_per_step=sum(c.dur for g in grown for c in g) / n, early_ns=early, late_ns=late, rank_correlation=rho,
        tensors=round(len(grown[0]) / max(len(lengths), 1)), axis=first.axis, first_shapes=first.shapes,
        last_shapes=last.shapes,
        copied_per_step=sum(_elements(c.shapes, summed=c.axis) for g in grown for c in g) / n,
        new_per_step=sum(sum(_elements((d,)) for d in c.shapes[1:]) for g in grown for c in g) / n)


def _continued(family: list[_Concat]) -> bool:
    """Most calls' first input is as long as an earlier call's output (each output used once)."""
    if len(family) < 2:
        return False
    made: Counter[int] = Counter()
    continued = 0
    for c in family:
        if made[c.shapes[0][c.axis]] > 0:
            made[c.shapes[0][c.axis]] -= 1
            continued += 1
        made[sum(d[c.axis] for d in c.shapes)] += 1
    return continued >= MIN_CONTINUED_SHARE * (len(family) - 1) and continued > 0


def _elements(shapes: tuple[tuple[int, ...], ...], summed: int | None = None) -> int:
    """Elements of one tensor, or of the concatenation of ``shapes`` along ``summed``."""
    if summed is None:
        return int(np.prod(shapes[0], dtype=np.int64))
    out = list(shapes[0])
    out[summed] = sum(d[summed] for d in shapes)
    return int(np.prod(out, dtype=np.int64))
