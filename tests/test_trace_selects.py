"""Trace's narrow selects (``kind_columns``, ``slices_where``): the rows of a full-width filter,
only the asked columns, each in one chunk, so that ``to_numpy`` and later column additions copy
nothing (polars 2's default engine returns a filter of millions of rows in dozens of chunks)."""

from __future__ import annotations

import polars as pl
from polars.testing import assert_frame_equal

import tracewhy
from conftest import shared_trace
from nsys_support import load
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, Kind


def test_narrow_selects_are_the_full_filter_in_one_chunk() -> None:
    for t in (load("nsysai_mfu_2gpu_before"), tracewhy.load(shared_trace("hta/v100_ddp2_rank1_memprofile.json.gz"))):
        end = (pl.col(Col.TS) + pl.col(Col.DUR)).alias("_end")
        gpu = t.kind_columns(GPU_ACTIVITY_KINDS, Col.ID, Col.LAUNCH, end)
        assert gpu.height > 0 and gpu.n_chunks("all") == [1, 1, 1]
        assert_frame_equal(gpu, t.of_kind(*GPU_ACTIVITY_KINDS).select(Col.ID, Col.LAUNCH, end))
        top = (pl.col(Col.KIND) == Kind.ANNOTATION.value) & (pl.col(Col.DEPTH) == 0)
        ranges = t.slices_where(top, Col.ID, pl.col(Col.NAME).cast(pl.String))
        assert ranges.height > 0 and ranges.n_chunks("all") == [1, 1]
        assert_frame_equal(ranges, t.slices.filter(top).select(Col.ID, pl.col(Col.NAME).cast(pl.String)))
