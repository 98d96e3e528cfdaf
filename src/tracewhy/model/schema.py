"""Every table's column names and dtypes, declared once.

Readers build tables with exactly these schemas and ``Trace.check()`` verifies them.
Analyses refer to columns through the constants here, never through bare strings.
Time is always int64 nanoseconds (``ts_ns``, ``dur_ns``).
"""

from __future__ import annotations

from enum import Enum
from typing import Final

import polars as pl


class Kind(str, Enum):
    """What a slice is. One value per row of the slices table."""

    CPU_OP = "cpu_op"  # aten:: ops and other RecordFunction scopes
    ANNOTATION = "annotation"  # record_function / user annotations, ProfilerStep#N
    PYTHON = "python"  # Python frames (with_stack)
    RUNTIME = "runtime"  # CUDA / HIP runtime API calls
    DRIVER = "driver"  # CUDA driver API calls (cuLaunchKernel, ...)
    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    GPU_ANNOTATION = "gpu_annotation"  # annotations projected onto a GPU stream by Kineto
    GPU_SYNC = "gpu_sync"  # CUPTI synchronization records (cat cuda_sync)
    PROFILER_RANGE = "profiler_range"  # CUPTI range-profiler records (counters, no timing trust)
    OVERHEAD = "overhead"  # profiler's own overhead (buffer requests)
    OTHER = "other"


KIND_DTYPE: Final = pl.Enum([k.value for k in Kind])
#: Each kind's code in ``KIND_DTYPE`` (the kind column's physical value): its position in Kind.
KIND_CODE: Final[dict[str, int]] = {k.value: i for i, k in enumerate(Kind)}

#: Kinds that run on the host and nest per thread.
HOST_KINDS: Final = (Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON, Kind.RUNTIME, Kind.DRIVER)
#: Kinds that occupy a GPU stream and count as device activity.
GPU_ACTIVITY_KINDS: Final = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
#: Kinds that can launch GPU activity.
LAUNCH_KINDS: Final = (Kind.RUNTIME, Kind.DRIVER)


class Col:
    """Column names of the slices table."""

    ID: Final = "id"  # row number; other tables refer to slices by it
    KIND: Final = "kind"
    NAME: Final = "name"
    TS: Final = "ts_ns"
    DUR: Final = "dur_ns"
    PID: Final = "pid"
    TID: Final = "tid"
    DEVICE: Final = "device"
    STREAM: Final = "stream"
    CORRELATION: Final = "correlation"
    EXTERNAL_ID: Final = "external_id"
    DEPTH: Final = "depth"  # host nesting depth on its thread (0 = top level)
    PARENT: Final = "parent_id"  # enclosing host slice on the same thread
    LAUNCH: Final = "launch_id"  # GPU rows: the runtime/driver call that launched it
    OP: Final = "op_id"  # GPU and launch rows: innermost CPU op on the launching stack


SLICES_SCHEMA: Final = pl.Schema(
    {
        Col.ID: pl.Int64(),
        Col.KIND: KIND_DTYPE,
        Col.NAME: pl.Categorical(),
        Col.TS: pl.Int64(),
        Col.DUR: pl.Int64(),
        Col.PID: pl.Int64(),
        Col.TID: pl.Int64(),
        Col.DEVICE: pl.Int32(),
        Col.STREAM: pl.Int64(),
        Col.CORRELATION: pl.Int64(),
        Col.EXTERNAL_ID: pl.Int64(),
        Col.DEPTH: pl.Int32(),
        Col.PARENT: pl.Int64(),
        Col.LAUNCH: pl.Int64(),
        Col.OP: pl.Int64(),
    }
)

# Optional attributes live in side tables keyed by slice id: most rows never have them, and
# full-length null columns would double the model's memory on a multi-GB trace.


class LaunchAttrCol:
    """Kernel launch attributes (one row per kernel slice that has any)."""

    ID: Final = "id"
    GRID_X: Final = "grid_x"
    GRID_Y: Final = "grid_y"
    GRID_Z: Final = "grid_z"
    BLOCK_X: Final = "block_x"
    BLOCK_Y: Final = "block_y"
    BLOCK_Z: Final = "block_z"
    REGISTERS: Final = "registers_per_thread"
    SHARED_MEM: Final = "shared_mem_bytes"
    BLOCKS_PER_SM: Final = "blocks_per_sm"
    WARPS_PER_SM: Final = "warps_per_sm"
    OCCUPANCY_PCT: Final = "est_occupancy_pct"


KERNEL_ATTRS_SCHEMA: Final = pl.Schema(
    {
        LaunchAttrCol.ID: pl.Int64(),
        LaunchAttrCol.GRID_X: pl.Int64(),
        LaunchAttrCol.GRID_Y: pl.Int64(),
        LaunchAttrCol.GRID_Z: pl.Int64(),
        LaunchAttrCol.BLOCK_X: pl.Int64(),
        LaunchAttrCol.BLOCK_Y: pl.Int64(),
        LaunchAttrCol.BLOCK_Z: pl.Int64(),
        LaunchAttrCol.REGISTERS: pl.Int64(),
        LaunchAttrCol.SHARED_MEM: pl.Int64(),
        LaunchAttrCol.BLOCKS_PER_SM: pl.Float64(),
        LaunchAttrCol.WARPS_PER_SM: pl.Float64(),
        LaunchAttrCol.OCCUPANCY_PCT: pl.Float64(),
    }
)

COPY_KINDS: Final = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "unknown")
MEMORY_KINDS: Final = ("Pageable", "Pinned", "Device", "Managed", "Array", "unknown")


class CopyAttrCol:
    """Memcpy / memset attributes."""

    ID: Final = "id"
    BYTES: Final = "bytes"
    COPY_KIND: Final = "copy_kind"  # HtoD, DtoH, ...; null for memsets
    SRC_MEM: Final = "src_mem"  # Pageable / Pinned / Device / Managed
    DST_MEM: Final = "dst_mem"


COPY_ATTRS_SCHEMA: Final = pl.Schema(
    {
        CopyAttrCol.ID: pl.Int64(),
        CopyAttrCol.BYTES: pl.Int64(),
        CopyAttrCol.COPY_KIND: pl.Enum(list(COPY_KINDS)),
        CopyAttrCol.SRC_MEM: pl.Enum(list(MEMORY_KINDS)),
        CopyAttrCol.DST_MEM: pl.Enum(list(MEMORY_KINDS)),
    }
)


class OpAttrCol:
    """Host op attributes: shapes (record_shapes), autograd links, FLOPs, collectives, stacks."""

    ID: Final = "id"
    INPUT_DIMS: Final = "input_dims"  # JSON text as written, e.g. "[[8, 3], [3]]"
    INPUT_TYPES: Final = "input_types"
    #: Scalar arguments' values as written ("Concrete Inputs", torch >= 2.1), JSON text: strides, flags.
    CONCRETE_INPUTS: Final = "concrete_inputs"
    SEQUENCE: Final = "sequence_number"
    FWD_TID: Final = "fwd_thread_id"
    FLOPS: Final = "flops"
    CALL_STACK: Final = "call_stack"  # legacy with_stack text (PyTorch <= 1.9)
    COLLECTIVE: Final = "collective_name"
    IN_NELEMS: Final = "in_msg_nelems"
    OUT_NELEMS: Final = "out_msg_nelems"
    GROUP_SIZE: Final = "group_size"
    DTYPE: Final = "dtype"
    PG_NAME: Final = "process_group"


OP_ATTRS_SCHEMA: Final = pl.Schema(
    {
        OpAttrCol.ID: pl.Int64(),
        OpAttrCol.INPUT_DIMS: pl.String(),
        OpAttrCol.INPUT_TYPES: pl.String(),
        OpAttrCol.CONCRETE_INPUTS: pl.String(),
        OpAttrCol.SEQUENCE: pl.Int64(),
        OpAttrCol.FWD_TID: pl.Int64(),
        OpAttrCol.FLOPS: pl.Int64(),
        OpAttrCol.CALL_STACK: pl.String(),
        OpAttrCol.COLLECTIVE: pl.String(),
        OpAttrCol.IN_NELEMS: pl.Int64(),
        OpAttrCol.OUT_NELEMS: pl.Int64(),
        OpAttrCol.GROUP_SIZE: pl.Int64(),
        OpAttrCol.DTYPE: pl.String(),
        OpAttrCol.PG_NAME: pl.String(),
    }
)


class MemEventCol:
    """Memory events (allocator instant events, ``[memory]``)."""

    TS: Final = "ts_ns"
    PID: Final = "pid"
    TID: Final = "tid"
    DEVICE_TYPE: Final = "device_type"  # 0 CPU, 1 CUDA (c10::DeviceType)
    DEVICE_ID: Final = "device_id"
    BYTES: Final = "bytes"  # signed: negative is a free
    TOTAL_ALLOCATED: Final = "total_allocated"
    TOTAL_RESERVED: Final = "total_reserved"
    ADDR: Final = "addr"


MEMORY_SCHEMA: Final = pl.Schema(
    {
        MemEventCol.TS: pl.Int64(),
        MemEventCol.PID: pl.Int64(),
        MemEventCol.TID: pl.Int64(),
        MemEventCol.DEVICE_TYPE: pl.Int32(),
        MemEventCol.DEVICE_ID: pl.Int32(),
        MemEventCol.BYTES: pl.Int64(),
        MemEventCol.TOTAL_ALLOCATED: pl.Int64(),
        MemEventCol.TOTAL_RESERVED: pl.Int64(),
        MemEventCol.ADDR: pl.Int64(),
    }
)

FLOW_KINDS: Final = ("correlation", "fwdbwd", "other")


class FlowCol:
    """Flow events: launch arrows (ac2g and legacy names) and forward-backward links."""

    FLOW_ID: Final = "flow_id"
    KIND: Final = "kind"
    PHASE: Final = "phase"  # s (start), t (step), f (finish)
    TS: Final = "ts_ns"
    PID: Final = "pid"
    TID: Final = "tid"


FLOWS_SCHEMA: Final = pl.Schema(
    {
        FlowCol.FLOW_ID: pl.Int64(),
        FlowCol.KIND: pl.Enum(list(FLOW_KINDS)),
        FlowCol.PHASE: pl.Enum(["s", "t", "f"]),
        FlowCol.TS: pl.Int64(),
        FlowCol.PID: pl.Int64(),
        FlowCol.TID: pl.Int64(),
    }
)


class ThreadCol:
    """Process and thread names from metadata (``M``) events; tid is null for a process row."""

    PID: Final = "pid"
    TID: Final = "tid"
    NAME: Final = "name"


THREADS_SCHEMA: Final = pl.Schema({ThreadCol.PID: pl.Int64(), ThreadCol.TID: pl.Int64(), ThreadCol.NAME: pl.String()})


class DeviceCol:
    """Device properties, one row per GPU the trace describes."""

    DEVICE: Final = "device"
    NAME: Final = "name"
    TOTAL_MEM: Final = "total_global_mem_bytes"
    CC_MAJOR: Final = "compute_major"
    CC_MINOR: Final = "compute_minor"
    NUM_SMS: Final = "num_sms"
    MAX_THREADS_PER_SM: Final = "max_threads_per_sm"
    REGS_PER_SM: Final = "regs_per_sm"
    SHARED_MEM_PER_SM: Final = "shared_mem_per_sm"


DEVICES_SCHEMA: Final = pl.Schema(
    {
        DeviceCol.DEVICE: pl.Int32(),
        DeviceCol.NAME: pl.String(),
        DeviceCol.TOTAL_MEM: pl.Int64(),
        DeviceCol.CC_MAJOR: pl.Int32(),
        DeviceCol.CC_MINOR: pl.Int32(),
        DeviceCol.NUM_SMS: pl.Int32(),
        DeviceCol.MAX_THREADS_PER_SM: pl.Int32(),
        DeviceCol.REGS_PER_SM: pl.Int32(),
        DeviceCol.SHARED_MEM_PER_SM: pl.Int64(),
    }
)

NVTX_STYLES: Final = ("PushPop", "StartEnd", "Mark")


class NvtxCol:
    """NVTX attributes of annotation slices read from Nsight Systems (empty for other formats).

    The slice's name is already the display name nsys uses (``domain:text`` when the domain is
    known); these columns keep what that name alone cannot say.
    """

    ID: Final = "id"
    RANGE_ID: Final = "range_id"  # the event's row id in the export; nsys reports call it RangeId
    STYLE: Final = "style"  # PushPop (one thread's stack), StartEnd (may cross threads), Mark
    DOMAIN_ID: Final = "domain_id"  # 0 or null: the default domain
    DOMAIN: Final = "domain"  # null for the default domain or when its creation was not captured
    CATEGORY: Final = "category"
    END_TID: Final = "end_tid"  # a StartEnd range that ended on another thread: that thread


NVTX_ATTRS_SCHEMA: Final = pl.Schema(
    {
        NvtxCol.ID: pl.Int64(),
        NvtxCol.RANGE_ID: pl.Int64(),
        NvtxCol.STYLE: pl.Enum(list(NVTX_STYLES)),
        NvtxCol.DOMAIN_ID: pl.Int64(),
        NvtxCol.DOMAIN: pl.String(),
        NvtxCol.CATEGORY: pl.Int64(),
        NvtxCol.END_TID: pl.Int64(),
    }
)

#: Every table of a Trace with its declared schema.
class SyncCol:
    """Synchronization record attributes (Kineto cuda_sync args, CUPTI synchronization records):
    what a stream or the host waited on. One row per sync slice that names its target."""

    ID: Final = "id"
    WAIT_STREAM: Final = "wait_stream"  # the stream whose event was awaited ("wait_on_stream")
    #: Correlation id of the cudaEventRecord call that recorded the awaited event
    #: ("wait_on_cuda_event_record_corr_id"): the awaited work is what that stream had queued then.
    WAIT_RECORD_CORRELATION: Final = "wait_record_correlation"


SYNC_ATTRS_SCHEMA: Final = pl.Schema(
    {
        SyncCol.ID: pl.Int64(),
        SyncCol.WAIT_STREAM: pl.Int64(),
        SyncCol.WAIT_RECORD_CORRELATION: pl.Int64(),
    }
)

TABLE_SCHEMAS: Final = {
    "slices": SLICES_SCHEMA,
    "kernel_attrs": KERNEL_ATTRS_SCHEMA,
    "copy_attrs": COPY_ATTRS_SCHEMA,
    "op_attrs": OP_ATTRS_SCHEMA,
    "memory": MEMORY_SCHEMA,
    "flows": FLOWS_SCHEMA,
    "threads": THREADS_SCHEMA,
    "devices": DEVICES_SCHEMA,
    "nvtx_attrs": NVTX_ATTRS_SCHEMA,
    "sync_attrs": SYNC_ATTRS_SCHEMA,
}


def empty(schema: pl.Schema) -> pl.DataFrame:
    """An empty table with the given schema."""
    return pl.DataFrame(schema=schema)
