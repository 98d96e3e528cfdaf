"""The GPU activities the overlap analysis measures, each in one category: a kernel of the
communication family (families.classify_kernels: launched under a collective op, known by its
args or its name, on a communication-only stream, from NCCL, RCCL, NVSHMEM, DeepEP, symmetric-memory or custom
all-reduce, or by name) is communication, any other kernel is compute, memcpy and memset rows
are copies and memsets; communication rows carry their collective's label.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from tracewhy.analyses.collectives import CollectivesResult, short_kernel_name
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, Kind
from tracewhy.model.trace import Trace

COMPUTE: Final = "compute"
COMMUNICATION: Final = "communication"
COPY: Final = "copy"
MEMSET: Final = "memset"
CATEGORIES: Final = (COMPUTE, COMMUNICATION, COPY, MEMSET)


class ActivityCol:
    """Columns of the ``activities`` table besides the model's id, device, stream and ts_ns."""

    CATEGORY: Final = "category"  # one of CATEGORIES
    END: Final = "_end"  # ts_ns + dur_ns
    COLLECTIVE: Final = "collective"  # the collective's label (null but for communication)


def activities(trace: Trace, coll: CollectivesResult) -> pl.DataFrame:
    """GPU activities with their category and, for communication, the collective's label.

    Columns: id, device, stream, category, ts_ns, _end, collective (null but for communication)."""
    g = trace.of_kind(*GPU_ACTIVITY_KINDS).select(
        Col.ID, Col.DEVICE, Col.STREAM, Col.KIND, Col.NAME, Col.TS,
        (pl.col(Col.TS) + pl.col(Col.DUR)).alias(ActivityCol.END),
    )
    comm_ids = coll.kernels.get_column(Col.ID)  # every communication kernel, in some call
    labels = coll.kernels.join(coll.table.select("call", "label"), on="call").select(Col.ID, "label")
    category = (
        pl.when(pl.col(Col.KIND) == Kind.MEMCPY.value).then(pl.lit(COPY))
        .when(pl.col(Col.KIND) == Kind.MEMSET.value).then(pl.lit(MEMSET))
        .when(pl.col(Col.ID).is_in(comm_ids.implode())).then(pl.lit(COMMUNICATION))
        .otherwise(pl.lit(COMPUTE))
    )
    # Each distinct name shortened once (per row, 1.2 s for the 1.3 M activities of a 600 MB nsys
    # export). Only communication rows are read by collective, so only they keep a label: the
    # names stay categorical, and the other rows' label is null.
    names = g.get_column(Col.NAME).unique().drop_nulls()
    short = pl.Series([short_kernel_name(n) for n in names.cast(pl.String).to_list()], dtype=pl.String)
    return (
        g.with_columns(category.alias(ActivityCol.CATEGORY), pl.col(Col.STREAM).fill_null(-1))
        .join(labels, on=Col.ID, how="left")
        .with_columns(pl.when(pl.col(ActivityCol.CATEGORY) == COMMUNICATION).then(pl.col("label").fill_null(
            pl.col(Col.NAME).replace_strict(names, short, default=None, return_dtype=pl.String)))
            .alias(ActivityCol.COLLECTIVE))
        .select(Col.ID, Col.DEVICE, Col.STREAM, ActivityCol.CATEGORY, Col.TS, ActivityCol.END, ActivityCol.COLLECTIVE)
    )
