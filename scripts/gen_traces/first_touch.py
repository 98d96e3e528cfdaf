"""What touching fresh memory costs against a warm ``zero_()`` of the same bytes, on the machine
at hand: the ratio ``SetGradsToNone`` (analyses/what_if_host_edits.py) charges a CPU-only trace
for gradients that land on fresh pages once ``zero_grad(set_to_none=True)`` frees them. It is a
property of the machine (how the kernel and, in a guest, the hypervisor fault a page in), not
of the trace: ``calibration.py`` measures it beside its captures, ``bench/first_touch.py``
prints it.

Each repeat maps MIB MiB anonymous (no page is backed yet), times ``zero_()`` over it (every
page faults and the kernel zeroes it), then ``zero_()`` again over the now-backed pages; on one
thread, as the calibration pairs run.
"""

from __future__ import annotations

import mmap
import statistics
import time

import torch

#: The size bench/first_touch.py and the calibration captures measure at.
MIB = 48
REPEATS = 15


def first_touch_ratio(mib: int = MIB, repeats: int = REPEATS) -> tuple[float, float, float]:
    """(first touch ms, warm zero_ ms, median of their ratios) over ``repeats``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    first: list[float] = []
    warm: list[float] = []
    try:
        for _ in range(repeats):
            region = mmap.mmap(-1, mib << 20)
            values = torch.frombuffer(region, dtype=torch.float32)
            started = time.perf_counter()
            values.zero_()
            touched = time.perf_counter()
            values.zero_()
            done = time.perf_counter()
            first.append(touched - started)
            warm.append(done - touched)
            del values
            region.close()
    finally:
        torch.set_num_threads(threads)
    ratios = [f / w for f, w in zip(first, warm, strict=True)]
    return statistics.median(first) * 1e3, statistics.median(warm) * 1e3, statistics.median(ratios)
