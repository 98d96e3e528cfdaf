"""What the recorder asks of torch, each call a no-op where torch, CUDA or NVTX is absent.

torch is imported only if the job already imported it (``sys.modules``): instrumenting a job
never adds torch's import time, and a CPU build (no NVTX, no CUDA events) works unchanged.
``record_function`` is opened only while a profiler is running: outside one it records nothing
and costs ~10 us per block on CPU, twice this module's whole budget.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_reference: Any = None  # the first CUDA mark's event: marks' GPU times are measured from it
#: ``torch.cuda.is_available()`` asked once: it costs 1.5 us a call, a third of a block's budget.
_available: bool | None = None


def _torch() -> Any:
    return sys.modules.get("torch")


def cuda_ready() -> bool:
    """CUDA present and already initialized by the job (the recorder never initializes it)."""
    global _available
    torch = _torch()
    if torch is None:
        return False
    try:
        if _available is None:
            _available = bool(torch.cuda.is_available()) and hasattr(torch._C, "_nvtx")
        return _available and bool(torch.cuda.is_initialized())
    except Exception:
        return False


def enter(name: str, *, events: bool) -> tuple[Any, Any, bool]:
    """Open the NVTX range and ``record_function``; record the start event. A handle for ``exit``."""
    torch = _torch()
    if torch is None:
        return None, None, False
    nvtx = cuda_ready()  # CUDA builds ship NVTX; a CPU build has neither
    if nvtx:
        torch.cuda.nvtx.range_push(name)
    rf = None
    if torch._C._autograd._profiler_enabled():
        rf = torch.ops.profiler._record_function_enter_new(name, None)
    start = None
    if events and cuda_ready():
        start = torch.cuda.Event(enable_timing=True)
        start.record()
    return rf, start, nvtx


def exit(handle: tuple[Any, Any, bool]) -> tuple[Any, Any] | None:
    """Close what ``enter`` opened; the (start, end) events to time later, or None."""
    rf, start, nvtx = handle
    torch = _torch()
    if torch is None:
        return None
    end = None
    if start is not None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
    if rf is not None:
        torch.ops.profiler._record_function_exit._RecordFunction(rf)
    if nvtx:
        torch.cuda.nvtx.range_pop()
    return (start, end) if start is not None else None


def mark_event() -> tuple[Any, Any] | None:
    """A CUDA event now, paired with the reference event it will be timed from."""
    global _reference
    torch = _torch()
    if not cuda_ready():
        return None
    if _reference is None:
        _reference = torch.cuda.Event(enable_timing=True)
        _reference.record()
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return _reference, ev


def resolve(events: tuple[Any, Any], *, wait: bool) -> int | None:
    """Elapsed ns between the two events; None while the end has not run and ``wait`` is False."""
    start, end = events
    if not end.query():
        if not wait:
            return None
        end.synchronize()
    return round(float(start.elapsed_time(end)) * 1_000_000)


def synchronize() -> None:
    torch = _torch()
    if cuda_ready():
        torch.cuda.synchronize()


def device_name() -> str | None:
    torch = _torch()
    if not cuda_ready():
        return "cpu"
    try:
        return str(torch.cuda.get_device_name())
    except Exception:
        return None


def versions() -> dict[str, str]:
    torch = _torch()
    out: dict[str, str] = {}
    if torch is not None:
        out["torch"] = str(torch.__version__)
        cuda = getattr(torch.version, "cuda", None)
        if cuda:
            out["cuda"] = str(cuda)
    return out


def rank_and_world() -> tuple[int, int]:
    """``torch.distributed``'s rank and world size when initialized, else ``RANK``/``WORLD_SIZE``."""
    torch = _torch()
    try:
        if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
            return int(torch.distributed.get_rank()), int(torch.distributed.get_world_size())
    except Exception:
        pass
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1
