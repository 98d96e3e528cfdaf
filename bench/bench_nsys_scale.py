"""tracewhy against NVIDIA's own tools on a large, realistic Nsight Systems export.

The export is built by bench/inflate_nsys.py (every activity table of the nsys-ai
``nsysai_mfu_2gpu_before`` export replicated, 250x by default: ~0.6 GB, 1 M kernels, 4.8 M NVTX
ranges, 1.9 M CUDA API calls) in a temporary folder, never in the repo. Whole processes, each
run's wall time from spawn to exit and its own peak RSS (``os.wait4``), interleaved round by
round so that load on a shared machine hits all of them alike:

- ``nsys stats --report cuda_gpu_kern_sum`` against ``tracewhy kernels --json`` (also without
  the optional ADBC driver, ``TRACEWHY_NSYS_ADBC=0``: what a plain install does);
- ``nsys analyze`` (the six rules the golden outputs hold) against ``tracewhy diagnose --json``.

tracewhy runs without its parsed-trace cache (it parses the file as nsys does). nsys comes from
--nsys, $TRACEWHY_NSYS or PATH (NSYS_NOTES.md §6 installs 2023.4.4 without a GPU).

Usage: python bench/bench_nsys_scale.py [--copies 250] [--export OUT.sqlite (reuse)] [--repeat 3]
           [--skip-diagnose] [--before OLD_SRC_DIR] [--md OUT (default bench/results_nsys_scale.md; '-': none)]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyc_cache

REPO = Path(__file__).resolve().parent.parent
RULES = "cuda_memcpy_async,cuda_memcpy_sync,cuda_memset_sync,cuda_api_sync,gpu_gaps,gpu_time_util"


@dataclass
class Run:
    label: str
    argv: list[str]
    env: dict[str, str] | None = None
    times: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # user + system seconds, all threads

    def once(self, out: Path) -> None:
        t0 = time.perf_counter()
        with open(out, "wb") as sink:
            proc = subprocess.Popen(self.argv, stdout=sink, stderr=subprocess.DEVNULL, env=self.env)
            _, status, usage = os.wait4(proc.pid, 0)
        self.times.append(time.perf_counter() - t0)
        self.rss_mb.append(usage.ru_maxrss / 1024)  # KiB on Linux
        self.cpu.append(usage.ru_utime + usage.ru_stime)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            sys.exit(f"{self.label} failed with exit code {proc.returncode}")

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def main() -> int:
    sys.path.insert(0, str(REPO / "src"))
    from tracewhy.readers.nsys.export import find_nsys

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=250)
    ap.add_argument("--export", type=Path, default=None, help="an inflated export to reuse (built if missing)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nsys", default=None)
    ap.add_argument("--skip-diagnose", action="store_true", help="kernels and nsys stats only")
    ap.add_argument("--md", default=str(REPO / "bench" / "results_nsys_scale.md"))
    ap.add_argument("--before", type=Path, default=None,
                    help="an older src/ folder (git archive REV src | tar -x -C DIR): its tracewhy runs too")
    args = ap.parse_args()
    pyc_cache.as_installed()
    nsys = find_nsys(args.nsys)
    if nsys is None:
        sys.exit("nsys not found: pass --nsys (NSYS_NOTES.md §6 says how to get it without a GPU)")

    with tempfile.TemporaryDirectory(prefix="tracewhy-bench-scale-") as tmp:
        export = args.export or Path(tmp) / f"inflated_{args.copies}x.sqlite"
        if not export.exists():
            subprocess.run([sys.executable, str(REPO / "bench" / "inflate_nsys.py"), str(export),
                            "--copies", str(args.copies)], check=True, stdout=subprocess.DEVNULL)
        size_mb = export.stat().st_size / 1e6
        counts = _counts(export)
        env = {**os.environ, "TRACEWHY_NO_CACHE": "1"}
        plain = {**env, "TRACEWHY_NSYS_ADBC": "0"}
        tw = [sys.executable, "-m", "tracewhy"]
        common = ["--force-export=false", "--force-overwrite=true"]
        runs = [
            Run("nsys stats --report cuda_gpu_kern_sum", [nsys, "stats", "--report", "cuda_gpu_kern_sum",
                "--format", "csv", *common, "--output", str(Path(tmp) / "stats"), str(export)]),
            Run("tracewhy kernels --json", [*tw, "kernels", "--json", str(export)], env),
            Run("tracewhy kernels --json (no ADBC)", [*tw, "kernels", "--json", str(export)], plain),
        ]
        before = {**env, "PYTHONPATH": str(args.before.resolve())} if args.before else None
        if before is not None:
            runs.append(Run("tracewhy kernels --json (before)", [*tw, "kernels", "--json", str(export)], before))
        if not args.skip_diagnose:
            runs += [
                Run("nsys analyze (6 rules)", [nsys, "analyze", "--rule", RULES, "--format", "csv", *common,
                    "--output", str(Path(tmp) / "analyze"), str(export)]),
                Run("tracewhy diagnose --json", [*tw, "diagnose", "--json", str(export)], env),
                Run("tracewhy diagnose --json (no ADBC)", [*tw, "diagnose", "--json", str(export)], plain),
            ]
            if before is not None:
                runs.append(Run("tracewhy diagnose --json (before)", [*tw, "diagnose", "--json", str(export)], before))
        load = [os.getloadavg()[0]]
        for _ in range(args.repeat):
            for i, r in enumerate(runs):
                r.once(Path(tmp) / f"out{i}.txt")
                print(f"{r.label:40} {r.times[-1]:8.2f} s {r.cpu[-1]:8.2f} s CPU {r.rss_mb[-1]:8.0f} MB "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
                load.append(os.getloadavg()[0])
        agree = _same_totals(Path(tmp) / "stats_cuda_gpu_kern_sum.csv", Path(tmp) / "out1.txt")
    lines = _markdown(runs, size_mb, counts, load, args)
    lines += ["", agree]
    print("\n".join(lines))
    if args.md != "-":
        Path(args.md).write_text("\n".join(lines) + "\n")
    return 0


def _same_totals(stats_csv: Path, kernels_json: Path) -> str:
    """Whether both tools count the same kernels and the same total kernel time."""
    import csv
    import json

    with open(stats_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    theirs = (sum(int(r["Instances"]) for r in rows), sum(int(r["Total Time (ns)"]) for r in rows))
    payload = json.loads(kernels_json.read_text())
    ours = (int(payload["total_count"]), int(payload["total_time_ns"]))
    verdict = "the same" if ours == theirs else "DIFFERENT"
    return (f"Kernel count and total time: nsys stats {theirs[0]:,} kernels, {theirs[1]:,} ns; tracewhy "
            f"{ours[0]:,} kernels, {ours[1]:,} ns: {verdict}.")


def _counts(export: Path) -> dict[str, int]:
    import sqlite3

    conn = sqlite3.connect(f"{export.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    out = {}
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_MEMCPY",
              "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "OSRT_API"):
        if t in names:
            out[t] = conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
    conn.close()
    return out


def _markdown(runs: list[Run], size_mb: float, counts: dict[str, int], load: list[float],
              args: argparse.Namespace) -> list[str]:
    by = {r.label: r for r in runs}
    lines = [
        "# tracewhy vs nsys on a large export",
        "",
        "Written by `python bench/bench_nsys_scale.py` (NSYS_NOTES.md §6 installs nsys 2023.4.4 without a GPU).",
        "",
        f"Export: bench/inflate_nsys.py, nsysai_mfu_2gpu_before x {args.copies}: {size_mb:.0f} MB; "
        + ", ".join(f"{t.removeprefix('CUPTI_ACTIVITY_KIND_').lower()} {n:,}" for t, n in counts.items()) + ".",
        f"python {platform.python_version()}, {os.cpu_count()} CPUs shared with other work: load average "
        f"{min(load):.1f} to {max(load):.1f} (median {statistics.median(load):.1f}) during the runs; "
        f"{args.repeat} interleaved runs each, whole processes, tracewhy without its cache.",
        "",
        "| what | median wall s | best wall s | median CPU s (user+sys) | peak RSS MB (max) | RSS / file |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [f"| {r.label} | {r.median:.2f} | {min(r.times):.2f} | {statistics.median(r.cpu):.2f} | "
              f"{max(r.rss_mb):.0f} | {max(r.rss_mb) / size_mb:.2f} |" for r in runs]
    stats, kern = by["nsys stats --report cuda_gpu_kern_sum"], by["tracewhy kernels --json"]
    checks = [
        ("kernels >= 1.5x faster than nsys stats", stats.median / kern.median, 1.5, "x"),
        ("the same, in CPU time (less sensitive to load)",
         statistics.median(stats.cpu) / statistics.median(kern.cpu), 1.5, "x"),
        ("kernels peak RSS <= file size", max(kern.rss_mb) / size_mb, 1.0, "of file"),
    ]
    if "tracewhy diagnose --json" in by:
        diag, analyze = by["tracewhy diagnose --json"], by["nsys analyze (6 rules)"]
        checks += [
            ("diagnose <= 3x kernels", diag.median / kern.median, 3.0, "x kernels"),
            ("diagnose peak RSS <= 2x file size", max(diag.rss_mb) / size_mb, 2.0, "of file"),
            ("diagnose >= 2x faster than nsys analyze", analyze.median / diag.median, 2.0, "x"),
            ("the same, in CPU time (less sensitive to load)",
             statistics.median(analyze.cpu) / statistics.median(diag.cpu), 2.0, "x"),
        ]
    lines += ["", "| target | measured | met |", "| --- | ---: | --- |"]
    for label, value, bound, unit in checks:
        met = value >= bound if "faster" in label or "CPU time" in label else value <= bound
        lines.append(f"| {label} | {value:.2f} {unit} | {'yes' if met else 'no'} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
