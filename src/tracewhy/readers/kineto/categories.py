"""Kineto event categories: which kind of slice each one is, and which accelerator backend wrote it.

Kineto writes ``cat`` as ``toString(ActivityType)`` (``libkineto/src/output_json.cpp``,
``ChromeTraceLogger::handleActivity``); the strings are the table ``_activityTypeNames`` in
``libkineto/include/ActivityType.h`` (pytorch/kineto @ 114171df, 2026-08). Whether a type
runs on the device or the host is PyTorch's own rule, ``deviceTypeFromActivity`` in
``torch/csrc/profiler/kineto_shim.cpp`` (pytorch/pytorch @ 03b7c19d): the structure of the
category decides, never a vendor's kernel names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from tracewhy.model.schema import Kind

#: The category of every event tracewhy's own ``export`` adds to a trace (its tracks: gaps,
#: findings, utilization and memory counters); no profiler writes it.
EXPORT_CAT: Final = "tracewhy"

# Category spellings, lower-cased. PyTorch 1.8-1.9 wrote capitalized names (Operator,
# Runtime, Kernel, Memcpy, Memset); 1.10+ writes cpu_op, cuda_runtime, kernel, gpu_memcpy...
# ROCm builds use the same CUDA-named categories with hip* API names. Intel XPU (XPUPTI plugin)
# and PrivateUse1 backends write their device work as kernel / gpu_memcpy / gpu_memset too
# (kineto_shim.cpp kXpuTypes, kPrivateUse1Types); only their host calls have their own names.
CATEGORY_KIND: dict[str, Kind] = {
    "cpu_op": Kind.CPU_OP,
    "operator": Kind.CPU_OP,
    "user_annotation": Kind.ANNOTATION,
    "python_function": Kind.PYTHON,
    "cuda_runtime": Kind.RUNTIME,
    "runtime": Kind.RUNTIME,
    "cuda_driver": Kind.DRIVER,
    "kernel": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY,
    "memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "memset": Kind.MEMSET,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
    "cuda_sync": Kind.GPU_SYNC,
    "cuda_profiler_range": Kind.PROFILER_RANGE,
    "overhead": Kind.OVERHEAD,
    # Device side (deviceTypeFromActivity: MTIA, HPU). MTIA_CCP_EVENTS are the work the MTIA
    # command processors ran (hccl:: collectives among them, output_json.cpp); HPU_OP is
    # "HPU host side runtime event" in ActivityType.h but DeviceType::HPU in PyTorch, which
    # counts its time as device time: PyTorch's rule is taken.
    "mtia_ccp_events": Kind.KERNEL,
    "hpu_op": Kind.KERNEL,
    # MTIA_INSIGHT: on-device instrumentation ranges over the CCP work, like a GPU annotation:
    # on the device, but not work of its own (counting it would count the work twice).
    "mtia_insight": Kind.GPU_ANNOTATION,
    # Host side runtime and driver calls: the launches of device work.
    "xpu_runtime": Kind.RUNTIME,
    "xpu_driver": Kind.DRIVER,
    "mtia_runtime": Kind.RUNTIME,
    "glow_runtime": Kind.RUNTIME,
    "privateuse1_runtime": Kind.RUNTIME,
    "privateuse1_driver": Kind.DRIVER,
    # XPUPTI synchronization records (XpuptiActivityHandlers.cpp, handleSynchronizationActivity),
    # the XPU counterpart of CUPTI's cuda_sync.
    "xpu_sync": Kind.GPU_SYNC,
}

# A category no table lists yet follows Kineto's naming: "<backend>_runtime" / "<backend>_driver"
# are host calls of a backend (PRIVATEUSE1_RUNTIME, XPU_DRIVER, ...).
_SUFFIX_KIND = (("_runtime", Kind.RUNTIME), ("_driver", Kind.DRIVER))


def not_exported(events: Iterable[Any]) -> int:
    """How many of ``events`` are not tracks tracewhy's own ``export`` added (cat ``EXPORT_CAT``):
    its counter tracks, read back, are no problem to warn about."""
    return sum(1 for e in events if e.cat != EXPORT_CAT)


def category_kind(low: str) -> Kind:
    """The kind of a lower-cased category: the table first, then Kineto's naming pattern."""
    kind = CATEGORY_KIND.get(low)
    if kind is not None:
        return kind
    for suffix, by_suffix in _SUFFIX_KIND:
        if low.endswith(suffix) and len(low) > len(suffix):
            return by_suffix
    return Kind.OTHER


# Backend named by the categories a trace holds, most specific first: an XPU trace's kernels
# are "kernel" like CUDA's, so the host-call categories decide.
_BACKEND_PREFIXES = (
    ("mtia_", "MTIA"),
    ("xpu_", "XPU"),
    ("hpu_", "HPU"),
    ("privateuse1_", "PrivateUse1"),
    ("glow_", "Glow"),
)


def accelerator(categories: Iterable[str | None], versions: dict[str, str]) -> str | None:
    """The accelerator backend the trace's categories (and version keys) name, or None.

    ``"CUDA"`` or ``"ROCm"`` for ``cuda_*`` categories (ROCm builds reuse them and say
    hip_runtime_version); None when no category is a device or launch category (a CPU trace).
    """
    lows = {(c or "").lower() for c in categories}
    for prefix, name in _BACKEND_PREFIXES:
        if any(c.startswith(prefix) for c in lows):
            return name
    device_side = {c for c in lows if category_kind(c) in
                   (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.RUNTIME, Kind.DRIVER, Kind.GPU_SYNC)}
    if not device_side:
        return None
    if any(k.startswith(("hip_", "roctracer")) for k in versions):
        return "ROCm"
    others = {c.rsplit("_", 1)[0] for c in device_side if c.endswith(("_runtime", "_driver"))} - {"cuda"}
    if others:
        return sorted(others)[0]  # an unknown "<backend>_runtime": the backend's own name
    return "CUDA"
