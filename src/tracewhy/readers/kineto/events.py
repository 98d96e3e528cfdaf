"""Typed shapes of Kineto JSON events, decoded by msgspec.

An event's ``args`` stay raw bytes when the event is decoded: most events of a with_stack trace
are Python frames whose args nothing reads. ``decode_args`` decodes the args of just the events
that need them, in one call per batch. Only the argument keys some analysis needs are declared;
msgspec skips the rest without building them. Key spellings changed over PyTorch versions; each
alias says which. ``by_phase`` sorts a batch of decoded events into the groups the builder takes
(slices, flows, instants, metadata).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Raw, Struct, field

from tracewhy.readers.kineto.repair import has_non_finite_mark, merge_counts, repair_json
from tracewhy.readers.limits import bad_utf8

NO_RAW = Raw(b"")
#: Integers are read as int64, as the tables hold them: a larger one (a hostile or corrupt
#: file) makes that event's args "of the wrong shape", never an overflow later. The lowest
#: int64 is left out too: the reader uses it for "not known" while it builds columns.
I64 = Annotated[int, msgspec.Meta(ge=-(2**63) + 1, le=2**63 - 1)]


# One args shape per kind of event, each with only the keys that kind carries: msgspec skips the
# others without building them, and a smaller struct is quicker to make. gc=False: events hold no
# reference cycles, and millions of GC-tracked objects would make every collection pass walk them
# all (a large share of the read time on a 1 GB trace).
class LinkArgs(Struct, gc=False):
    """What links a slice to others: every slice kind's args have these."""

    # "External id" since PyTorch 1.10; "external id" (lower case) in 1.8-1.9 Runtime/Kernel args.
    external_id: I64 | None = field(name="External id", default=None)
    external_id_legacy: I64 | None = field(name="external id", default=None)
    correlation: I64 | None = None
    # PyTorch >= 2.4 marks events still open when the profiler stopped.
    finished: bool | None = None


class GpuArgs(LinkArgs, gc=False):
    """Kernels, copies, memsets and other device activity."""

    device: I64 | None = None
    # ROCm (roctracer) args carry strings: "stream": "0x0", "bytes": "256"; Triton launch ops
    # carry "grid" as text. Those are accepted here and normalized by the reader.
    stream: I64 | str | None = None
    bytes: I64 | str | None = None
    grid: list[I64] | str | None = None
    block: list[I64] | str | None = None
    registers: I64 | None = field(name="registers per thread", default=None)
    shared_memory: I64 | None = field(name="shared memory", default=None)
    blocks_per_sm: float | None = field(name="blocks per SM", default=None)
    warps_per_sm: float | None = field(name="warps per SM", default=None)
    occupancy_pct: float | None = field(name="est. achieved occupancy %", default=None)
    # MTIA command-processor DMA requests (category mtia_ccp_events, 2024-11 traces): the
    # transfer's "direction" ("DEVICE_TO_HOST"...) and "size" in bytes; no other event has them.
    direction: str | None = None
    size: I64 | str | None = None
    # MTIA event_record / event_wait (same category): the event's sequence number.
    seq_num: I64 | None = None


class SyncArgs(GpuArgs, gc=False):
    """cuda_sync records (Kineto since 2024, with enable_cuda_sync_events): what was waited on,
    -1 for nothing ("Context Sync"). Only sync rows are decoded with these keys."""

    wait_on_stream: I64 | None = None
    wait_record_correlation: I64 | None = field(name="wait_on_cuda_event_record_corr_id", default=None)


class OpArgs(LinkArgs, gc=False):
    """CPU ops and user annotations."""

    # Raw (not decoded) and empty when absent: msgspec cannot put Raw in a union with None.
    input_dims: Raw = field(name="Input Dims", default=NO_RAW)
    input_types: Raw = field(name="Input type", default=NO_RAW)
    concrete_inputs: Raw = field(name="Concrete Inputs", default=NO_RAW)
    sequence: I64 | None = field(name="Sequence number", default=None)
    fwd_tid: I64 | None = field(name="Fwd thread id", default=None)
    flops: float | None = None
    # Legacy with_stack (PyTorch <= 1.9): the stack as one string on each op.
    call_stack: str | None = field(name="Call stack", default=None)
    collective: str | None = field(name="Collective name", default=None)
    in_nelems: I64 | None = field(name="In msg nelems", default=None)
    out_nelems: I64 | None = field(name="Out msg nelems", default=None)
    group_size: I64 | None = field(name="Group size", default=None)
    dtype: str | None = None
    pg_name: str | None = field(name="Process Group Name", default=None)


class MetaArgs(Struct, gc=False):
    """Metadata (M) events: process and thread names."""

    name: str | None = None


class MemoryArgs(Struct, gc=False):
    """[memory] instant events (profile_memory=True)."""

    device_type: I64 | None = field(name="Device Type", default=None)
    device_id: I64 | None = field(name="Device Id", default=None)
    mem_bytes: I64 | None = field(name="Bytes", default=None)
    total_allocated: I64 | None = field(name="Total Allocated", default=None)
    total_reserved: I64 | None = field(name="Total Reserved", default=None)
    addr: I64 | None = field(name="Addr", default=None)


class Event(Struct, gc=False):
    ph: str = ""
    cat: str | None = None
    name: str = ""
    pid: I64 | str | None = None
    tid: I64 | str | None = None
    ts: float = math.nan
    dur: float = math.nan
    id: I64 | str | None = None
    # The args object's bytes, undecoded (empty when the event has none; b"null" for null).
    args: Raw = NO_RAW


# The groups of events by phase (ints: a phase is a string, so no phase is taken for a group).
SLICES, FLOWS, INSTANTS, METADATA = range(4)
PHASE_GROUP: dict[str, int | str] = {"X": SLICES, "s": FLOWS, "f": FLOWS, "t": FLOWS, "i": INSTANTS,
                                     "I": INSTANTS, "M": METADATA}


def by_phase(events: list[Event]) -> dict[int | str, list[Event]]:
    """The events by the group their phase puts them in (``PHASE_GROUP``), each group in file
    order; an event of any other phase is in a group of its phase. One pass: the events lie
    scattered in memory, and a pass per group (five) cost more in cache misses than in bytecode.
    Each phase's list is appended to through a bound ``append`` looked up once per phase: a
    third less time than looking the group up and then its list for every event (400k events:
    29 against 43 ms)."""
    groups: dict[int | str, list[Event]] = {SLICES: [], FLOWS: [], INSTANTS: [], METADATA: []}
    append_to = {ph: groups[group].append for ph, group in PHASE_GROUP.items()}
    append_for = append_to.get
    for e in events:
        append = append_for(e.ph)
        if append is None:  # a phase no group takes: a group of its own
            append = append_to[e.ph] = groups.setdefault(e.ph, []).append
        append(e)
    return groups


class _DocumentHeader(Struct):
    """Top-level keys tracewhy uses, kept raw; everything else in the header is skipped."""

    schemaVersion: Raw = NO_RAW
    deviceProperties: Raw = NO_RAW
    computeProperties: Raw = NO_RAW  # tb_plugin's 2021 fixture
    distributedInfo: Raw = NO_RAW
    displayTimeUnit: Raw = NO_RAW
    baseTimeNanoseconds: Raw = NO_RAW
    record_shapes: Raw = NO_RAW
    profile_memory: Raw = NO_RAW
    with_stack: Raw = NO_RAW
    with_flops: Raw = NO_RAW
    with_modules: Raw = NO_RAW
    cuda_runtime_version: Raw = NO_RAW
    cuda_driver_version: Raw = NO_RAW
    cupti_version: Raw = NO_RAW
    hip_runtime_version: Raw = NO_RAW
    hip_driver_version: Raw = NO_RAW
    roctracer_version: Raw = NO_RAW

    def as_dict(self) -> dict[str, Raw]:
        """The fields present, each copied out of the file's buffer (a Raw is a view that would
        otherwise keep the whole buffer alive for as long as the trace)."""
        return {k: v.copy() for k in _DocumentHeader.__struct_fields__ if (v := getattr(self, k))}


class RawDocument(_DocumentHeader):
    traceEvents: list[Raw] | msgspec.UnsetType = msgspec.UNSET


class TypedDocument(_DocumentHeader):
    traceEvents: list[Event] | msgspec.UnsetType = msgspec.UNSET


EVENTS_DECODER = msgspec.json.Decoder(list[Event])
RAW_DOCUMENT_DECODER = msgspec.json.Decoder(RawDocument)
TYPED_DOCUMENT_DECODER = msgspec.json.Decoder(TypedDocument)
EVENT_DECODER = msgspec.json.Decoder(Event)
#: For an event in which ``repair`` quoted a bare NaN/Infinity: strict=False reads the
#: strings "NaN", "Infinity" and "-Infinity" as floats. (It also reads numbers and booleans
#: written as strings, in such events alone: an event already repaired is read leniently.)
LAX_EVENT_DECODER = msgspec.json.Decoder(Event, strict=False)
RAW_LIST_DECODER = msgspec.json.Decoder(list[Raw])
RAW_DICT_DECODER = msgspec.json.Decoder(dict[str, Raw])
A = TypeVar("A", LinkArgs, GpuArgs, SyncArgs, OpArgs, MetaArgs, MemoryArgs)
_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {
    shape: msgspec.json.Decoder(shape | None)
    for shape in (LinkArgs, GpuArgs, SyncArgs, OpArgs, MetaArgs, MemoryArgs)
}
_LAX_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {
    shape: msgspec.json.Decoder(shape | None, strict=False)
    for shape in (LinkArgs, GpuArgs, SyncArgs, OpArgs, MetaArgs, MemoryArgs)
}


def decode_args(raws: Sequence[Raw], shape: type[A], problems: dict[str, int]) -> list[A | None]:
    """The args of these events as ``shape`` (None where an event has none).

    They are joined, one per line, and decoded in one call (``decode_lines``): each is a whole
    JSON value (the event's decode checked it), so the lines hold exactly them, and one copy
    costs less than a call per event in all (V100 DDP trace, 200k events, msgspec 0.22: runtime
    calls' args 0.20 against 0.33 us each, kernels' 0.70 against 0.82, ops' 0.21 against 0.24;
    memory events' 0.32 against 0.25). When they do not decode, each is decoded alone: args of the wrong shape (a
    correlation id that is not a number...) are dropped for that event alone and counted in
    ``problems``; the event itself is kept.
    """
    return decode_args_marked(raws, shape, problems, b"")[0]


def decode_args_marked(raws: Sequence[Raw], shape: type[A], problems: dict[str, int],
                       mark: bytes) -> tuple[list[A | None], bool]:
    """``decode_args``, and whether the bytes of any of the args hold ``mark``: looked for in the
    joined bytes, it tells whether a key is worth counting (100k args are searched in well under
    a millisecond; a pass over the decoded args costs a few)."""
    joined = b"\n".join(raws)
    marked = bool(mark) and mark in joined
    if all(raws):
        try:
            decoded: list[A | None] = _DECODERS[shape].decode_lines(joined)
            return decoded, marked
        except (msgspec.DecodeError, UnicodeDecodeError) as e:
            if not (isinstance(e, msgspec.ValidationError) or bad_utf8(e)):
                raise
    return [_decode_one(r, shape, problems) if r else None for r in raws], marked


def _decode_one(raw: Raw, shape: type[A], problems: dict[str, int]) -> Any:
    try:
        return _DECODERS[shape].decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        if not bad_utf8(e):
            if isinstance(e, msgspec.ValidationError):
                return _invalid_args(raw, shape, problems, e)
            raise
        # Invalid UTF-8 in a string of the args (the event's own fields decoded, so its bytes
        # were never repaired): replaced, counted, and decoded again.
        fixed = repair_json(raw)
        merge_counts(problems, fixed.counts)
        return _decode_one(Raw(fixed.data), shape, problems) if fixed.counts else None


def _invalid_args(raw: Raw, shape: type[A], problems: dict[str, int], e: msgspec.ValidationError) -> Any:
    """Args of the wrong types: a repaired NaN/Infinity a lax decoder takes, else skipped and counted."""
    if has_non_finite_mark(raw):  # a repaired NaN/Infinity: a float field takes it
        with contextlib.suppress(msgspec.ValidationError):
            return _LAX_DECODERS[shape].decode(raw)
    key = f"args ignored: {e}"
    problems[key] = problems.get(key, 0) + 1
    return None
