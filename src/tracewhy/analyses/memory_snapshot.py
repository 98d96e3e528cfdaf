"""What a CUDA allocator snapshot says: allocated and reserved bytes over the recorded window,
the peak and the stack that reached it, what was live then, fragmentation and OOMs.

The snapshot holds the final state and the history before it, so the curve is replayed backward
from the final state, as PyTorch's own viewer (``torch/cuda/_memory_viz.py`` and MemoryViz.js)
does: the bytes before an event are the bytes after it less what it changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.allocator_blocks import ALLOCATED_STATES, entry_block_bytes
from tracewhy.model.memory_snapshot import EventCol, Frame, MemorySnapshot, SegCol, SnapshotBlockCol
from tracewhy.rows import Rows

I64 = npt.NDArray[np.int64]

#: Trace actions that change allocated bytes. The allocator counts a block allocated until its
#: free completes (a free on a stream still in use waits in ``active_awaiting_free``).
ALLOC_ACTIONS: Final = {"alloc": 1, "free_completed": -1}
#: Trace actions that change reserved bytes: cudaMalloc'd segments, and expandable segments' pages.
RESERVE_ACTIONS: Final = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
NO_FRAME: Final = "(no frames recorded)"


class SnapCol:
    """Columns of ``SnapshotDevice.timeline``: allocated and reserved after each trace entry."""

    SEQ: Final = EventCol.SEQ
    ACTION: Final = EventCol.ACTION
    TIME_US: Final = EventCol.TIME_US
    ALLOCATED: Final = "allocated_bytes"  # block sizes, as torch.cuda.memory_allocated counts
    REQUESTED: Final = "requested_bytes"  # what the callers asked for
    RESERVED: Final = "reserved_bytes"


class LiveCol:
    """Columns of ``SnapshotDevice.live_at_peak``: live blocks at the peak grouped by top user frame."""

    FRAME: Final = "frame"  # "file:line function" of the first frame outside torch, or NO_FRAME
    BLOCKS: Final = "blocks"
    BYTES: Final = "bytes"
    LARGEST: Final = "largest_bytes"


LIVE_SCHEMA: Final = pl.Schema({LiveCol.FRAME: pl.String(), LiveCol.BLOCKS: pl.Int64(), LiveCol.BYTES: pl.Int64(),
                                LiveCol.LARGEST: pl.Int64()})


class OomCol:
    """Columns of ``SnapshotDevice.ooms``: one row per recorded out-of-memory error."""

    SEQ: Final = EventCol.SEQ
    TIME_US: Final = EventCol.TIME_US
    REQUESTED: Final = "requested_bytes"
    DEVICE_FREE: Final = "device_free_bytes"
    FRAME: Final = LiveCol.FRAME


OOMS_SCHEMA: Final = pl.Schema({OomCol.SEQ: pl.Int64(), OomCol.TIME_US: pl.Int64(), OomCol.REQUESTED: pl.Int64(),
                                OomCol.DEVICE_FREE: pl.Int64(), OomCol.FRAME: pl.String()})


@dataclass(frozen=True)
class SnapshotDevice:
    """One device of a snapshot. Peak values are over the recorded window; fragmentation is
    the final state's (the only moment the snapshot has segment layouts for)."""

    device: int
    events: int
    timeline: pl.DataFrame  # SnapCol
    peak_allocated_bytes: int  # block sizes, as torch.cuda.max_memory_allocated counts them
    peak_requested_bytes: int  # the peak of the bytes callers asked for (requested_bytes' peak)
    peak_reserved_bytes: int
    reserved_at_peak_bytes: int
    peak_seq: int | None  # the trace entry after which allocated peaked; None: before the window
    peak_time_us: int | None
    peak_frames: tuple[Frame, ...]
    #: The step phase of the allocation that reached the peak, from its stack (``stack_phase``).
    peak_phase: str | None
    live_at_peak: pl.DataFrame  # LIVE_SCHEMA
    final_allocated_bytes: int
    final_requested_bytes: int
    final_reserved_bytes: int
    segments: int
    expandable_segments: int
    free_in_segments_bytes: int  # inactive blocks inside reserved segments
    rounding_waste_bytes: int  # allocated blocks' size beyond what was requested
    largest_free_block_bytes: int
    ooms: pl.DataFrame  # OOMS_SCHEMA


@dataclass(frozen=True)
class SnapshotResult(Rows, rows="devices"):
    devices: tuple[SnapshotDevice, ...]
    allocator_settings: dict[str, str | int | float | bool | None]


def analyze_snapshot(snap: MemorySnapshot) -> SnapshotResult:
    devices = sorted(set(snap.segments.get_column(SegCol.DEVICE).to_list())
                     | set(snap.events.get_column(EventCol.DEVICE).to_list()))
    return SnapshotResult(tuple(_device(snap, d) for d in devices), dict(snap.allocator_settings))


def _device(snap: MemorySnapshot, device: int) -> SnapshotDevice:
    ev = snap.events.filter(pl.col(EventCol.DEVICE) == device).sort(EventCol.SEQ)
    segs = snap.segments.filter(pl.col(SegCol.DEVICE) == device)
    blocks = snap.blocks.filter(pl.col(SnapshotBlockCol.DEVICE) == device)
    # Trace entries record the size the caller asked for (``orig_size``, a free the block's
    # ``requested_size``); the allocator's allocated bytes are of its blocks, rounded (and whole
    # where not split). Both curves are replayed from the final state, each in its own bytes.
    held = blocks.filter(pl.col(SnapshotBlockCol.STATE).is_in(ALLOCATED_STATES))
    final_alloc = int(held.get_column(SnapshotBlockCol.SIZE).sum())
    final_requested = int(held.get_column(SnapshotBlockCol.REQUESTED).sum())
    final_reserved = int(segs.get_column(SegCol.TOTAL_SIZE).sum())
    actions = ev.get_column(EventCol.ACTION)
    size = ev.get_column(EventCol.SIZE).to_numpy()
    block = entry_block_bytes(ev, blocks, snap.allocator_settings)
    alloc_sign = actions.replace_strict(ALLOC_ACTIONS, default=0).to_numpy()
    allocated = _replayed(final_alloc, block * alloc_sign)
    requested = _replayed(final_requested, size * alloc_sign)
    reserved = _replayed(final_reserved, size * actions.replace_strict(RESERVE_ACTIONS, default=0).to_numpy())
    ev = ev.with_columns(pl.Series("_block", block, dtype=pl.Int64))
    timeline = ev.select(EventCol.SEQ, EventCol.ACTION, EventCol.TIME_US).with_columns(
        pl.Series(SnapCol.ALLOCATED, allocated[1:]), pl.Series(SnapCol.REQUESTED, requested[1:]),
        pl.Series(SnapCol.RESERVED, reserved[1:]))
    at = int(np.argmax(allocated))  # 0: the state before the first entry
    peak_seq = int(ev.get_column(EventCol.SEQ)[at - 1]) if at > 0 else None
    stack = int(ev.get_column(EventCol.STACK)[at - 1]) if at > 0 else -1
    inactive = blocks.filter(pl.col(SnapshotBlockCol.STATE) == "inactive").get_column(SnapshotBlockCol.SIZE)
    return SnapshotDevice(
        device=device, events=ev.height, timeline=timeline,
        peak_allocated_bytes=int(allocated[at]), peak_requested_bytes=int(requested.max()),
        peak_reserved_bytes=int(reserved.max()),
        reserved_at_peak_bytes=int(reserved[at]), peak_seq=peak_seq,
        peak_time_us=ev.get_column(EventCol.TIME_US)[at - 1] if at > 0 else None,
        peak_frames=snap.stacks[stack] if stack >= 0 else (),
        peak_phase=stack_phase(snap.stacks[stack]) if stack >= 0 else None,
        live_at_peak=_live_at(snap, ev, blocks, peak_seq),
        final_allocated_bytes=final_alloc, final_requested_bytes=final_requested, final_reserved_bytes=final_reserved,
        segments=segs.height, expandable_segments=int(segs.get_column(SegCol.EXPANDABLE).sum()),
        free_in_segments_bytes=int(inactive.sum()),
        rounding_waste_bytes=final_alloc - final_requested,
        largest_free_block_bytes=int(inactive.max() or 0),  # type: ignore[arg-type]
        ooms=_ooms(snap, ev),
    )


def _replayed(final: int, deltas: I64) -> I64:
    """The value before the first entry, then after each: ``final`` less what came after."""
    after = final - (int(deltas.sum()) - np.cumsum(deltas, dtype=np.int64))
    out: I64 = np.r_[final - int(deltas.sum()), after].astype(np.int64)
    return out


def _live_at(snap: MemorySnapshot, ev: pl.DataFrame, blocks: pl.DataFrame, peak_seq: int | None) -> pl.DataFrame:
    """Blocks allocated at the peak, grouped by top user frame: the window's allocations not
    freed by then, blocks freed after it whose allocation came before the window, and final
    blocks the window never touched."""
    cut = -1 if peak_seq is None else peak_seq
    pairs = ev.filter(pl.col(EventCol.ACTION).is_in(list(ALLOC_ACTIONS))).sort(EventCol.ADDR, EventCol.SEQ)
    pairs = pairs.with_columns(
        pl.col(EventCol.SEQ).shift(-1).over(EventCol.ADDR).alias("_next"),
        pl.col(EventCol.SEQ).rank("ordinal").over(EventCol.ADDR).alias("_nth"),
    )
    in_window = pairs.filter((pl.col(EventCol.ACTION) == "alloc") & (pl.col(EventCol.SEQ) <= cut)
                             & (pl.col("_next").is_null() | (pl.col("_next") > cut)))
    # A free with no allocation before it in the window: allocated before the window began.
    before = pairs.filter((pl.col(EventCol.ACTION) == "free_completed") & (pl.col("_nth") == 1)
                          & (pl.col(EventCol.SEQ) > cut))
    touched = pairs.get_column(EventCol.ADDR).unique()
    untouched = blocks.filter(pl.col(SnapshotBlockCol.STATE).is_in(ALLOCATED_STATES)
                              & ~pl.col(SnapshotBlockCol.ADDRESS).is_in(touched.implode()))
    live = pl.concat([
        in_window.select(pl.col("_block").alias(LiveCol.BYTES), EventCol.STACK),
        before.select(pl.col("_block").alias(LiveCol.BYTES), EventCol.STACK),
        # block sizes, as the replayed allocated curve counts them
        untouched.select(pl.col(SnapshotBlockCol.SIZE).alias(LiveCol.BYTES),
                         pl.col(SnapshotBlockCol.STACK).alias(EventCol.STACK)),
    ])
    frames = [user_frame(s) for s in snap.stacks]
    return (
        live.with_columns(pl.col(EventCol.STACK).replace_strict(list(range(len(frames))), frames, default=NO_FRAME,
                                                               return_dtype=pl.String).alias(LiveCol.FRAME))
        .group_by(LiveCol.FRAME)
        .agg(pl.len().cast(pl.Int64).alias(LiveCol.BLOCKS), pl.col(LiveCol.BYTES).sum(),
             pl.col(LiveCol.BYTES).max().alias(LiveCol.LARGEST))
        .sort([LiveCol.BYTES, LiveCol.FRAME], descending=[True, False])
    )


def _ooms(snap: MemorySnapshot, ev: pl.DataFrame) -> pl.DataFrame:
    o = ev.filter(pl.col(EventCol.ACTION) == "oom")
    return o.select(
        EventCol.SEQ, EventCol.TIME_US, pl.col(EventCol.SIZE).alias(OomCol.REQUESTED),
        pl.col(EventCol.DEVICE_FREE).alias(OomCol.DEVICE_FREE),
        pl.Series(OomCol.FRAME, [user_frame(snap.stacks[s]) if s >= 0 else NO_FRAME
                                 for s in o.get_column(EventCol.STACK).to_list()], dtype=pl.String),
    )


#: C++ frames that say nothing about who allocated: the unwinder and capture machinery, the
#: interpreter's own calling frames and dispatcher plumbing. The same lists as the ``_frame_filter``
#: of torch's ``torch/cuda/_memory_viz.py`` (torch 2.13), which hides them from its viewer.
_OMIT_FUNCTIONS: Final = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "_start",
                          "__libc_start_main", "PyEval_", "PyObject_", "PyFunction_")
_OMIT_FILENAMES: Final = ("core/boxing", "/Register", "/Redispatch", "pythonrun.c", "Modules/main.c",
                          "Objects/call.c", "Objects/methodobject.c", "pycore_ceval.h", "ceval.c",
                          "cpython/abstract.h")


#: C++ frames of the allocation itself: the caching allocator, the empty-tensor factories that call
#: it, and the generated wrappers between an op and its kernel. The op that asked for memory sits
#: outside them (``at::native::addmm_out_cuda_impl``), never ``DeviceCachingAllocator::malloc``.
_ALLOCATION_FUNCTIONS: Final = ("CachingAllocator", "c10::cuda::", "c10::Allocator", "c10::StorageImpl",
                                "c10::make_intrusive", "at::detail::", "at::empty", "at::native::empty",
                                "at::TensorBase::", "at::_ops::", "c10::impl::", "wrapper_", "create_out",
                                "set_output", "resize_")
_ALLOCATION_FILENAMES: Final = ("CachingAllocator", "c10/core/", "c10/util/", "ATen/EmptyTensor",
                                "ATen/core/", "ATen/native/TensorFactories", "ATen/native/Resize",
                                "/Register", "Operators_")


def stack_phase(frames: tuple[Frame, ...]) -> str | None:
    """The step phase an allocation's stack was in: "optimizer" under an optimizer's step (a frame
    of torch/optim), "backward" under the autograd engine (its C++ thread, or Python's
    torch.autograd.backward), "forward" under a module's forward; None otherwise. A snapshot has
    no step annotations: the stack is its only structure."""
    names = [(f.replace("\\", "/"), n) for f, _, n in frames]
    if any("/torch/optim/" in f or f.startswith("torch/optim/") for f, _ in names):
        return "optimizer"
    if any("autograd::Engine" in n or "autograd::engine" in n or f.endswith("torch/autograd/__init__.py")
           or f.endswith("torch/autograd/graph.py") for f, n in names):
        return "backward"
    if any(n in ("forward", "_call_impl") for _, n in names):
        return "forward"
    return None


def _telling(filename: str, name: str) -> bool:
    return not any(f in name for f in _OMIT_FUNCTIONS) and not any(f in filename for f in _OMIT_FILENAMES)


def _allocating(filename: str, name: str) -> bool:
    return any(f in name for f in _ALLOCATION_FUNCTIONS) or any(f in filename for f in _ALLOCATION_FILENAMES)


def user_frame(frames: tuple[Frame, ...]) -> str:
    """The frame named for an allocation: the innermost frame in the user's own Python code (the
    first ``.py`` frame outside torch's package); without one, the innermost Python frame (torch's
    own, an optimizer's step); without Python (an allocation on the autograd engine's thread), the
    innermost C++ frame that says something and is not the allocation machinery (the allocator,
    the empty-tensor factories, the dispatcher's wrappers); NO_FRAME for an empty stack."""
    for filename, line, name in frames:
        path = filename.replace("\\", "/")
        if path.endswith(".py") and "/torch/" not in path and not path.startswith("torch/"):
            return f"{filename}:{line} {name}"
    for filename, line, name in frames:
        if filename.endswith(".py"):
            return f"{filename}:{line} {name}"
    for filename, line, name in frames:
        if _telling(filename, name) and not _allocating(filename, name):
            return f"{filename}:{line} {name}"
    for filename, line, name in frames:
        if _telling(filename, name):
            return f"{filename}:{line} {name}"
    if frames:
        filename, line, name = frames[0]
        return f"{filename}:{line} {name}"
    return NO_FRAME
