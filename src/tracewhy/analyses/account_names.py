"""The step account's fixed vocabulary: what a part can be (``PartKind``), the parts whose name is
fixed (``PartName``), and a part's description (``Part``). ``account_parts`` decides which part
each stretch of a path goes to; renderers and findings read these names.
"""

from __future__ import annotations

from typing import Final

import msgspec

from tracewhy.analyses import api_names


class PartKind:
    """The fixed vocabulary of what a part is."""

    KERNELS: Final = "kernels"
    COPIES: Final = "copies"
    COMMUNICATION: Final = "communication"
    HOST: Final = "host"
    DATA_LOADING: Final = "data_loading"
    COMPILATION: Final = "compilation"
    LAUNCH: Final = "launch_overhead"
    SYNC: Final = "sync"
    GPU_GAP: Final = "gpu_queue_gap"
    IDLE: Final = "idle"
    UNEXPLAINED: Final = "unexplained"


PART_KINDS: Final = (PartKind.KERNELS, PartKind.COPIES, PartKind.COMMUNICATION, PartKind.HOST, PartKind.DATA_LOADING,
                     PartKind.COMPILATION, PartKind.LAUNCH, PartKind.SYNC, PartKind.GPU_GAP, PartKind.IDLE,
                     PartKind.UNEXPLAINED)


class PartName:
    """The parts whose name is fixed (the others carry a family, a direction, a line, an op...)."""

    DATA_LOADING: Final = "data loading"
    COMPILATION: Final = "compilation"
    FORWARD: Final = api_names.Phase.FORWARD
    BACKWARD: Final = api_names.Phase.BACKWARD
    OPTIMIZER: Final = api_names.Phase.OPTIMIZER
    LAUNCH: Final = "launch overhead"
    GPU_GAP: Final = "GPU queue gaps"
    GPU_WAIT: Final = "idle: GPU waits on another stream"
    UNTRACED: Final = "idle: untraced Python"
    STREAM_WAIT: Final = "sync: stream waits on another stream"
    QUEUE_FULL: Final = "sync: launch queue full"
    #: A launch that waited far beyond launch latency while its device recorded no GPU work: the
    #: GPU was running work queued before the capture began, or the host and GPU clocks are
    #: offset. Nothing on the host shortens it.
    UNRECORDED_GPU: Final = "idle: GPU work before the trace"
    UNEXPLAINED: Final = "unexplained"
    #: Before a scalar read's name: the host ops outside the phases that lead up to that read
    #: ("host: up to aten::item"), the work a logging line forces.
    READ_PREFIX: Final = "host: up to "


class Part(msgspec.Struct, frozen=True):
    name: str
    kind: str
    #: Work the step must do: compute kernels and device-side copies; on a CPU-only trace, the
    #: model's own CPU ops (forward, backward, optimizer). Everything else could leave the path.
    essential: bool


def avoidable(part: str, kind: str, essential: bool) -> bool:
    """A part a fix could shorten: not essential work, not ``unexplained`` (nothing is known of
    it), not a launch delay the trace cannot explain (``PartName.UNRECORDED_GPU``)."""
    return not essential and kind != PartKind.UNEXPLAINED and part != PartName.UNRECORDED_GPU
