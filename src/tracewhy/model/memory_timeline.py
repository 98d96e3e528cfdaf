"""PyTorch memory-timeline exports as one table of live bytes per category over time, and the
ledger categories ``tracewhy memory`` names (``readers/memory`` reads both export layouts into it)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

import polars as pl


class LedgerCategory(str, Enum):
    """What live memory is for. The first eight are the ledger ``tracewhy memory`` shows; the
    profiler's own categories map onto them (``EXPORT_CATEGORIES``)."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    INPUTS = "inputs"
    COMM_BUCKETS = "comm_buckets"
    KV_CACHE = "kv_cache"
    AUTOGRAD_DETAIL = "autograd_detail"  # the profiler's AUTOGRAD_DETAIL (autograd's own buffers)
    PREEXISTING = "preexisting"  # allocated before the trace began: what it is cannot be told
    UNKNOWN = "unknown"


#: The export's category columns in file order (``_CATEGORY_TO_COLORS`` of torch 2.0-2.13).
EXPORT_CATEGORIES: Final = (
    LedgerCategory.PARAMETERS, LedgerCategory.OPTIMIZER_STATE, LedgerCategory.INPUTS, LedgerCategory.TEMPORARIES,
    LedgerCategory.ACTIVATIONS, LedgerCategory.GRADIENTS, LedgerCategory.AUTOGRAD_DETAIL, LedgerCategory.UNKNOWN,
)


class TimelineCol:
    """Columns of ``MemoryTimeline.table``: one row per instant, bytes live per category after it."""

    TS: Final = "ts_ns"
    #: One column per category, named by its ``LedgerCategory`` value, in ``EXPORT_CATEGORIES`` order.
    CATEGORIES: Final = tuple(c.value for c in EXPORT_CATEGORIES)
    TOTAL: Final = "total_bytes"


TIMELINE_SCHEMA: Final = pl.Schema(
    {TimelineCol.TS: pl.Int64(), **{c: pl.Int64() for c in TimelineCol.CATEGORIES}, TimelineCol.TOTAL: pl.Int64()}
)


class TimelineLayout(str, Enum):
    SIZES = "sizes"  # [times, sizes]
    RAW = "raw"  # (ts, action, bytes, category) rows


@dataclass(frozen=True)
class MemoryTimeline:
    """A memory-timeline export: ``table`` has TIMELINE_SCHEMA, in time order."""

    path: str
    layout: TimelineLayout
    table: pl.DataFrame
    events: int  # rows in the file (raw) or instants (sizes)
    warnings: tuple[str, ...] = ()  # each a line naming the file: what was read but looks impossible
