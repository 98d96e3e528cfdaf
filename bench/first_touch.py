"""What touching fresh memory costs on this machine against a warm ``zero_()`` of the same
bytes: the ratio ``SetGradsToNone`` (analyses/what_if_host_edits.py) charges a CPU-only trace
for gradients that land on fresh pages once ``zero_grad(set_to_none=True)`` frees them.

Each repeat maps SIZE MiB anonymous (no page is backed yet), times ``zero_()`` over it (every
page faults and the kernel zeroes it), then ``zero_()`` again over the now-backed pages; on one
thread, as the calibration pairs run. Prints the medians and the ratio.

Usage: python bench/first_touch.py [--mib 48] [--repeats 15]
"""

from __future__ import annotations

import argparse
import mmap
import statistics
import time
from pathlib import Path

import torch


def first_touch_ratio(mib: int, repeats: int) -> tuple[float, float, float]:
    """(first touch ms, warm zero_ ms, median of their ratios) over ``repeats``."""
    torch.set_num_threads(1)
    first: list[float] = []
    warm: list[float] = []
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
    ratios = [f / w for f, w in zip(first, warm, strict=True)]
    return statistics.median(first) * 1e3, statistics.median(warm) * 1e3, statistics.median(ratios)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    load = " ".join(Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3])
    first, warm, ratio = first_touch_ratio(args.mib, args.repeats)
    print(f"{args.mib} MiB, {args.repeats} repeats, load {load}: first touch {first:.2f} ms, "
          f"warm zero_() {warm:.2f} ms, ratio {ratio:.1f}x (torch {torch.__version__})")


if __name__ == "__main__":
    main()
