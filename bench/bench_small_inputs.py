"""Time and peak RSS of commands on small hostile Kineto traces (tests/hostile_traces.py): deep
Python frames (lines), many one-kernel steps (critical-path), many devices (diagnose, report),
deep cpu_op nesting (diagnose). Each run is a fresh ``python -m tracewhy`` under
``/usr/bin/time -v`` with ``--no-cache``; runs past the limit are stopped and shown as such.

    python bench/bench_small_inputs.py [--limit 120] [CASE ...]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import hostile_traces as ht

CASES = {
    "frames-10k": (lambda: ht.deep_python_frames(10_000), ["lines"]),
    "frames-30k": (lambda: ht.deep_python_frames(30_000), ["lines"]),
    "steps-20k": (lambda: ht.one_kernel_steps(20_000), ["critical-path"]),
    "devices-2k": (lambda: ht.many_devices(2_000), ["diagnose"]),
    "devices-2k-report": (lambda: ht.many_devices(2_000), ["report", "-o", "{out}"]),
    "ops-100k": (lambda: ht.deep_cpu_ops(100_000), ["diagnose"]),
}


def run(case: str, limit: float, tmp: Path) -> str:
    make, argv = CASES[case]
    trace = ht.write(make(), tmp / f"{case}.json")
    out = tmp / f"{case}.html"
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "tracewhy", *[a.format(out=out) for a in argv],
           str(trace), "--no-cache"]
    start = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return f"| {case} | {trace.stat().st_size / 1e6:.1f} MB | > {limit:.0f} s | - | stopped |"
    wall = time.monotonic() - start
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    extra = f"{out.stat().st_size / 1e6:.2f} MB HTML" if out.exists() else f"{len(done.stdout) / 1e3:.0f} kB out"
    return (f"| {case} | {trace.stat().st_size / 1e6:.1f} MB | {wall:.1f} s | "
            f"{int(rss.group(1)) / 1e6 if rss else float('nan'):.2f} GB | rc {done.returncode}, {extra} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="*", default=list(CASES))
    parser.add_argument("--limit", type=float, default=120.0)
    args = parser.parse_args()
    print("| case | input | wall | peak RSS | result |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            print(run(case, args.limit, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
