"""GPU rows find their launch call per process (``link_slices(per_process=True)``), whatever
range the ids lie in: one packed key where pids and correlation ids fit in it, the rank of the
pair otherwise."""

from __future__ import annotations

import polars as pl
import pytest

from nsys_support import load
from tracewhy.model.linking import link_slices
from tracewhy.model.schema import Col


@pytest.mark.parametrize("shift", [2**40, -(2**40)])
def test_ids_outside_the_packed_key_link_the_same_launches(shift: int) -> None:
    """nsysai_mfu_2gpu_after repeats 311 correlation ids across its two processes."""
    slices = load("nsysai_mfu_2gpu_after").slices
    unlinked = slices.with_columns(pl.lit(None, dtype=pl.Int64).alias(c) for c in (Col.LAUNCH, Col.OP))
    again = link_slices(unlinked, per_process=True)
    assert again.get_column(Col.LAUNCH).equals(slices.get_column(Col.LAUNCH))
    shifted = link_slices(unlinked.with_columns(pl.col(Col.CORRELATION) + shift), per_process=True)
    assert shifted.get_column(Col.LAUNCH).equals(slices.get_column(Col.LAUNCH))
    assert shifted.get_column(Col.LAUNCH).drop_nulls().len() > 4000


def test_per_process_links_differ_from_links_on_the_id_alone() -> None:
    slices = load("nsysai_mfu_2gpu_after").slices
    alone = link_slices(slices, per_process=False).get_column(Col.LAUNCH)
    gpu = slices.get_column(Col.LAUNCH).is_not_null()
    launches_pid = slices.get_column(Col.PID).gather(alone.filter(gpu & alone.is_not_null()).cast(pl.Int64))
    pids = slices.get_column(Col.PID).filter(gpu & alone.is_not_null())
    # On the id alone, some GPU rows are given a call of the other process.
    assert (launches_pid != pids).sum() > 0
