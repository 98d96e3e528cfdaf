"""Tiny Kineto traces built inline, for exact unit tests (never a substitute for real traces)."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PID = 100
TID = 100


@dataclass
class KinetoBuilder:
    """Builds a Kineto trace event by event; times are microseconds, as Kineto writes them."""

    events: list[dict[str, Any]] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=lambda: {"schemaVersion": 1})
    _corr: int = 1000

    def op(self, name: str, ts: float, dur: float, tid: int = TID, cat: str = "cpu_op", **args: Any) -> KinetoBuilder:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid,
                            "ts": ts, "dur": dur, "args": dict(args)})
        return self

    def annotation(self, name: str, ts: float, dur: float, tid: int = TID) -> KinetoBuilder:
        return self.op(name, ts, dur, tid=tid, cat="user_annotation")

    def launch(self, kernel: str, ts: float, dur: float, gpu_ts: float, gpu_dur: float,
               tid: int = TID, stream: int = 7, device: int = 0, cat: str = "kernel",
               api: str = "cudaLaunchKernel", **gpu_args: Any) -> KinetoBuilder:
        """A runtime launch on the host and the GPU activity it starts, linked by correlation."""
        self._corr += 1
        c = self._corr
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": api, "pid": PID, "tid": tid,
                            "ts": ts, "dur": dur, "args": {"correlation": c, "cbid": 211}})
        self.events.append({"ph": "X", "cat": cat, "name": kernel, "pid": device, "tid": stream,
                            "ts": gpu_ts, "dur": gpu_dur,
                            "args": {"device": device, "stream": stream, "correlation": c, **gpu_args}})
        self.events.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": c, "pid": PID, "tid": tid, "ts": ts})
        self.events.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": c, "pid": device,
                            "tid": stream, "ts": gpu_ts, "bp": "e"})
        return self

    def doc(self) -> dict[str, Any]:
        return {**self.header, "traceEvents": self.events}

    def write(self, path: Path, gz: bool = False) -> Path:
        data = json.dumps(self.doc()).encode()
        path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
        return path
