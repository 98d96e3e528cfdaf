"""Step-time spikes: steady steps well above the median, and what they contain that a median
step does not: allocator calls, synchronizes, collectives (``spikes``), and the ops they call
more often, the untraced time they add on the step's thread and the same ops running slower
(``spike_contents``). Compile work inside a step is measured by the compile analysis
(``analyses.compile``, its ``compile_ns`` per step)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.host_activity import Flag, HostIndex
from tracewhy.analyses.step_units import StepUnits, spread, stretches
from tracewhy.analyses.steps import StepCol, StepsResult
from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import Trace

#: A steady step this much above the steady median is a spike (the sleep and scheduler noise
#: of a healthy loop stays well under it).
SPIKE_MARGIN = 0.25
_FEATURES = ("allocator_calls", "syncs", "collectives")


@dataclass(frozen=True)
class SpikesResult:
    """``per_step``: step, steady, dur_ns and counts of allocator calls, syncs and collectives in
    the step window. ``spikes``: the steady steps above median x (1 + margin),
    with each count's excess over the steady median."""

    per_step: pl.DataFrame
    spikes: pl.DataFrame
    margin: float


def spikes(trace: Trace, steps: StepsResult, host: HostIndex, margin: float = SPIKE_MARGIN) -> SpikesResult:
    trace.require_whole()
    features = {
        "allocator_calls": host.self_flag[Flag.ALLOC],
        "syncs": host.self_flag[Flag.SYNC],
        "collectives": host.self_flag[Flag.COMM] & host.is_kind(Kind.CPU_OP),
    }
    times = {k: np.sort(host.ts[v]) for k, v in features.items()}
    rows = []
    windows = steps.table.select(StepCol.TS, StepCol.DUR, StepCol.WINDOW_END, StepCol.STEADY)
    for i, (ts, dur, wend, steady) in enumerate(windows.iter_rows()):
        counts = [int(np.searchsorted(times[k], wend) - np.searchsorted(times[k], ts)) for k in _FEATURES]
        rows.append((i, steady, dur, *counts))
    per_step = pl.DataFrame(rows, orient="row", schema={
        "step": pl.Int64, StepCol.STEADY: pl.Boolean, "dur_ns": pl.Int64, **{k: pl.Int64 for k in _FEATURES}})
    steady_steps = per_step.filter(pl.col(StepCol.STEADY))
    if steady_steps.height < 3:
        return SpikesResult(per_step=per_step, spikes=per_step.clear(), margin=margin)
    median = float(steady_steps.get_column("dur_ns").median())  # type: ignore[arg-type]
    base = {k: float(steady_steps.get_column(k).median()) for k in _FEATURES}  # type: ignore[arg-type]
    found = steady_steps.filter(pl.col("dur_ns") > median * (1 + margin)).with_columns(
        (pl.col("dur_ns") - median).alias("excess_ns"),
        *[(pl.col(k) - base[k]).alias(f"extra_{k}") for k in _FEATURES],
    )
    return SpikesResult(per_step=per_step, spikes=found, margin=margin)


class SpikeCause(msgspec.Struct, frozen=True):
    """One thing spike steps hold beyond the other steady steps: an op or annotation called more
    often (``name``), or time outside every op and annotation on the step's thread (``name``
    None: Python, I/O or a wait the profiler does not record). ``steps``: the spike steps that
    hold it; ``calls`` and ``ns``: its mean over those steps less its mean over the other steady
    steps (``base_calls``: their mean calls). Untraced time: ``after``, the op or annotation its
    longest stretch follows in most of those steps (None: it opens the step), and ``at_end``, that
    stretch runs to the step's end."""

    name: str | None
    steps: tuple[int, ...]
    calls: float
    ns: float
    base_calls: float = 0.0  # the other steady steps' mean calls
    after: str | None = None
    at_end: bool = False

    @property
    def period(self) -> int | None:
        """k when the steps fall every k-th step (three or more, evenly spaced, k >= 2)."""
        diffs = np.diff(self.steps)
        return int(diffs[0]) if len(self.steps) >= 3 and diffs[0] >= 2 and (diffs == diffs[0]).all() else None


class SpikeContents(msgspec.Struct, frozen=True):
    """What the spike steps hold beyond the other steady steps. ``more``: the outermost ops,
    annotations and runtime calls (none above them but the step's own marker) that some spikes
    call more often,
    largest extra time first; ``untraced``: the extra time outside every op on the step's thread,
    in the spikes where it is at least ``UNTRACED_MIN_SHARE`` of their extra time (None where
    none); ``slower``: (name, extra ns, a mean over every spike) of those on the step's thread
    called as often as in the other steps (the same work, slower), largest first."""

    more: tuple[SpikeCause, ...]
    untraced: SpikeCause | None
    slower: tuple[tuple[str, float], ...]


#: A spike holds untraced time as a cause when that time's growth is at least this share of the
#: spike's own extra time (over the other steady steps' mean).
UNTRACED_MIN_SHARE: Final = 0.25


def spike_contents(trace: Trace, steps: StepsResult, host: HostIndex, spike_steps: list[int],
                   base_steps: list[int]) -> SpikeContents | None:
    """The contents of ``spike_steps`` against ``base_steps`` (indexes into ``steps.table``: the
    steady steps that are no spike; at most ``step_units.MAX_STEPS`` of each, spread), over each
    step's own span (as recorded); None without either. Means on both sides: a step's causes then
    add up to its extra time."""
    table = steps.table
    base = spread(base_steps)
    spiked = spread(spike_steps)
    if not base or not spiked:
        return None
    starts = table.get_column(StepCol.TS).to_numpy()
    ends = starts + table.get_column(StepCol.DUR).to_numpy()
    units = StepUnits(host)
    names = trace.slices.get_column(Col.NAME)
    thread = units.thread(int(starts[base[0]]), int(ends[base[0]]))
    calls: dict[int, Counter[str]] = {}
    spent: dict[int, Counter[str]] = {}
    spent_here: dict[int, Counter[str]] = {}  # on the step's thread
    untraced: dict[int, float] = {}
    gaps: dict[int, tuple[str | None, bool]] = {}
    for i in base + spiked:
        lo, hi = int(starts[i]), int(ends[i])
        rows = units.outermost(lo, hi)
        step_names = names.gather(host.ids[rows]).cast(pl.String).to_list()
        here = ((rows >= thread[0]) & (rows < thread[1])) if thread else np.zeros(rows.size, dtype=bool)
        calls[i], spent[i], spent_here[i] = Counter(step_names), Counter(), Counter()
        durations = (np.minimum(host.end[rows], hi) - np.maximum(host.ts[rows], lo)).tolist()
        for n, d, on in zip(step_names, durations, here.tolist(), strict=True):
            spent[i][n] += d
            if on:
                spent_here[i][n] += d
        untraced[i], gaps[i] = _untraced(host, units.on_thread(rows, thread), names, lo, hi)

    def mean(values: dict[int, float] | dict[int, int], of: list[int]) -> float:
        return float(np.mean([values[i] for i in of])) if of else 0.0

    more, same = [], []
    for n in sorted(set().union(*(spent[i] for i in spiked))):
        base_calls = float(np.mean([calls[i][n] for i in base]))
        holders = [i for i in spiked if calls[i][n] - base_calls >= 0.5]
        if holders:
            ns = float(np.mean([spent[i][n] for i in holders]) - np.mean([spent[i][n] for i in base]))
            if ns > 0:
                more.append(SpikeCause(n, tuple(holders), mean({i: calls[i][n] for i in holders}, holders) - base_calls,
                                       ns, base_calls))
        elif abs(float(np.mean([calls[i][n] for i in spiked])) - base_calls) < 0.5:
            extra = float(np.mean([spent_here[i][n] for i in spiked]) - np.mean([spent_here[i][n] for i in base]))
            if extra > 0:
                same.append((n, extra))
    more.sort(key=lambda c: -c.ns)
    durations = dict(zip(range(len(starts)), (ends - starts).tolist(), strict=True))
    base_dur, base_untraced = mean(durations, base), mean(untraced, base)
    holders = [i for i in spiked
               if untraced[i] - base_untraced >= UNTRACED_MIN_SHARE * max(durations[i] - base_dur, 1)]
    hole = None
    if holders and thread is not None:
        after, at_end = Counter(gaps[i] for i in holders).most_common(1)[0][0]
        hole = SpikeCause(None, tuple(holders), 0.0, mean(untraced, holders) - base_untraced, after=after,
                          at_end=at_end)
    return SpikeContents(tuple(more), hole, tuple(sorted(same, key=lambda g: -g[1])))


def _untraced(host: HostIndex, rows: npt.NDArray[np.int64], names: pl.Series, lo: int,
              hi: int) -> tuple[float, tuple[str | None, bool]]:
    """Time in [lo, hi) outside these rows (one thread's outermost ops, in start order), and where
    its longest stretch lies: after which of them (None: from ``lo``), and whether it reaches ``hi``."""
    gaps, before = stretches(host, rows, lo, hi)
    longest = int(np.argmax(gaps))
    after = None if before[longest] < 0 else str(names[int(host.ids[before[longest]])])
    return float(gaps.sum()), (after, longest == gaps.size - 1 and rows.size > 0)
