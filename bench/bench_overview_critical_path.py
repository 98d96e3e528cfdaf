"""What the critical path adds to ``report`` and ``export``: both build the
``Overview``, which now computes the path of at most ``CRITICAL_PATH_STEPS`` steps.

Per trace, in one process, each the median of ``--repeats`` rounds: the whole ``overview`` (the
critical path included), the critical path as the overview computes it (bounded, the report's
steps), and the critical path over every step, to show what the bound saves. The trace is read
once beforehand (with the Parquet cache). Traces: the largest shared Kineto traces, and any
extra paths given (e.g. a 1 GB inflated trace). The table goes to stdout and to
``bench/results_overview_critical_path.md``.

Usage: python bench/bench_overview_critical_path.py [--repeats 3] [--no-write] [EXTRA_TRACE ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracewhy.analyses.critical_path import CriticalPathOptions, critical_path
from tracewhy.readers import read_trace
from tracewhy.reports.overview import CRITICAL_PATH_STEPS, overview

BENCH = Path(__file__).resolve().parent
TRACES = BENCH.parent.parent / "shared" / "traces"
RESULTS = BENCH / "results_overview_critical_path.md"
#: The largest shared Kineto traces: by events (v100) and by bytes (owlv2).
SHARED = ("hta/v100_ddp2_rank1_memprofile.json.gz", "tracelens/h100_owlv2-large_zero-shot.json.gz")


def _median(fn: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    """Median wall and CPU seconds (all threads: robust when other work shares the machine)."""
    wall: list[float] = []
    cpu: list[float] = []
    result: Any = None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu), result


def _row(path: Path, label: str, repeats: int) -> str:
    trace = read_trace(path)
    ov_s, ov_cpu, ov = _median(lambda: overview(trace), repeats)
    steps = ov.report.steps
    bounded = CriticalPathOptions(max_steps=CRITICAL_PATH_STEPS)
    cp_s, cp_cpu, cp = _median(lambda: critical_path(trace, bounded, steps), repeats)
    all_s, all_cpu, every = _median(lambda: critical_path(trace, CriticalPathOptions(), steps), repeats)
    added = cp_cpu / (ov_cpu - cp_cpu) if ov_cpu > cp_cpu else 0.0
    return (f"| {label} | {trace.slices.height:,} | {cp.steps.height} of {every.steps_total} | "
            f"{ov_s:.2f} / {ov_cpu:.2f} | {cp_s:.2f} / {cp_cpu:.2f} | +{added:.0%} | {all_s:.2f} / {all_cpu:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("extra", nargs="*", type=Path, help="more traces (e.g. a 1 GB one; timed once)")
    args = ap.parse_args()
    lines = [
        "# What the critical path adds to report and export (bench_overview_critical_path.py)",
        "",
        f"Median of {args.repeats} rounds in one process (extra traces: one round). `overview`: everything "
        "report and export compute, the critical path included; `path in overview`: the path of at most "
        f"{CRITICAL_PATH_STEPS} steps (steady first) as the overview computes it, and what it adds "
        "to the CPU time of the rest of the overview; `path, every step`: what `tracewhy critical-path` "
        "computes. Each as wall / CPU seconds (CPU of all threads: steadier than wall when other work "
        "shares the machine).",
        "",
        "| trace | slices | steps on the path | overview s | path in overview s | adds (CPU) | path, every step s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for rel in SHARED:
        lines.append(_row(TRACES / rel, rel, args.repeats))
        print(lines[-1], flush=True)
    for path in args.extra:
        lines.append(_row(path, path.name, 1))
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
