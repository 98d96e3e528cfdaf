"""The ledger of what was live at a memory peak, inferred from a Kineto trace's ``[memory]`` events:
what each allocating stack held (an optimizer step, backward, a DataLoader fetch, a collective's
buckets, a KV cache) and the rules (``LEDGER_RULES``) that file each live block under one category.
``analyses/memory.py`` measures the peak; this module says what it was made of.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.host_activity import Flag, HostIndex
from tracewhy.model.memory_timeline import LedgerCategory
from tracewhy.model.schema import KIND_CODE, Col, Kind, MemEventCol
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

#: What ``DeviceMemory.ledger`` inference rests on, in the order the rules are tried (first match
#: wins); a block is "short-lived" when it is freed before the outermost op that allocated it ends.
LEDGER_RULES: Final = (
    ("comm_buckets", "allocated under a collective, DDP's Reducer or FSDP's flat parameters"),
    ("kv_cache", "allocated under a frame or op naming a KV cache / past_key_values"),
    ("inputs", "allocated under a DataLoader fetch"),
    ("gradients", "allocated in backward (or under AccumulateGrad) and not freed in backward"),
    ("optimizer_state", "allocated inside Optimizer.step and still live after that step ends"),
    ("temporaries", "allocated inside Optimizer.step and freed within it, in backward and freed in backward, "
                    "or short-lived"),
    ("parameters", "allocated before the first step and never freed"),
    ("activations", "allocated in forward and live beyond its op (freed in backward, or never)"),
    ("preexisting", "allocated before the trace began (the peak's bytes that no event in the trace explains)"),
)
_BACKWARD = re.compile(rf"^autograd::engine::evaluate_function|{api_names.BACKWARD_NODE}|^backward$", re.IGNORECASE)
_ACCUMULATE_GRAD = re.compile(r"AccumulateGrad")
_COMM_BUCKET = re.compile(r"Reducer|flat_?param|FlatParam")
_KV_CACHE = re.compile(r"kv_?cache|past_key_values|KVCache", re.IGNORECASE)

class AllocationContext(msgspec.Struct, frozen=True):
    """Per memory event (rows of the sorted events table): what the allocating stack held."""

    innermost: I64  # HostIndex row, -1 when no slice is open
    outermost_op: I64  # slice id of the outermost CPU op, -1 if none
    scope_end: I64  # end of that op (ns); -1 without one
    optimizer_end: I64  # end of the outermost optimizer slice on the stack; -1 without one
    bits: dict[str, B]


def allocation_contexts(trace: Trace, index: HostIndex, ev: pl.DataFrame) -> AllocationContext:
    """Walk each event's stack once, up from its innermost slice: the outermost CPU op and the
    end of it, the outermost optimizer slice's end, and which ledger patterns the stack holds."""
    n = ev.height
    inner = np.full(n, -1, dtype=np.int64)
    pid, tid, ts = (ev.get_column(c).to_numpy() for c in (MemEventCol.PID, MemEventCol.TID, MemEventCol.TS))
    threads, which = np.unique(np.stack([pid, tid], axis=1), axis=0, return_inverse=True)
    for i, (p, t) in enumerate(threads):
        rows = np.flatnonzero(which.ravel() == i)
        inner[rows] = index.innermost(int(p), int(t), ts[rows])
    names = trace.slices.get_column(Col.NAME).gather(index.ids)
    unique = [u for u in names.unique().to_list() if u is not None]

    def matching(pattern: re.Pattern[str]) -> B:
        hits = [u for u in unique if pattern.search(u)]
        return names.is_in(hits).to_numpy() if hits else np.zeros(index.ids.size, dtype=bool)

    own = {
        "backward": matching(_BACKWARD),
        "accumulate_grad": matching(_ACCUMULATE_GRAD),
        "comm": matching(_COMM_BUCKET) | index.self_flag[Flag.COMM],
        "kv_cache": matching(_KV_CACHE),
        "dataloader": index.self_flag[Flag.DATALOADER],
        "optimizer": index.self_flag[Flag.OPTIMIZER],
    }
    is_op = index.kind_code == KIND_CODE[Kind.CPU_OP.value]
    bits = {k: np.zeros(n, dtype=bool) for k in own}
    outer_op = np.full(n, -1, dtype=np.int64)
    scope_end = np.full(n, -1, dtype=np.int64)
    opt_end = np.full(n, -1, dtype=np.int64)
    todo = np.flatnonzero(inner >= 0)
    cur = inner[todo]
    while todo.size:
        for k, flags in own.items():
            bits[k][todo] |= flags[cur]
        op_here = is_op[cur]
        outer_op[todo[op_here]] = index.ids[cur[op_here]]
        scope_end[todo[op_here]] = index.end[cur[op_here]]
        opt_here = own["optimizer"][cur]
        opt_end[todo[opt_here]] = index.end[cur[opt_here]]
        cur = index.parent[cur]
        keep = cur >= 0
        todo, cur = todo[keep], cur[keep]
    return AllocationContext(inner, outer_op, scope_end, opt_end, bits)


def live_at(ev: pl.DataFrame, at: int) -> pl.DataFrame | None:
    """The allocations live after row ``at`` of ``ev``: each allocation pairs with the next event
    at its address, and one with no free up to ``at`` is live there (``_free_ts``: when it was
    freed later, null if never). None for events without addresses (PyTorch < 1.10): they
    cannot be paired."""
    if ev.get_column(MemEventCol.ADDR).null_count():
        return None
    paired = (
        ev.with_columns(pl.int_range(pl.len()).alias("_row"))
        .sort(MemEventCol.ADDR, "_row")
        .with_columns(pl.col("_row").shift(-1).over(MemEventCol.ADDR).alias("_next_row"),
                      pl.col(MemEventCol.BYTES).shift(-1).over(MemEventCol.ADDR).alias("_next_bytes"),
                      pl.col(MemEventCol.TS).shift(-1).over(MemEventCol.ADDR).alias("_free_ts"),
                      pl.col("_backward").shift(-1).over(MemEventCol.ADDR).alias("_freed_in_backward"))
        .filter(pl.col(MemEventCol.BYTES) > 0)
        .with_columns(pl.when(pl.col("_next_bytes") < 0).then(pl.col("_next_row")).alias("_free_row"))
        .with_columns(pl.when(pl.col("_next_bytes") < 0).then(pl.col("_free_ts")).alias("_free_ts"))
    )
    return paired.filter((pl.col("_row") <= at) & (pl.col("_free_row").is_null() | (pl.col("_free_row") > at)))


def ledger_at_peak(live: pl.DataFrame | None, step_starts: I64, peak: int) -> dict[str, int]:
    """Bytes live at the peak (``live``: ``live_at`` the peak's row) by LEDGER_RULES; all of the
    peak is unknown where the events cannot be paired (``live`` None)."""
    if live is None:
        return {LedgerCategory.UNKNOWN.value: peak}
    first_step = int(step_starts[0]) if step_starts.size else None
    freed = pl.col("_free_ts").is_not_null()
    short = freed & (pl.col("_free_ts") <= pl.col("_scope_end"))
    before_steps = pl.lit(False) if first_step is None else pl.col(MemEventCol.TS) < first_step
    category = (
        pl.when(pl.col("_comm")).then(pl.lit(LedgerCategory.COMM_BUCKETS.value))
        .when(pl.col("_kv_cache")).then(pl.lit(LedgerCategory.KV_CACHE.value))
        .when(pl.col("_dataloader")).then(pl.lit(LedgerCategory.INPUTS.value))
        .when((pl.col("_accumulate_grad") | pl.col("_backward")) & ~short & ~(freed & pl.col("_freed_in_backward")))
        .then(pl.lit(LedgerCategory.GRADIENTS.value))
        .when(pl.col("_optimizer") & (~freed | (pl.col("_free_ts") > pl.col("_opt_end"))))
        .then(pl.lit(LedgerCategory.OPTIMIZER_STATE.value))
        .when(pl.col("_optimizer") | pl.col("_backward") | short).then(pl.lit(LedgerCategory.TEMPORARIES.value))
        .when(before_steps & ~freed).then(pl.lit(LedgerCategory.PARAMETERS.value))
        .otherwise(pl.lit(LedgerCategory.ACTIVATIONS.value))
    )
    sums = live.group_by(category.alias("_cat")).agg(pl.col(MemEventCol.BYTES).sum())
    ledger = {c.value: 0 for c in LedgerCategory if c is not LedgerCategory.AUTOGRAD_DETAIL
              and c is not LedgerCategory.UNKNOWN}
    for cat, nbytes in sums.iter_rows():
        ledger[str(cat)] = int(nbytes)
    explained = sum(ledger.values())
    ledger[LedgerCategory.PREEXISTING.value] = max(peak - explained, 0)
    return ledger


class LiveSiteCol:
    """Columns of ``DeviceMemory.live_sites``: the blocks live at the peak by allocation site,
    most bytes first; their bytes add up to the peak."""

    OP: Final = "op"  # outermost CPU op on the allocating thread
    FRAME: Final = "frame"  # innermost user Python frame ("file:line function"); null without with_stack
    #: The block sizes' power-of-two class (the smallest power of two not below the size): a
    #: site's blocks of one shape stay in one row when a trace names no Python frame.
    SIZE_CLASS: Final = "size_class_bytes"
    BLOCKS: Final = "blocks"
    BYTES: Final = "bytes"


LIVE_SITES_SCHEMA: Final = pl.Schema({LiveSiteCol.OP: pl.String(), LiveSiteCol.FRAME: pl.String(),
                                      LiveSiteCol.SIZE_CLASS: pl.Int64(), LiveSiteCol.BLOCKS: pl.Int64(),
                                      LiveSiteCol.BYTES: pl.Int64()})
#: The row of ``live_sites`` for the peak's bytes no event in the trace explains.
BEFORE_TRACE: Final = "(allocated before the trace)"
#: The row of ``live_sites`` for a peak whose events carry no addresses (PyTorch < 1.10): no
#: allocation can be paired with its free, so none is known to be live at the peak.
UNPAIRED: Final = "(events without addresses: no site known)"


def size_class(nbytes: pl.Expr) -> pl.Expr:
    """The smallest power of two not below each size (1 for sizes of 0 or 1)."""
    return (pl.lit(2, dtype=pl.Int64) ** nbytes.clip(lower_bound=1).log(2).ceil().cast(pl.Int64)).cast(pl.Int64)


def live_sites(ev: pl.DataFrame, live: pl.DataFrame | None, peak: int, *, op: str, frame: str) -> pl.DataFrame:
    """The bytes live at the peak (``live``: ``live_at`` the peak's row of ``ev``) by site: the
    ``op`` and ``frame`` columns of each live block's allocation and its size class; the bytes no
    event explains (allocated before the trace: ``BEFORE_TRACE``; or all of them where events
    cannot be paired, ``live`` None: ``UNPAIRED``) are one row, so that the rows add up to ``peak``."""
    rest_label = BEFORE_TRACE if live is not None else UNPAIRED
    live = live if live is not None else ev.clear()
    b = pl.col(MemEventCol.BYTES)
    sites = (
        live.group_by(op, frame, size_class(b).alias(LiveSiteCol.SIZE_CLASS))
        .agg(pl.len().cast(pl.Int64).alias(LiveSiteCol.BLOCKS), b.sum().alias(LiveSiteCol.BYTES))
        .select(pl.col(op).alias(LiveSiteCol.OP), pl.col(frame).alias(LiveSiteCol.FRAME), LiveSiteCol.SIZE_CLASS,
                LiveSiteCol.BLOCKS, LiveSiteCol.BYTES)
        .cast(LIVE_SITES_SCHEMA)
    )
    rest = peak - int(sites.get_column(LiveSiteCol.BYTES).sum())
    if rest > 0:
        sites = pl.concat([sites, pl.DataFrame({LiveSiteCol.OP: [rest_label], LiveSiteCol.FRAME: [None],
                                                LiveSiteCol.SIZE_CLASS: [None], LiveSiteCol.BLOCKS: [None],
                                                LiveSiteCol.BYTES: [rest]}, schema=LIVE_SITES_SCHEMA)])
    return sites.sort([LiveSiteCol.BYTES, LiveSiteCol.OP, LiveSiteCol.FRAME, LiveSiteCol.SIZE_CLASS],
                      descending=[True, False, False, False], nulls_last=True)
