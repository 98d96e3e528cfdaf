"""Small Kineto traces shaped to cost far more than their size: frames or ops nested tens of
thousands deep, tens of thousands of one-kernel steps, thousands of devices. Written with the
stdlib (no builder objects per event) so that making one takes well under a second."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PID = 100
TID = 100


def _device(i: int) -> dict[str, Any]:
    return {"id": i, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_899_345_920, "computeMajor": 8,
            "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
            "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 108}


def _launch(corr: int, ts: float, gpu_ts: float, device: int = 0,
            name: str = "gemm_kernel") -> Iterator[dict[str, Any]]:
    """A cudaLaunchKernel, its kernel and the flow between them (as ``builders.launch``)."""
    yield {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": TID, "ts": ts,
           "dur": 4.0, "args": {"correlation": corr, "cbid": 211}}
    yield {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": 7, "ts": gpu_ts, "dur": 10.0,
           "args": {"device": device, "stream": 7, "correlation": corr}}
    yield {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": PID, "tid": TID, "ts": ts}
    yield {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": device, "tid": 7, "ts": gpu_ts, "bp": "e"}


def deep_python_frames(depth: int) -> dict[str, Any]:
    """``depth`` python_function frames, each the caller of the next (a recursion), one kernel
    launched from the innermost."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "python_function", "name": f"model.py({10 + i % 50}): level_{i % 50}", "pid": PID,
         "tid": TID, "ts": 1000.0 + i, "dur": 4.0 * depth - 2.0 * i,
         "args": {"Python parent id": i if i else None, "Python id": i + 1, "Ev Idx": i}}
        for i in range(depth)]
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID, "tid": TID, "ts": 1000.0 + depth,
                   "dur": 6.0, "args": {}})
    events.extend(_launch(1, 1001.0 + depth, 1010.0 + depth))
    return {"schemaVersion": 1, "deviceProperties": [_device(0)], "traceEvents": events}


def one_kernel_steps(steps: int) -> dict[str, Any]:
    """``steps`` ProfilerStep#N annotations, each around one aten::mm that launches one kernel."""
    events: list[dict[str, Any]] = []
    for n in range(steps):
        t = 1000.0 + 100.0 * n
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": PID, "tid": TID,
                       "ts": t, "dur": 90.0, "args": {}})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID, "tid": TID, "ts": t + 5,
                       "dur": 20.0, "args": {}})
        events.extend(_launch(n + 1, t + 10, t + 30))
    return {"schemaVersion": 1, "deviceProperties": [_device(0)], "traceEvents": events}


def many_devices(devices: int) -> dict[str, Any]:
    """``devices`` GPUs in deviceProperties, one kernel on each, all launched from one thread."""
    events: list[dict[str, Any]] = []
    for d in range(devices):
        events.extend(_launch(d + 1, 1000.0 + 10.0 * d, 1005.0 + 10.0 * d, device=d))
    return {"schemaVersion": 1, "deviceProperties": [_device(d) for d in range(devices)], "traceEvents": events}


def deep_cpu_ops(depth: int) -> dict[str, Any]:
    """``depth`` cpu_ops, each inside the one before (a deep dispatch), one kernel at the bottom."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "cpu_op", "name": f"aten::op_{i % 100}", "pid": PID, "tid": TID, "ts": 1000.0 + i,
         "dur": 4.0 * depth - 2.0 * i, "args": {}}
        for i in range(depth)]
    events.extend(_launch(1, 1000.0 + depth, 1010.0 + depth))
    return {"schemaVersion": 1, "deviceProperties": [_device(0)], "traceEvents": events}


def write(doc: dict[str, Any], path: Path) -> Path:
    """The trace as a plain JSON file (its size is the input size the bounds speak of)."""
    path.write_bytes(json.dumps(doc).encode())
    return path


def write_gz(doc: dict[str, Any], path: Path) -> Path:
    path.write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    return path
