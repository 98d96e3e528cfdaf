"""What touching fresh memory costs on this machine against a warm ``zero_()`` of the same
bytes: the ratio ``SetGradsToNone`` (analyses/what_if_host_edits.py) charges a CPU-only trace
for gradients that land on fresh pages once ``zero_grad(set_to_none=True)`` frees them. The
measurement is ``scripts/gen_traces/first_touch.py``'s, the one the calibration captures
record beside their traces.

Usage: python bench/first_touch.py [--mib 48] [--repeats 15]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "gen_traces"))
from first_touch import MIB, REPEATS, first_touch_ratio  # scripts/ is a folder of scripts, not a package


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=MIB)
    ap.add_argument("--repeats", type=int, default=REPEATS)
    args = ap.parse_args()
    load = " ".join(Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3])
    first, warm, ratio = first_touch_ratio(args.mib, args.repeats)
    print(f"{args.mib} MiB, {args.repeats} repeats, load {load}: first touch {first:.2f} ms, "
          f"warm zero_() {warm:.2f} ms, ratio {ratio:.1f}x (torch {torch.__version__})")


if __name__ == "__main__":
    main()
