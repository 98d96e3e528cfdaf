"""Warnings for Kineto files that read cleanly into wrong figures: launches that share one
correlation id (their GPU work cannot be told apart), and GPU work linked to a launch it
starts long before or long after (a clock or id that is not what the profiler wrote).
Nothing is changed: the figures stay what the file says, and the user is told not to trust
them."""

from __future__ import annotations

from typing import Final

import polars as pl

from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, Kind

#: GPU work starting this long before the call that launched it: no clock skew between host and
#: device that CUPTI corrects reaches a second (a few µs on real traces), so the link or the
#: clock is wrong.
EARLY_NS: Final = 1_000_000_000
#: GPU work starting this long after its launch: a launch queue holds work for seconds at most
#: (a stalled stream); an hour is a timestamp that is not one.
LATE_NS: Final = 3_600 * 1_000_000_000
_LAUNCH_KINDS: Final = (Kind.RUNTIME.value, Kind.DRIVER.value)


def link_warnings(slices: pl.DataFrame) -> list[str]:
    """One warning per kind of implausible link in the linked slices table."""
    out: list[str] = []
    # The columns each test reads are taken before the rows: an eager filter copies every column
    # it is given (271 MB trace, 617k slices: 25 against 15 ms, on the reader's serial tail).
    launches = slices.select(Col.KIND, Col.CORRELATION).filter(
        pl.col(Col.KIND).is_in(_LAUNCH_KINDS) & pl.col(Col.CORRELATION).is_not_null())
    shared = launches.filter(pl.col(Col.CORRELATION).is_duplicated())
    if shared.height:
        ids = shared.get_column(Col.CORRELATION).n_unique()
        out.append(f"{shared.height} runtime launches share {ids} correlation id(s) with other launches: their GPU "
                   "work cannot be told apart, so GPU time per operator and launch delays are not attributed")
    gpu = slices.select(Col.KIND, Col.TS, Col.LAUNCH).filter(
        pl.col(Col.KIND).is_in([k.value for k in GPU_ACTIVITY_KINDS]) & pl.col(Col.LAUNCH).is_not_null())
    if gpu.height:
        lead = gpu.get_column(Col.TS) - slices.get_column(Col.TS).gather(gpu.get_column(Col.LAUNCH))
        early, late = int((lead < -EARLY_NS).sum()), int((lead > LATE_NS).sum())
        if early:
            out.append(f"{early} GPU activities start more than {EARLY_NS // 10**9} s before the call that launched "
                       f"them (up to {-int(lead.min() or 0) / 1e9:.3g} s): their timestamps or links are wrong, and "
                       "so are gaps and overlaps that involve them")
        if late:
            out.append(f"{late} GPU activities start more than {LATE_NS // 3_600_000_000_000} h after the call that "
                       f"launched them (up to {int(lead.max() or 0) / 1e9:.3g} s): their timestamps are wrong, and "
                       "so are idle gaps that involve them")
    return out
