"""The block sizes of a CUDA caching-allocator snapshot's trace entries: what
``torch.cuda.max_memory_allocated`` counts, where the entries themselves record requested bytes.

``c10/cuda/CUDACachingAllocator.cpp`` (torch 2.1-2.13) records an ``alloc`` entry with
``orig_size`` (what the caller asked for) and a ``free_*`` entry with the block's
``requested_size``, but its ``allocated_bytes`` statistic, the one ``max_memory_allocated`` reads,
counts ``block->size``: the request rounded by ``round_size`` and, where the free block it came
from was not split, the whole of that block. This module gives each entry its block's size.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.model.memory_snapshot import EventCol, Scalar, SnapshotBlockCol

I64 = npt.NDArray[np.int64]

#: ``kMinBlockSize``: every block is a multiple of 512 bytes, and at least that.
MIN_BLOCK_BYTES: Final = 512
#: ``kSmallSize``: requests up to 1 MiB come from the small pool (2 MiB segments); a large-pool
#: block is split only when more than this would remain (``should_split``).
SMALL_SIZE_BYTES: Final = 1 << 20
#: Final block states the allocator counts as allocated.
ALLOCATED_STATES: Final = ("active_allocated", "active_awaiting_free")


def round_size(requested: I64) -> I64:
    """``round_size`` of the allocator with its default settings: up to a multiple of 512 B, at least 512 B."""
    out: I64 = np.maximum(-(-requested // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES, MIN_BLOCK_BYTES).astype(np.int64)
    return out


def entry_block_bytes(events: pl.DataFrame, final_blocks: pl.DataFrame,
                      settings: dict[str, Scalar]) -> I64:
    """Per trace entry (``events`` of one device, in order), the size of the block an ``alloc`` or
    ``free_completed`` concerns; 0 for other actions. Exact for a block still allocated at the end
    (the final state gives its size) and for one cut from a segment allocated just for it (the
    split rule then decides); otherwise the request as ``round_size`` rounds it, which misses a
    large block handed out whole from a cached free block less than 1 MiB larger."""
    action = events.get_column(EventCol.ACTION).to_numpy()
    addr = events.get_column(EventCol.ADDR).fill_null(-1).to_numpy()
    size = events.get_column(EventCol.SIZE).fill_null(0).to_numpy().astype(np.int64)
    block = round_size(size)
    max_split = settings.get("max_split_size")
    split_limit = int(max_split) if isinstance(max_split, int) and max_split > 0 else None
    for i in np.flatnonzero(action == "alloc"):
        if i == 0 or action[i - 1] not in ("segment_alloc", "segment_map") or addr[i - 1] != addr[i]:
            continue
        segment, wanted = int(size[i - 1]), int(block[i])
        remaining = segment - wanted
        if action[i - 1] == "segment_map" or wanted <= SMALL_SIZE_BYTES:  # expandable or small pool
            split = remaining >= MIN_BLOCK_BYTES
        else:
            split = remaining > SMALL_SIZE_BYTES and (split_limit is None or wanted < split_limit)
        block[i] = wanted if split else segment
    _final_sizes(action, addr, size, block, final_blocks)
    _frees_as_allocated(action, addr, block)
    return np.where(np.isin(action, ("alloc", "free_completed")), block, 0).astype(np.int64)


def _final_sizes(action: npt.NDArray[np.object_], addr: I64, size: I64, block: I64, final_blocks: pl.DataFrame) -> None:
    """The last allocation at an address that the final state still holds takes that block's size."""
    held = final_blocks.filter(pl.col(SnapshotBlockCol.STATE).is_in(ALLOCATED_STATES))
    final = dict(zip(held.get_column(SnapshotBlockCol.ADDRESS).to_list(),
                     zip(held.get_column(SnapshotBlockCol.SIZE).to_list(),
                         held.get_column(SnapshotBlockCol.REQUESTED).to_list(), strict=True), strict=True))
    last: dict[int, int] = {}
    for row in np.flatnonzero(np.isin(action, ("alloc", "free_completed"))).tolist():
        last[int(addr[row])] = row
    for a, row in last.items():
        if action[row] == "alloc" and a in final and final[a][1] == size[row]:
            block[row] = final[a][0]


def _frees_as_allocated(action: npt.NDArray[np.object_], addr: I64, block: I64) -> None:
    """A completed free releases the block its allocation took (an allocation before the window
    keeps its rounded request)."""
    open_at: dict[int, int] = {}
    for i in np.flatnonzero(np.isin(action, ("alloc", "free_completed"))):
        a = int(addr[i])
        if action[i] == "alloc":
            open_at[a] = int(block[i])
        elif a in open_at:
            block[i] = open_at.pop(a)
