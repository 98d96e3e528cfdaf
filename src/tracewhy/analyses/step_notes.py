"""Notes about a trace's steps that concern its other events: kernels inside the steps that no
launch call in the trace accounts for."""

from __future__ import annotations

import polars as pl

from tracewhy.model.schema import Col, Kind


def unlinked_kernels_note(s: pl.DataFrame, lo: int, hi: int) -> str | None:
    """Say how many kernels ran inside the steps with no launch call in the trace: they count in
    no step's GPU work (``gaps`` and ``overlap``, which go by time, do include them)."""
    k = s.filter((pl.col(Col.KIND) == Kind.KERNEL.value) & pl.col(Col.LAUNCH).is_null()
                 & (pl.col(Col.TS) >= lo) & (pl.col(Col.TS) < hi))
    if k.height == 0:
        return None
    total = int(k.get_column(Col.DUR).sum())
    return (f"{k.height} kernels ({total / 1e6:.3f} ms) ran inside the steps with no launch call in the "
            "trace (launched before the capture began, or the runtime events were not recorded): they "
            "count in no step's GPU work")
