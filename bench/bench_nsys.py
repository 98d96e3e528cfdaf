"""Time reading an Nsight Systems export, side by side with NVIDIA's own ``nsys stats``.

Reads the largest export in ../shared/traces/nsys (or --export) with tracewhy's reader, plain
and gzipped, and reports wall time (best and median of --repeat runs) and events per second.
In the same run it times peers on the same uncompressed file: a bare ``sqlite3`` fetch of the
tables the reader reads (a floor: no decoding, no model), and, when an ``nsys`` binary is
available (--nsys, $TRACEWHY_NSYS or PATH), ``nsys stats -r cuda_gpu_kern_sum`` (one SQL
aggregation over one table) and ``nsys stats`` with the nine reports the golden outputs hold,
next to tracewhy computing the same summaries, projection and rules from one read.
NSYS_NOTES.md §6 says how to get nsys without a GPU.

Usage: python bench/bench_nsys.py [--export FILE.sqlite[.gz]] [--repeat N] [--nsys PATH] [--json OUT]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED_NSYS = REPO.parent / "shared" / "traces" / "nsys"
#: The tables the reader selects from (a bare fetch of these is the floor).
TABLES = ("StringIds", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL",
          "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
          "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS", "OSRT_API", "PROFILER_OVERHEAD")


#: The reports golden_nsys-2023.4.4 holds, as its README runs them.
GOLDEN_REPORTS = ("cuda_gpu_kern_sum", "cuda_api_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum",
                  "nvtx_sum", "nvtx_gpu_proj_sum", "nvtx_gpu_proj_trace", "osrt_sum", "cuda_kern_exec_sum")


def largest_export() -> Path:
    exports = sorted(SHARED_NSYS.glob("*.sqlite.gz"), key=lambda p: p.stat().st_size)
    if not exports:
        sys.exit(f"no exports in {SHARED_NSYS}; pass --export")
    return exports[-1]


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def bare_fetch(path: Path) -> int:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.text_factory = bytes
    rows = 0
    for table in TABLES:
        if table in names:
            rows += len(conn.execute(f"SELECT * FROM {table}").fetchall())
    conn.close()
    return rows


def main() -> int:
    sys.path.insert(0, str(REPO / "src"))
    from tracewhy.analyses import nsys_rules
    from tracewhy.analyses.nvtx import gpu_projection, nvtx_summary
    from tracewhy.analyses.summaries import (
        api_summary,
        kernel_summary,
        memory_size_summary,
        memory_time_summary,
    )
    from tracewhy.readers.nsys import read_nsys
    from tracewhy.readers.nsys_export import find_nsys

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--nsys", default=None, help="nsys binary (default $TRACEWHY_NSYS, then PATH)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    export = args.export or largest_export()

    with tempfile.TemporaryDirectory(prefix="tracewhy-bench-") as tmp:
        plain = Path(tmp) / (export.name.removesuffix(".gz"))
        data = export.read_bytes()
        plain.write_bytes(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
        gz = Path(tmp) / (plain.name + ".gz")
        gz.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=6))

        trace = read_nsys(plain)
        events = trace.slices.height
        results: dict[str, dict[str, float | int | str]] = {}

        def record(label: str, times: list[float], note: str = "") -> None:
            best, median = min(times), statistics.median(times)
            results[label] = {"best_s": best, "median_s": median, "runs": len(times),
                              "events_per_s": events / best, "note": note}

        record("tracewhy read_nsys (plain .sqlite)", timed(lambda: read_nsys(plain), args.repeat))
        record("tracewhy read_nsys (.sqlite.gz)", timed(lambda: read_nsys(gz), args.repeat),
               "includes inflating to a temp file")
        record("tracewhy read + kernel summary", timed(lambda: kernel_summary(read_nsys(plain)), args.repeat))
        def everything() -> None:
            t = read_nsys(plain)
            for fn in (kernel_summary, api_summary, memory_time_summary, memory_size_summary,
                       nvtx_summary, gpu_projection, nsys_rules.pageable_async_memcpy,
                       nsys_rules.sync_memcpy, nsys_rules.sync_memset, nsys_rules.sync_api_calls,
                       nsys_rules.gpu_gaps, nsys_rules.gpu_low_utilization):
                fn(t)

        record("tracewhy read + all summaries/proj/rules", timed(everything, args.repeat),
               "what the 9 nsys reports and 6 rules give")
        record("sqlite3 bare fetch of the same tables", timed(lambda: bare_fetch(plain), args.repeat),
               f"{bare_fetch(plain)} rows as raw tuples, no decoding")
        nsys = find_nsys(args.nsys)
        if nsys is not None:
            out = Path(tmp) / "stats"

            def run_nsys() -> None:
                subprocess.run([nsys, "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv",
                                "--force-export=false", "--force-overwrite=true", "--output", str(out),
                                str(plain)], check=True, capture_output=True)

            record("nsys stats -r cuda_gpu_kern_sum", timed(run_nsys, args.repeat),
                   _nsys_version(nsys))

            def run_nsys_all() -> None:
                subprocess.run([nsys, "stats", "--report", ",".join(GOLDEN_REPORTS), "--format", "csv",
                                "--force-export=false", "--force-overwrite=true", "--output", str(out),
                                str(plain)], check=True, capture_output=True)

            record("nsys stats (the 9 golden reports)", timed(run_nsys_all, args.repeat),
                   "rules (nsys analyze) not included")
        else:
            results["nsys stats -r cuda_gpu_kern_sum"] = {"note": "nsys not found (NSYS_NOTES.md §6)"}

    print(f"export: {export.name}  ({plain_size(export)} uncompressed, {events} events in the model)")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.repeat} runs each\n")
    print(f"{'what':42} {'best':>9} {'median':>9} {'events/s':>12}  note")
    for label, r in results.items():
        if "best_s" in r:
            print(f"{label:42} {r['best_s']:8.3f}s {r['median_s']:8.3f}s {r['events_per_s']:12,.0f}  {r['note']}")
        else:
            print(f"{label:42} {'-':>9} {'-':>9} {'-':>12}  {r['note']}")
    if args.json:
        args.json.write_text(json.dumps({"export": export.name, "events": events, "results": results}, indent=2))
    return 0


def plain_size(path: Path) -> str:
    data = path.read_bytes()
    n = len(gzip.decompress(data)) if data[:2] == b"\x1f\x8b" else len(data)
    return f"{n / 1e6:.1f} MB"


def _nsys_version(nsys: str) -> str:
    try:
        done = subprocess.run([nsys, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return shutil.which(nsys) or nsys
    return done.stdout.strip().split("version")[-1].strip() or nsys


if __name__ == "__main__":
    sys.exit(main())
