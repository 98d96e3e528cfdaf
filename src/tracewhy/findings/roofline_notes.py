"""The report-wide caveats of an Nsight Compute roofline: what the reader skipped, what the SM
clock says about the capture (locked for profiling, or throttled), where the peaks came from and
how many launches have no verdict."""

from __future__ import annotations

import polars as pl

from tracewhy.analyses.roofline import MeasureCol, NcuRooflineMeasures
from tracewhy.findings import thresholds as th
from tracewhy.model.ncu import NcuCol


def ncu_notes(measures: NcuRooflineMeasures, launches: pl.DataFrame, clocks_locked: bool | None,
              unknown: int) -> tuple[str, ...]:
    """The caveats of one report: the reader's warnings, the clocks, where the peaks came from, and
    the ``unknown`` launches without a verdict."""
    notes = list(measures.warnings)
    clock_note = _clock_note(measures, launches, clocks_locked)
    if clock_note:
        notes.append(clock_note)
    source, table = measures.ceilings.source, measures.peaks
    if source == "none":
        notes.append("no peaks: the report has none and the device is not in the peak table "
                     "(pass --device NAME); percentages of peak come from ncu alone")
    elif "table" in source and table is not None:
        notes.append(f"peaks not in the report come from the {table.name} entry ({table.source})"
                     + (f"; {table.scaled_note}" if table.scaled_note else ""))
    if unknown:
        notes.append(f"{unknown} launch(es) have no throughput metrics and no verdict")
    return tuple(notes)


def _clock_note(measures: NcuRooflineMeasures, launches: pl.DataFrame, clocks_locked: bool | None) -> str | None:
    """What the SM clock of the longest launch says about the capture, if anything."""
    timed = launches.filter(pl.col(NcuCol.DUR).is_not_null())
    longest = timed.sort(NcuCol.DUR, descending=True).row(0, named=True) if timed.height else {}
    ratio, clock = longest.get(MeasureCol.CLOCK_RATIO), longest.get(MeasureCol.SM_CLOCK_HZ)
    # ncu's own record (ClockStatus), not the guess from the clock that launches["clocks_locked"]
    # falls back to.
    recorded_by_launch = measures.launches.select(NcuCol.LAUNCH, MeasureCol.CLOCKS_LOCKED_RECORDED)
    raw = recorded_by_launch.filter(pl.col(NcuCol.LAUNCH) == longest.get(NcuCol.LAUNCH, -1))
    recorded = raw.get_column(MeasureCol.CLOCKS_LOCKED_RECORDED)[0] if raw.height else None
    if ratio is not None and clock and ratio < th.LOW_CLOCK_RATIO:
        cause = {
            True: "clocks were locked for profiling (ncu's default --clock-control base)",
            False: ("ncu did not lock the clocks, so the GPU ran throttled (power or thermal limit) "
                    "or clocked down between kernels"),
            None: "clocks were locked for profiling or the GPU throttled",
        }[recorded]
        return (f"SM clock {clock / 1e9:.2f} GHz during the capture, {ratio:.0%} of the "
                f"{clock / ratio / 1e9:.2f} GHz boost: {cause}. Compute-bound kernels run up to "
                f"{1 / ratio:.1f}x faster at boost; compute peaks here are at the profiled clock.")
    if not clocks_locked:
        return None
    at = f" (SM clock {clock / 1e9:.2f} GHz, {ratio:.0%} of the maximum)" if ratio is not None and clock else ""
    what = ("clocks were locked for profiling"
            if recorded_by_launch.get_column(MeasureCol.CLOCKS_LOCKED_RECORDED).drop_nulls().len()
            else "clocks were probably locked for profiling (or the GPU throttled)")
    return (f"{what}{at}: ncu's default --clock-control base. Durations are longer than in an "
            "unlocked run, and compute peaks here are at the profiled clock.")
