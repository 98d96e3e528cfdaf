"""Memory copies: volume, time and achieved bandwidth per direction, pageable versus pinned,
and copies that block the host."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.name_codes import distinct_names
from tracewhy.model.schema import LAUNCH_KINDS, Col, CopyAttrCol, Kind
from tracewhy.model.trace import Trace


@dataclass(frozen=True)
class CopiesResult:
    """``by_direction``: copy_kind, src_mem, dst_mem, count, bytes, time_ns, gb_per_s.
    ``pageable``: count and bytes of copies from or to pageable host memory (staged through a
    bounce buffer: slower, and an async copy from pageable memory does not overlap the host).
    ``sync_copy_calls``: synchronous copy API calls (cudaMemcpy without Async)."""

    by_direction: pl.DataFrame
    pageable_count: int
    pageable_bytes: int
    sync_copy_calls: int
    sync_copy_ns: int


def copies(trace: Trace) -> CopiesResult:
    c = trace.of_kind(Kind.MEMCPY).select(Col.ID, Col.DUR).join(trace.copy_attrs, on=CopyAttrCol.ID, how="left")
    by = (
        c.group_by(CopyAttrCol.COPY_KIND, CopyAttrCol.SRC_MEM, CopyAttrCol.DST_MEM)
        .agg(pl.len().cast(pl.Int64).alias("count"), pl.col(CopyAttrCol.BYTES).sum().alias("bytes"),
             pl.col(Col.DUR).sum().alias("time_ns"))
        .with_columns((pl.col("bytes") / pl.col("time_ns").clip(lower_bound=1)).alias("gb_per_s"))
        .with_columns(pl.col(c).cast(pl.String) for c in (CopyAttrCol.COPY_KIND, CopyAttrCol.SRC_MEM,
                                                          CopyAttrCol.DST_MEM))
        .sort("time_ns", descending=True)
    )
    pageable = c.filter((pl.col(CopyAttrCol.SRC_MEM) == "Pageable") | (pl.col(CopyAttrCol.DST_MEM) == "Pageable"))
    calls = trace.kind_columns(LAUNCH_KINDS, Col.NAME, Col.DUR)  # (the distinct names become strings)
    sync_names = [n for n in distinct_names(calls.get_column(Col.NAME))[1]
                  if api_names.is_sync_call(n) and "Memcpy" in n]
    sync_calls = calls.filter(pl.col(Col.NAME).is_in(sync_names))
    return CopiesResult(
        by_direction=by,
        pageable_count=pageable.height,
        pageable_bytes=int(pageable.get_column(CopyAttrCol.BYTES).sum() or 0),
        sync_copy_calls=sync_calls.height,
        sync_copy_ns=int(sync_calls.get_column(Col.DUR).sum() or 0),
    )
