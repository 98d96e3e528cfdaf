"""What a fix would buy: the step's dependency graph edited the way the fix would change the
program (``what_if_edits``), each analysed window replayed with the edit and its critical path
walked again (``critical_path_replay``); never the fixed part subtracted from the step. A
prediction gives the step's predicted length and the part that becomes the largest avoidable one
after the fix (``next_bottleneck``). Every replay also makes the step wait for the GPU work that
ran in its window: a step whose host no longer waits still ends after its kernels do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.account import AccountCol, AccountResult, StepModel
from tracewhy.analyses.account_names import PartKind, PartName, avoidable
from tracewhy.analyses.critical_path import PathCol
from tracewhy.analyses.critical_path_replay import GraphEdit
from tracewhy.analyses.step_units import spread_picks
from tracewhy.analyses.what_if_edits import (
    DropSync,
    Fix,
    HideCollective,
    MultiTensorOptimizer,
    OverlapCopies,
    PrefetchData,
    RemoveCompile,
    RemoveRecompute,
)
from tracewhy.analyses.what_if_host_edits import RemoveCode
from tracewhy.analyses.what_if_removals import RemovePart
from tracewhy.analyses.what_if_window import WindowEdges

F64 = npt.NDArray[np.float64]


class WhatIfCol:
    """Columns of ``WhatIfResult.table``: one row per prediction."""

    EDIT: Final = "edit"  # what the fix does (several joined by " + " for a combined one)
    COMBINED: Final = "combined"  # several edits at once
    MEASURED: Final = "measured_ns"  # the mean analysed step
    PREDICTED: Final = "predicted_ns"
    SAVED: Final = "saved_ns"
    SAVED_SHARE: Final = "saved_share"  # of the measured step
    CHANGED: Final = "changed"  # the edit found something to change in the analysed steps
    NEXT: Final = "next_bottleneck"  # the largest avoidable part after the fix (null: none)
    NEXT_NS: Final = "next_bottleneck_ns"


WHAT_IF_SCHEMA: Final = pl.Schema({
    WhatIfCol.EDIT: pl.String(), WhatIfCol.COMBINED: pl.Boolean(), WhatIfCol.MEASURED: pl.Int64(),
    WhatIfCol.PREDICTED: pl.Int64(), WhatIfCol.SAVED: pl.Int64(), WhatIfCol.SAVED_SHARE: pl.Float64(),
    WhatIfCol.CHANGED: pl.Boolean(), WhatIfCol.NEXT: pl.String(), WhatIfCol.NEXT_NS: pl.Int64(),
})


class Prediction(msgspec.Struct, frozen=True):
    """Means over the replayed steps (at most PREDICTED_STEPS of the account's). ``parts``: the
    edited steps' parts (ns per step), the account of the predicted step."""

    label: str
    measured_ns: int
    predicted_ns: int
    changed: bool
    next_bottleneck: str | None
    next_bottleneck_ns: int
    parts: dict[str, int]

    @property
    def saved_ns(self) -> int:
        return self.measured_ns - self.predicted_ns


@dataclass(frozen=True)
class WhatIfResult:
    """``table`` (WHAT_IF_SCHEMA): each edit alone, then the top ``combined`` by time saved
    together; ``predictions`` the same rows with their predicted parts."""

    table: pl.DataFrame
    predictions: tuple[Prediction, ...]


#: Steps each prediction replays (of the account's analysed ones, spread evenly): a replay walks
#: every instant of its window in Python, 10-50 ms per step on 100 k-slice traces.
PREDICTED_STEPS: Final = 4
#: On a dependency graph of at most this many edges every analysed step is replayed (a few ms
#: each: the 16 steps of the demo's 10 k-edge graph add 0.07 CPU s to diagnose), so that the
#: predictions start from the account's own mean step rather than from a sample's.
REPLAY_ALL_MAX_EDGES: Final = 100_000


def window_edges(model: StepModel, max_steps: int | None = None) -> list[WindowEdges]:
    """The edges of at most ``max_steps`` analysed windows, spread evenly over the run, for
    several predictions to share (None: every analysed one on a graph of at most
    REPLAY_ALL_MAX_EDGES edges, else PREDICTED_STEPS)."""
    paths = model.paths
    if max_steps is None:
        max_steps = len(paths) if model.graph.src.size <= REPLAY_ALL_MAX_EDGES else PREDICTED_STEPS
    if len(paths) > max_steps:
        paths = tuple(paths[i] for i in spread_picks(len(paths), max_steps))
    return [WindowEdges(model, p) for p in paths]


def predict(model: StepModel, edits: Sequence[Fix], windows: list[WindowEdges] | None = None) -> Prediction:
    """The steps replayed with all these edits at once: ``windows``, those of ``window_edges``
    (when several predictions share them), else at most PREDICTED_STEPS of the model's."""
    rules, g = model.rules, model.graph
    windows = windows if windows is not None else window_edges(model)
    measured: list[int] = []
    predicted: list[int] = []
    totals = np.zeros(0, dtype=np.float64)
    changed = False
    for w in windows:
        p = w.path
        window = p.window_end - p.window_start
        measured.append(window)
        if p.sink < 0:
            predicted.append(window)
            continue
        edit = reduce(lambda a, b: a + b, (w.edit_of(e) for e in edits), GraphEdit())
        changed |= not edit.empty
        replayed = w.unedited() if edit.empty else w.replay.edited(p.sink, edit + w.drain(), p.edges)
        shortened = int(g.node_ts[p.sink]) - replayed.end_ns
        predicted.append(window - shortened)
        # An added edge's time goes to the part of the graph edge it stands for (work moved off
        # the timelines: ``GraphEdit.add_like``); the drain's edges weigh nothing.
        added = replayed.edges - g.src.size
        like = np.r_[edit.like, -1]
        as_edge = np.where(added < 0, replayed.edges, like[np.clip(added, 0, like.size - 1)])
        real = as_edge >= 0
        e = as_edge[real]
        part = model.edge_parts.of(e)
        totals = _add(totals, np.bincount(part, weights=replayed.dur_ns[real], minlength=len(rules.parts)).astype(
            np.float64))
        uncovered = window - shortened - int(replayed.dur_ns.sum())
        totals = _add(totals, _one(rules.part(PartName.UNEXPLAINED, PartKind.UNEXPLAINED), uncovered))
    n = max(len(measured), 1)
    parts = {rules.parts[i].name: round(float(t) / n) for i, t in enumerate(totals.tolist()) if t > 0}
    avoidable = [(ns, name) for name, ns in parts.items() if not _essential(model, name)]
    best = max(avoidable) if avoidable else None
    return Prediction(label=" + ".join(e.label for e in edits), measured_ns=round(sum(measured) / n),
                      predicted_ns=round(sum(predicted) / n), changed=changed,
                      next_bottleneck=best[1] if best else None, next_bottleneck_ns=best[0] if best else 0,
                      parts=dict(sorted(parts.items(), key=lambda kv: (-kv[1], kv[0]))))


def what_if(model: StepModel, account: AccountResult, edits: Sequence[Fix] | None = None,
            combined: int = 3) -> WhatIfResult:
    """Each edit alone (default: ``suggested_edits``), then the ``combined`` that save most,
    together."""
    chosen: list[Fix] = list(edits) if edits is not None else list(suggested_edits(model, account))
    windows = window_edges(model)
    alone = [predict(model, [e], windows) for e in chosen]
    best = sorted((i for i, p in enumerate(alone) if p.changed and p.saved_ns > 0),
                  key=lambda i: -alone[i].saved_ns)[:combined]
    together = [predict(model, [chosen[i] for i in sorted(best)], windows)] if len(best) > 1 else []
    rows = [(p, False) for p in alone] + [(p, True) for p in together]
    table = pl.DataFrame([{
        WhatIfCol.EDIT: p.label, WhatIfCol.COMBINED: both, WhatIfCol.MEASURED: p.measured_ns,
        WhatIfCol.PREDICTED: p.predicted_ns, WhatIfCol.SAVED: p.saved_ns,
        WhatIfCol.SAVED_SHARE: p.saved_ns / p.measured_ns if p.measured_ns else 0.0, WhatIfCol.CHANGED: p.changed,
        WhatIfCol.NEXT: p.next_bottleneck, WhatIfCol.NEXT_NS: p.next_bottleneck_ns,
    } for p, both in rows], schema=WHAT_IF_SCHEMA)
    return WhatIfResult(table=table, predictions=tuple(p for p, _ in rows))


def suggested_edits(model: StepModel, account: AccountResult, top: int = 6) -> list[Fix]:
    """The edit that addresses each of the largest avoidable parts, largest first: data loading
    -> workers prefetch; compilation -> no compile in the step; a blocking call -> no wait under
    its op; a host transfer -> pinned, non_blocking copies; exposed communication -> hidden under
    compute; optimizer -> multi-tensor; other host work -> that work leaves the step. Activation
    recompute, where the trace has any, is always tried."""
    out: dict[str, Fix] = {}
    for part, kind in account.parts.filter(~pl.col(AccountCol.ESSENTIAL)).select(
            AccountCol.PART, AccountCol.KIND).iter_rows():
        edit = _edit_for(part, kind)
        if edit is not None and edit.label not in out:
            out[edit.label] = edit
        if len(out) >= top:
            break
    if (model.rules.ctx.recompute >= 0).any():
        out.setdefault(RemoveRecompute().label, RemoveRecompute())
    return list(out.values())


def fix_for_part(part: str, kind: str, essential: bool) -> Fix | None:
    """The fix a finding that explains this part predicts: the edit ``suggested_edits`` tries for
    it, else (launch overhead, waits, idle, other host time) the part's work leaving the step.
    None for essential work and ``unexplained``: no edit says what would change there."""
    if not avoidable(part, kind, essential):
        return None
    return _edit_for(part, kind) or RemovePart(part)


def part_gains(model: StepModel, parts: Sequence[tuple[str, str]]) -> pl.DataFrame:
    """Per replayed step (``window_edges``) and part (name, kind): its time on the step's path, the
    slices it holds, and the step time its fix (``fix_for_part``) saves in that step alone, the
    replay that ``predict`` averages over the same steps (PART_GAINS_SCHEMA; gain null where no fix applies)."""
    rules, g = model.rules, model.graph
    names = [p.name for p in rules.parts]
    rows = []
    for w in window_edges(model):  # the steps ``predict`` replays, so both give one number
        p = w.path
        e = p.edges
        part, _, owner = rules.of_edges(g.kind[e].astype(np.int64), g.attr[e], rules.category[e], g.src[e], g.dst[e])
        dur = g.node_ts[g.dst[e]] - np.maximum(g.node_ts[g.src[e]], p.window_start)
        windows = [w]
        for name, kind in parts:
            mine = part == names.index(name) if name in names else np.zeros(e.size, dtype=bool)
            fix = fix_for_part(name, kind, essential=False)
            saved = predict(model, [fix], windows).saved_ns if fix is not None and p.sink >= 0 else None
            rows.append((p.step, name, kind, int(np.unique(owner[mine & (owner >= 0)]).size), int(dur[mine].sum()),
                         saved))
    return pl.DataFrame(rows, schema=PART_GAINS_SCHEMA, orient="row")


#: ``part_gains``: step (the account's window index), part, kind, count (slices), on_path_ns, gain_ns.
PART_GAINS_SCHEMA: Final = pl.Schema({
    AccountCol.STEP: pl.Int64(), AccountCol.PART: pl.String(), AccountCol.KIND: pl.String(),
    PathCol.COUNT: pl.Int64(), PathCol.ON_PATH: pl.Int64(), PathCol.GAIN: pl.Int64()})


def _edit_for(part: str, kind: str) -> Fix | None:
    if kind == PartKind.DATA_LOADING:
        return PrefetchData()
    if kind == PartKind.COMPILATION:
        return RemoveCompile()
    if kind == PartKind.SYNC and part not in (PartName.QUEUE_FULL, PartName.STREAM_WAIT):
        return DropSync(part.split(" under ", 1)[1] if " under " in part else None)
    if kind == PartKind.COPIES:
        direction = part.removeprefix("copies: ").split(" ", 1)[0]
        return OverlapCopies(direction) if direction in ("HtoD", "DtoH") else None
    if kind == PartKind.COMMUNICATION:
        return HideCollective(part.removeprefix("communication: "))
    if part == PartName.OPTIMIZER:
        return MultiTensorOptimizer()
    if kind == PartKind.HOST and part.startswith(PartName.READ_PREFIX):
        # The ops a scalar read forces go with the Python that calls them (calibrated on the
        # .item() and logging pairs: the ops alone gave about half the measured saving).
        return RemoveCode(part)
    if kind == PartKind.HOST and part.startswith("host: "):
        return RemovePart(part)
    return None


def _essential(model: StepModel, name: str) -> bool:
    found = next((p for p in model.rules.parts if p.name == name), None)
    return found is None or not avoidable(found.name, found.kind, found.essential)


def _add(a: F64, b: F64) -> F64:
    size = max(a.size, b.size)
    total: F64 = np.pad(a, (0, size - a.size)).astype(np.float64) + np.pad(b, (0, size - b.size))
    return total


def _one(index: int, value: int) -> F64:
    out = np.zeros(index + 1, dtype=np.float64)
    out[index] = value
    return out
