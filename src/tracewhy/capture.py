"""Capture helpers that run inside the user's job: a PyTorch profiler capture with the options
tracewhy reads best, in one ``with``.

    import tracewhy.capture
    with tracewhy.capture.profile("traces", steps=5) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

It wraps ``torch.profiler.profile`` with ``schedule(wait=1, warmup=1, active=steps)``, a gzip
trace handler, ``ProfilerStep#N`` markers through ``step()``, and the light options by default
(``record_shapes`` on; ``with_stack`` and ``profile_memory`` off: they add 30-80% to CPU time, so
a trace with them attributes time but does not measure it). On CUDA it also opens the
``cudaProfilerApi`` range over the active steps, so ``nsys profile --capture-range=cudaProfilerApi``
(``tracewhy capture nsys``) records the same steps. When the capture ends it prints the trace's
path and the ``tracewhy diagnose`` command. torch is imported when ``profile`` is called.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Stepper:
    """What ``profile`` yields: call ``step()`` once at the end of every training step."""

    _prof: Any
    _cuda_start: int | None  # the step at which the cudaProfilerApi range opens (None: no CUDA)
    _cuda_stop: int
    steps_done: int = 0

    def step(self) -> None:
        self._prof.step()
        self.steps_done += 1
        if self._cuda_start is not None:
            torch = _torch()
            if self.steps_done == self._cuda_start:
                torch.cuda.profiler.start()
            elif self.steps_done == self._cuda_stop:
                torch.cuda.profiler.stop()


def _torch() -> Any:
    """The torch module, imported when a capture runs. Typed as Any: tracewhy installs without
    torch (it reads traces; only the capture runs inside a job that has it), so the type check
    must pass with torch absent and with it present."""
    return importlib.import_module("torch")


@contextmanager
def profile(out_dir: str | Path = "traces", steps: int = 5, *, wait: int = 1, warmup: int = 1,
            record_shapes: bool = True, with_stack: bool = False, profile_memory: bool = False,
            worker_name: str | None = None, quiet: bool = False) -> Iterator[Stepper]:
    """Profile ``steps`` steps after ``wait`` skipped and ``warmup`` warm-up steps, writing
    ``<out_dir>/<worker>.<time>.pt.trace.json.gz``."""
    torch = _torch()
    ProfilerActivity, schedule = torch.profiler.ProfilerActivity, torch.profiler.schedule
    tensorboard_trace_handler = torch.profiler.tensorboard_trace_handler

    if steps < 1 or wait < 0 or warmup < 0:
        raise ValueError("steps must be >= 1, wait and warmup >= 0")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.pt.trace.json.gz"))
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = torch.profiler.profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=steps, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(out), worker_name=worker_name, use_gzip=True),
        record_shapes=record_shapes, with_stack=with_stack, profile_memory=profile_memory,
    )
    stepper = Stepper(prof, wait + warmup if cuda else None, wait + warmup + steps)
    with prof:
        yield stepper
    written = sorted(set(out.glob("*.pt.trace.json.gz")) - before, key=lambda p: p.stat().st_mtime)
    if quiet:
        return
    if not written:
        print(f"tracewhy.capture: no trace written: {stepper.steps_done} steps ran, the schedule needs "
              f"{wait + warmup + steps} (call prof.step() once per step)", file=sys.stderr)
        return
    heavy = [name for name, on in (("with_stack", with_stack), ("profile_memory", profile_memory)) if on]
    note = f" (captured with {', '.join(heavy)}: attribution, not throughput)" if heavy else ""
    print(f"tracewhy.capture: trace written to {written[-1]}{note}\n  next: tracewhy diagnose {written[-1]}",
          file=sys.stderr)
