"""Time reading an Nsight Systems export, side by side with NVIDIA's own ``nsys stats``.

One run, same uncompressed copy of the largest export in ../shared/traces/nsys (or --export),
all measurements interleaved round by round so that load on a shared machine hits them alike:

- whole processes, wall time from spawn to exit: ``nsys stats -r cuda_gpu_kern_sum``,
  ``-r nvtx_sum,nvtx_gpu_proj_sum`` and the nine reports the golden outputs hold (when an
  ``nsys`` binary is found: --nsys, $TRACEWHY_NSYS or PATH; NSYS_NOTES.md §6 says how to get
  one without a GPU), ``tracewhy kernels --json FILE`` and ``tracewhy nvtx --json FILE`` (cache
  off, so they parse the file as nsys does), and the floors any Python tool pays:
  ``python -c pass`` and ``python -c "import polars"``;
- in this process, after imports: ``read_nsys`` whole and kernels-only, kernels-only read plus
  the kernel summary, the whole read plus every summary, projection and rule, the whole read
  of the gzipped file, and a bare row-by-row ``sqlite3`` fetch of the reader's tables (what a
  reader that makes a Python tuple per row cannot go below; ours lets SQLite aggregate).

The like-for-like comparisons are whole processes: ``tracewhy kernels`` against ``nsys stats -r
cuda_gpu_kern_sum`` and ``tracewhy nvtx`` against ``-r nvtx_sum,nvtx_gpu_proj_sum``; each
starts, opens the file, answers the same question and exits. The
in-process times leave out Python's start and imports, which nsys's embedded interpreter
does not pay in the same way; they are shown as what the reader itself costs.

The same comparison on a large export (0.6 GB, 1 M kernels, built by bench/inflate_nsys.py), with
peak RSS and ``nsys analyze`` against ``diagnose``, is bench/bench_nsys_scale.py.

Usage: python bench/bench_nsys.py [--export FILE.sqlite[.gz]] [--repeat N] [--nsys PATH]
           [--json OUT] [--md OUT (default bench/results_nsys.md; '-' for none)]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyc_cache

REPO = Path(__file__).resolve().parent.parent
SHARED_NSYS = REPO.parent / "shared" / "traces" / "nsys"
#: The tables the reader selects from (a bare fetch of these is the floor).
TABLES = ("StringIds", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL",
          "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
          "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS", "OSRT_API", "PROFILER_OVERHEAD")
#: The reports golden_nsys-2023.4.4 holds, as its README runs them.
GOLDEN_REPORTS = ("cuda_gpu_kern_sum", "cuda_api_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum",
                  "nvtx_sum", "nvtx_gpu_proj_sum", "nvtx_gpu_proj_trace", "osrt_sum", "cuda_kern_exec_sum")


@dataclass
class Measure:
    label: str
    where: str  # "process" (wall, spawn to exit) or "in-process" (after imports)
    run: Callable[[], object]
    note: str = ""
    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)


def largest_export() -> Path:
    exports = sorted(SHARED_NSYS.glob("*.sqlite.gz"), key=lambda p: p.stat().st_size)
    if not exports:
        sys.exit(f"no exports in {SHARED_NSYS}; pass --export")
    return exports[-1]


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


def process(argv: list[str], env: dict[str, str] | None = None) -> Callable[[], object]:
    def run() -> None:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return run


def main() -> int:
    sys.path.insert(0, str(REPO / "src"))
    from tracewhy.analyses import nsys_rules
    from tracewhy.analyses.kernels import kernels
    from tracewhy.analyses.nvtx import gpu_projection, nvtx_summary
    from tracewhy.analyses.summaries import (
        api_summary,
        kernel_summary,
        memory_size_summary,
        memory_time_summary,
    )
    from tracewhy.model.schema import Kind
    from tracewhy.readers.nsys.export import find_nsys
    from tracewhy.readers.nsys.reader import read_nsys

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--nsys", default=None, help="nsys binary (default $TRACEWHY_NSYS, then PATH)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--md", default=str(REPO / "bench" / "results_nsys.md"),
                    help="write a markdown table here ('-': don't)")
    args = ap.parse_args()
    pyc_cache.as_installed()
    export = args.export or largest_export()
    nsys = find_nsys(args.nsys)
    load_start = os.getloadavg()

    with tempfile.TemporaryDirectory(prefix="tracewhy-bench-") as tmp:
        plain = Path(tmp) / (export.name.removesuffix(".gz"))
        data = export.read_bytes()
        plain.write_bytes(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
        gz = Path(tmp) / (plain.name + ".gz")
        gz.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=6))
        plain_bytes = plain.stat().st_size
        whole = read_nsys(plain)
        events = whole.slices.height
        kernel_count = read_nsys(plain, kinds=[Kind.KERNEL]).slices.height
        fetched_rows = bare_fetch(plain)
        # The CLI without its parsed-trace cache: it must parse the file, as nsys does.
        env = {**os.environ, "TRACEWHY_NO_CACHE": "1", "TRACEWHY_CACHE_DIR": str(Path(tmp) / "cache")}

        def everything() -> None:
            t = read_nsys(plain)
            for fn in (kernel_summary, api_summary, memory_time_summary, memory_size_summary,
                       nvtx_summary, gpu_projection, nsys_rules.pageable_async_memcpy,
                       nsys_rules.sync_memcpy, nsys_rules.sync_memset, nsys_rules.sync_api_calls,
                       nsys_rules.gpu_gaps, nsys_rules.gpu_low_utilization):
                fn(t)

        measures = []
        if nsys is not None:
            out = str(Path(tmp) / "stats")
            common = ["--format", "csv", "--force-export=false", "--force-overwrite=true", "--output", out]
            measures += [
                Measure("nsys stats -r cuda_gpu_kern_sum", "process",
                        process([nsys, "stats", "--report", "cuda_gpu_kern_sum", *common, str(plain)]),
                        f"nsys {_nsys_version(nsys)}: one SQL aggregation, embedded Python"),
                Measure("nsys stats -r nvtx_sum,nvtx_gpu_proj_sum", "process",
                        process([nsys, "stats", "--report", "nvtx_sum,nvtx_gpu_proj_sum", *common, str(plain)])),
                Measure("nsys stats (the 9 golden reports)", "process",
                        process([nsys, "stats", "--report", ",".join(GOLDEN_REPORTS), *common, str(plain)])),
            ]
        measures += [
            Measure("tracewhy kernels --json FILE", "process",
                    process([sys.executable, "-m", "tracewhy", "kernels", "--json", str(plain)], env),
                    "cache off; kernels-only read + summary + JSON"),
            Measure("tracewhy nvtx --json FILE", "process",
                    process([sys.executable, "-m", "tracewhy", "nvtx", "--json", str(plain)], env),
                    "cache off; whole read + NVTX summary + projection + JSON"),
            Measure("python -c pass", "process", process([sys.executable, "-c", "pass"]),
                    "floor: interpreter start"),
            Measure('python -c "import polars"', "process",
                    process([sys.executable, "-c", "import polars"]), "floor: start + polars import"),
            Measure("read_nsys, kernels only", "in-process", lambda: read_nsys(plain, kinds=[Kind.KERNEL]),
                    f"{kernel_count} kernel rows"),
            Measure("read_nsys kernels only + kernels()", "in-process",
                    lambda: kernels(read_nsys(plain, kinds=[Kind.KERNEL])), "what `tracewhy kernels` computes"),
            Measure("read_nsys, whole", "in-process", lambda: read_nsys(plain), f"{events} events"),
            Measure("read_nsys, whole, .sqlite.gz", "in-process", lambda: read_nsys(gz),
                    "includes inflating to a temp file"),
            Measure("read_nsys whole + all summaries/proj/rules", "in-process", everything,
                    "what the 9 nsys reports and 6 rules give"),
            Measure("sqlite3 bare fetch of the same tables", "in-process", lambda: bare_fetch(plain),
                    f"{fetched_rows} rows, every column, as Python tuples: the row-by-row floor"),
        ]
        for m in measures:  # warm the page cache and the interpreters once
            m.run()
        for _ in range(args.repeat):
            for m in measures:
                t0 = time.perf_counter()
                m.run()
                m.times.append(time.perf_counter() - t0)
    load_end = os.getloadavg()

    by = {m.label: m for m in measures}
    ratios = []
    if nsys is not None:
        ref = by["nsys stats -r cuda_gpu_kern_sum"].median
        ratios = [
            ("tracewhy kernels process / nsys stats -r cuda_gpu_kern_sum process",
             by["tracewhy kernels --json FILE"].median / ref, "like-for-like: both whole processes"),
            ("tracewhy nvtx process / nsys stats -r nvtx_sum,nvtx_gpu_proj_sum process",
             by["tracewhy nvtx --json FILE"].median / by["nsys stats -r nvtx_sum,nvtx_gpu_proj_sum"].median,
             "like-for-like: both whole processes"),
            ("python -c 'import polars' process / nsys cuda_gpu_kern_sum process",
             by['python -c "import polars"'].median / ref, "the floor of any polars-based Python tool"),
            ("in-process kernels-only read + kernels() / nsys cuda_gpu_kern_sum process",
             by["read_nsys kernels only + kernels()"].median / ref,
             "NOT like-for-like: leaves out our interpreter start and imports"),
            ("in-process whole read / nsys cuda_gpu_kern_sum process", by["read_nsys, whole"].median / ref,
             "NOT like-for-like: reads every table, leaves out start and imports"),
            ("in-process whole read + all summaries / nsys 9 reports process",
             by["read_nsys whole + all summaries/proj/rules"].median / by["nsys stats (the 9 golden reports)"].median,
             "NOT like-for-like: leaves out start and imports (~0.2-0.3 s), adds the 6 rules"),
        ]
    ratios.append(("in-process whole read / bare sqlite3 row fetch",
                   by["read_nsys, whole"].median / by["sqlite3 bare fetch of the same tables"].median,
                   "the whole model vs only fetching the rows as tuples"))

    head = (f"export: {export.name} ({plain_bytes / 1e6:.1f} MB uncompressed, {events} events in the "
            f"model, {kernel_count} kernels)")
    machine = (f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
               f"{load_start[0]:.2f} at start, {load_end[0]:.2f} at end; {args.repeat} interleaved runs each")
    print(head)
    print(machine + "\n")
    print(f"{'what':44} {'where':10} {'median':>9} {'best':>9} {'events/s':>11}  note")
    for m in measures:
        rate = f"{events / m.median:11,.0f}" if "whole" in m.label else f"{'':11}"
        print(f"{m.label:44} {m.where:10} {m.median:8.3f}s {m.best:8.3f}s {rate}  {m.note}")
    print()
    for label, value, note in ratios:
        print(f"{label:78} {value:6.2f}x  {note}")
    if args.json:
        args.json.write_text(json.dumps({
            "export": export.name, "events": events, "load_average": [load_start[0], load_end[0]],
            "results": {m.label: {"where": m.where, "median_s": m.median, "best_s": m.best, "runs": len(m.times),
                                  "note": m.note} for m in measures},
            "ratios": {label: value for label, value, _ in ratios},
        }, indent=2))
    if args.md != "-":
        Path(args.md).write_text(_markdown(head, f"{machine}; tracewhy {_revision()}", measures, ratios,
                                           nsys is not None))
    return 0


def _markdown(head: str, machine: str, measures: list[Measure],
              ratios: list[tuple[str, float, str]], have_nsys: bool) -> str:
    lines = [
        "# Reading an nsys export: tracewhy vs `nsys stats`",
        "",
        "Written by `python bench/bench_nsys.py --nsys PATH` (NSYS_NOTES.md §6 says how to get nsys).",
        "",
        head + ".",
        machine + ".",
        "",
        "| what | where | median s | best s | note |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    lines += [f"| {m.label} | {m.where} | {m.median:.3f} | {m.best:.3f} | {m.note} |" for m in measures]
    lines += ["", "| ratio of medians | x | comparison |", "| --- | ---: | --- |"]
    lines += [f"| {label} | {value:.2f} | {note} |" for label, value, note in ratios]
    if not have_nsys:
        lines += ["", "nsys was not found: only tracewhy's own times are shown."]
        return "\n".join(lines) + "\n"
    by = {label: value for label, value, _ in ratios}
    process = by["tracewhy kernels process / nsys stats -r cuda_gpu_kern_sum process"]
    floor = by["python -c 'import polars' process / nsys cuda_gpu_kern_sum process"]
    inside = by["in-process kernels-only read + kernels() / nsys cuda_gpu_kern_sum process"]
    whole = by["in-process whole read / nsys cuda_gpu_kern_sum process"]
    lines += [
        "",
        "The target, reading the largest export faster than `nsys stats -r cuda_gpu_kern_sum`:",
        f"{'met' if inside < 1 else 'not met'} in-process by the kernels-only read that `tracewhy kernels` "
        f"does ({inside:.2f}x nsys's whole run); {'met' if process < 1 else 'not met'} as a whole process "
        f"({process:.2f}x), where starting Python and importing polars alone take {floor:.2f}x; the whole "
        f"read of every table in-process takes {whole:.2f}x.",
    ]
    return "\n".join(lines) + "\n"


def _revision() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "revision unknown"
    return f"{rev}{' with uncommitted src/ changes' if dirty else ''}" if rev else "revision unknown"


def _nsys_version(nsys: str) -> str:
    try:
        done = subprocess.run([nsys, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return shutil.which(nsys) or nsys
    return done.stdout.strip().split("version")[-1].strip().split("-")[0] or nsys


if __name__ == "__main__":
    sys.exit(main())
