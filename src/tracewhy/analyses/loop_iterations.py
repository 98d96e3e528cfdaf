"""Iterations of a training loop the trace does not mark (no ``ProfilerStep#``, no repeated block
tiling the run): one per repeat of the op the loop runs once an iteration at the top level of
one thread, such as the DataLoader fetch or ``Optimizer.step`` (``steps`` takes them as its steps).
"""

from __future__ import annotations

from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.host_activity import HostIndex, build_host_index
from tracewhy.analyses.nvtx import PROFILER_STEP_PREFIX
from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import KINETO_FORMAT, Trace
from tracewhy.units import fmt_ns


class IterationSource:
    """What repeats once an iteration, in the order they are preferred when several qualify: the
    fetch opens an iteration (the loop's head), the optimizer step closes one, ``zero_grad`` and a
    user's top-level block sit somewhere inside it."""

    DATALOADER: Final = "dataloader"  # fetch start to the next fetch's start
    OPTIMIZER: Final = "optimizer"  # one Optimizer.step's end to the next's
    ZERO_GRAD: Final = "zero_grad"  # Optimizer.zero_grad start to the next one's
    ANNOTATION: Final = "annotation"  # a top-level record_function block's start to the next one's
    #: An inference engine's iteration annotation's own span (``engine_iterations``: not a loop's repeat).
    ENGINE: Final = "engine"


_PREFERENCE: Final = (IterationSource.DATALOADER, IterationSource.OPTIMIZER, IterationSource.ZERO_GRAD,
                      IterationSource.ANNOTATION)
_WHAT: Final = {
    IterationSource.DATALOADER: "DataLoader fetch", IterationSource.OPTIMIZER: "optimizer step",
    IterationSource.ZERO_GRAD: "zero_grad", IterationSource.ANNOTATION: "top-level block",
}

#: Two repeats give one whole iteration between them.
MIN_REPEATS: Final = 2
#: Evenly spaced: an interval within this factor of the median interval...
SPACING_FACTOR: Final = 2.0
#: ...for at least this share of the intervals after the first (the first may be warm-up: 4.0 s
#: among 0.2 s iterations when cuDNN autotunes; a checkpoint save can stretch a later one).
EVEN_SHARE: Final = 0.75


class LoopIterations(msgspec.Struct, frozen=True):
    """``starts``/``ends``: each iteration's span in ns, in time order, contiguous; ``boundary_ids``:
    per iteration the slice it was found from (the fetch that opens it, the optimizer step that
    closes it, the block that opens it); ``rule``: which rule decided, in a phrase."""

    source: str
    name: str
    pid: int
    tid: int
    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    boundary_ids: npt.NDArray[np.int64]
    rule: str


def loop_iterations(trace: Trace, host: HostIndex | None = None) -> LoopIterations | None:
    """The iterations, or None when nothing qualifies. A candidate is a name (a torch block of
    IterationSource; in a Kineto trace, also a user's annotation) with its spans at the top level
    of one thread (no op or annotation above them; Python frames aside), repeated at least
    MIN_REPEATS times, evenly spaced (EVEN_SHARE of the intervals after the first within
    SPACING_FACTOR of their median). Among candidates: by IterationSource preference, then most
    repeats, then the earliest. ``host``: the trace's host index, when the caller has it."""
    host = host if host is not None else build_host_index(trace)
    rows = np.flatnonzero(host.is_kind(Kind.ANNOTATION) | host.is_kind(Kind.CPU_OP))
    if rows.size == 0:
        return None
    top = host.top_level(rows)
    s = trace.slices
    ids = host.ids[top]
    names = s.get_column(Col.NAME).gather(ids).cast(pl.String)
    # nsys ranges: ``nvtx.nvtx_step_marker`` has taken the user's repeated ones already, and
    # left out the libraries' (CUB, NCCL, emit_nvtx op ranges), which are no iteration.
    annotation = host.is_kind(Kind.ANNOTATION)[top] & (trace.meta.format == KINETO_FORMAT)
    roles = {n: _role(n, a) for n, a in zip(*_distinct_names(names, annotation), strict=True)}
    wanted = [n for n, r in roles.items() if r is not None]
    if not wanted:
        return None
    tops = pl.DataFrame({
        Col.ID: ids, Col.NAME: names, Col.PID: s.get_column(Col.PID).gather(ids).fill_null(-1),
        Col.TID: s.get_column(Col.TID).gather(ids).fill_null(-1), Col.TS: host.ts[top], "end": host.end[top],
    }).filter(pl.col(Col.NAME).is_in(wanted)).sort(Col.NAME, Col.PID, Col.TID, Col.TS)
    best: tuple[tuple[int, int, int, str, int, int], LoopIterations] | None = None
    for (name, pid, tid), group in tops.group_by(Col.NAME, Col.PID, Col.TID, maintain_order=True):
        role = roles[str(name)]
        assert role is not None
        found = _candidate(group, str(name), int(pid), int(tid), role)
        if found is None:
            continue
        # Equal counts: the one met first opens the iteration (forward before backward).
        rank = (_PREFERENCE.index(role), -found.starts.size, int(found.starts[0]), str(name), int(pid), int(tid))
        if best is None or rank < best[0]:
            best = (rank, found)
    return None if best is None else best[1]


def _distinct_names(names: pl.Series, annotation: npt.NDArray[np.bool_]) -> tuple[list[str], list[bool]]:
    """Each distinct name once, and whether it is an annotation somewhere."""
    both = pl.DataFrame({Col.NAME: names, "a": annotation}).drop_nulls(Col.NAME).group_by(Col.NAME).agg(
        pl.col("a").any())
    return both.get_column(Col.NAME).to_list(), both.get_column("a").to_list()


def _role(name: str, is_annotation: bool) -> str | None:
    if api_names.is_dataloader(name):
        return IterationSource.DATALOADER
    if api_names.is_optimizer_step(name):
        return IterationSource.OPTIMIZER
    if api_names.is_optimizer(name):
        return IterationSource.ZERO_GRAD
    if is_annotation and not name.startswith(PROFILER_STEP_PREFIX):
        return IterationSource.ANNOTATION
    return None


def _candidate(group: pl.DataFrame, name: str, pid: int, tid: int, role: str) -> LoopIterations | None:
    ts = group.get_column(Col.TS).to_numpy()
    end = group.get_column("end").to_numpy()
    # Outermost spans only: a fetch nested in a fetch (an op and its annotation) is the same fetch.
    outer = np.r_[True, ts[1:] >= np.maximum.accumulate(end)[:-1]]
    ts, end, ids = ts[outer], end[outer], group.get_column(Col.ID).to_numpy()[outer]
    if ts.size < MIN_REPEATS:
        return None
    closes = role == IterationSource.OPTIMIZER
    bounds = end if closes else ts
    intervals = np.diff(bounds)
    later = intervals[1:] if intervals.size > 1 else intervals
    median = float(np.median(later))
    if median <= 0:
        return None
    even = (later <= SPACING_FACTOR * median) & (later >= median / SPACING_FACTOR)
    if even.mean() < EVEN_SHARE:
        return None
    rule = (f"one per {_WHAT[role]} {name!r} ({'end to end' if closes else 'start to start'}): it repeats "
            f"{ts.size} times at the top level of thread {tid}, evenly spaced ({fmt_ns(round(median))} apart at the "
            "median)")
    return LoopIterations(
        source=role, name=name, pid=pid, tid=tid, starts=bounds[:-1].astype(np.int64),
        ends=bounds[1:].astype(np.int64), boundary_ids=(ids[1:] if closes else ids[:-1]).astype(np.int64), rule=rule,
    )

