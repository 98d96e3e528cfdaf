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
--nsys, $TRACEWHY_NSYS or PATH (NSYS_NOTES.md §6 installs 2023.4.4 without a GPU); without it,
tracewhy's rows run alone and the nsys rows are those of the results file being replaced, marked
so. Each run's address space is bounded (--limit-gb) so that a runaway cannot take a shared
machine; a run that fails (out of memory, say) is a row saying so, with its time and peak RSS.

Usage: python bench/bench_nsys_scale.py [--copies 250] [--export OUT.sqlite (reuse)] [--repeat 3]
           [--skip-diagnose] [--before OLD_SRC_DIR] [--limit-gb 16]
           [--md OUT (default bench/results_nsys_scale.md; '-': none)]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyc_cache

REPO = Path(__file__).resolve().parent.parent
#: How a row of nsys kept from an earlier results file is labelled (bench/speed_section.py reads it).
KEPT_MARK = " (earlier run, kept: nsys not installed)"
RULES = "cuda_memcpy_async,cuda_memcpy_sync,cuda_memset_sync,cuda_api_sync,gpu_gaps,gpu_time_util"


@dataclass
class Run:
    label: str
    argv: list[str]
    env: dict[str, str] | None = None
    times: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # user + system seconds, all threads
    failed: list[int] = field(default_factory=list)  # exit codes of runs that failed
    #: A row of an earlier results file (nsys not installed here): printed as it was.
    kept_row: str | None = None

    def once(self, out: Path, limit_bytes: int) -> None:
        def bounded() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

        t0 = time.perf_counter()
        with open(out, "wb") as sink:
            proc = subprocess.Popen(self.argv, stdout=sink, stderr=subprocess.DEVNULL, env=self.env,
                                    preexec_fn=bounded)
            _, status, usage = os.wait4(proc.pid, 0)
        self.times.append(time.perf_counter() - t0)
        self.rss_mb.append(usage.ru_maxrss / 1024)  # KiB on Linux
        self.cpu.append(usage.ru_utime + usage.ru_stime)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            self.failed.append(code)

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
    ap.add_argument("--limit-gb", type=float, default=16.0, help="address-space bound of each run (RLIMIT_AS)")
    ap.add_argument("--before", type=Path, default=None,
                    help="an older src/ folder (git archive REV src | tar -x -C DIR): its tracewhy runs too")
    args = ap.parse_args()
    pyc_cache.as_installed()
    nsys = find_nsys(args.nsys)
    kept = _kept_nsys_rows(Path(args.md)) if nsys is None and args.md != "-" else {}
    if nsys is None:
        print("nsys not found (NSYS_NOTES.md §6 says how to get it without a GPU): its rows are kept from "
              f"{args.md}" if kept else "nsys not found: tracewhy's rows only", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="tracewhy-bench-scale-") as tmp:
        export = args.export or Path(tmp) / f"inflated_{args.copies}x.sqlite"
        if not export.exists():
            subprocess.run([sys.executable, str(REPO / "bench" / "inflate_nsys.py"), str(export),
                            "--copies", str(args.copies)], check=True, stdout=subprocess.DEVNULL)
        size_mb = export.stat().st_size / 1e6
        counts = _counts(export)
        # This tree's tracewhy, whatever the environment's install points at.
        env = {**os.environ, "TRACEWHY_NO_CACHE": "1", "PYTHONPATH": str(REPO / "src")}
        plain = {**env, "TRACEWHY_NSYS_ADBC": "0"}
        tw = [sys.executable, "-m", "tracewhy"]
        common = ["--force-export=false", "--force-overwrite=true"]
        stats_label, analyze_label = "nsys stats --report cuda_gpu_kern_sum", "nsys analyze (6 rules)"
        runs = [
            Run(stats_label, [str(nsys), "stats", "--report", "cuda_gpu_kern_sum",
                "--format", "csv", *common, "--output", str(Path(tmp) / "stats"), str(export)],
                kept_row=kept.get(stats_label)),
            Run("tracewhy kernels --json", [*tw, "kernels", "--json", str(export)], env),
            Run("tracewhy kernels --json (no ADBC)", [*tw, "kernels", "--json", str(export)], plain),
        ]
        before = {**env, "PYTHONPATH": str(args.before.resolve())} if args.before else None
        if before is not None:
            runs.append(Run("tracewhy kernels --json (before)", [*tw, "kernels", "--json", str(export)], before))
        if not args.skip_diagnose:
            runs += [
                Run(analyze_label, [str(nsys), "analyze", "--rule", RULES, "--format", "csv", *common,
                    "--output", str(Path(tmp) / "analyze"), str(export)], kept_row=kept.get(analyze_label)),
                Run("tracewhy diagnose --json", [*tw, "diagnose", "--json", str(export)], env),
                Run("tracewhy diagnose --json (no ADBC)", [*tw, "diagnose", "--json", str(export)], plain),
            ]
            if before is not None:
                runs.append(Run("tracewhy diagnose --json (before)", [*tw, "diagnose", "--json", str(export)], before))
        if nsys is None:
            runs = [r for r in runs if r.kept_row is not None or not r.label.startswith("nsys ")]
        load = [os.getloadavg()[0]]
        for _ in range(args.repeat):
            for i, r in enumerate(runs):
                if r.kept_row is not None:
                    continue
                r.once(Path(tmp) / f"out{i}.txt", int(args.limit_gb * 2**30))
                failed = f" FAILED (exit {r.failed[-1]})" if len(r.failed) == len(r.times) and r.failed else ""
                print(f"{r.label:40} {r.times[-1]:8.2f} s {r.cpu[-1]:8.2f} s CPU {r.rss_mb[-1]:8.0f} MB "
                      f"(load {os.getloadavg()[0]:.1f}){failed}", flush=True)
                load.append(os.getloadavg()[0])
        kernels_at = next(i for i, r in enumerate(runs) if r.label == "tracewhy kernels --json")
        kernels_out = Path(tmp) / f"out{kernels_at}.txt"
        agree = (_same_totals(Path(tmp) / "stats_cuda_gpu_kern_sum.csv", kernels_out) if nsys is not None else
                 f"Kernel count and total time: tracewhy {_kernel_totals(kernels_out)} (nsys not run here).")
    lines = _markdown(runs, size_mb, counts, load, args)
    lines += ["", agree]
    print("\n".join(lines))
    if args.md != "-":
        Path(args.md).write_text("\n".join(lines) + "\n")
    return 0


def _kept_nsys_rows(md: Path) -> dict[str, str]:
    """The nsys rows of an earlier results file, by label, unmarked: a row that file kept from a
    file before it keeps its figures and is marked once when written again."""
    if not md.exists():
        return {}
    rows = [line.replace(KEPT_MARK, "") for line in md.read_text().splitlines() if line.startswith("| nsys ")]
    return {row.split("|")[1].strip(): row for row in rows}


def _kernel_totals(kernels_json: Path) -> str:
    import json

    payload = json.loads(kernels_json.read_text())
    return f"{int(payload['total_count']):,} kernels, {int(payload['total_time_ns']):,} ns"


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


def _numba_note() -> str:
    """Whether this tree's runs had numba (the ``fast`` extra), which compiles the critical path's
    loops on large windows (src/tracewhy/model/compiled.py); a "before" tree may not use it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"numba {version('numba')} installed (the `fast` extra: compiled replay and walk on large windows)."
    except PackageNotFoundError:
        return "numba not installed (the `fast` extra): the critical path's loops run in Python."


def _markdown(runs: list[Run], size_mb: float, counts: dict[str, int], load: list[float],
              args: argparse.Namespace) -> list[str]:
    by = {r.label: r for r in runs}
    if any(r.failed for r in runs if r.label == "tracewhy diagnose --json"):
        by.pop("tracewhy diagnose --json")  # no target to check on a run that failed
    lines = [
        "# tracewhy vs nsys on a large export",
        "",
        "Written by `python bench/bench_nsys_scale.py` (NSYS_NOTES.md §6 installs nsys 2023.4.4 without a GPU).",
        "",
        f"Export: bench/inflate_nsys.py, nsysai_mfu_2gpu_before x {args.copies}: {size_mb:.0f} MB; "
        + ", ".join(f"{t.removeprefix('CUPTI_ACTIVITY_KIND_').lower()} {n:,}" for t, n in counts.items()) + ".",
        f"python {platform.python_version()}, {os.cpu_count()} CPUs shared with other work: load average "
        f"{min(load):.1f} to {max(load):.1f} (median {statistics.median(load):.1f}) during the runs; "
        f"{args.repeat} interleaved runs each, whole processes, tracewhy without its cache. {_numba_note()}",
        "",
        "| what | median wall s | best wall s | median CPU s (user+sys) | peak RSS MB (max) | RSS / file |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        if r.kept_row is not None:
            lines.append(r.kept_row.replace(f"| {r.label} |", f"| {r.label}{KEPT_MARK} |"))
            continue
        failed = f" (failed in {len(r.failed)} of {len(r.times)} runs: exit {r.failed[-1]})" if r.failed else ""
        lines.append(f"| {r.label}{failed} | {r.median:.2f} | {min(r.times):.2f} | {statistics.median(r.cpu):.2f} | "
                     f"{max(r.rss_mb):.0f} | {max(r.rss_mb) / size_mb:.2f} |")
    stats, kern = _figures(by["nsys stats --report cuda_gpu_kern_sum"]), _figures(by["tracewhy kernels --json"])
    checks = [
        ("kernels >= 1.5x faster than nsys stats", stats[0] / kern[0], 1.5, "x"),
        ("the same, in CPU time (less sensitive to load)", stats[1] / kern[1], 1.5, "x"),
        ("kernels peak RSS <= file size", kern[2] / size_mb, 1.0, "of file"),
    ]
    if "tracewhy diagnose --json" in by:
        diag, analyze = _figures(by["tracewhy diagnose --json"]), _figures(by["nsys analyze (6 rules)"])
        checks += [
            ("diagnose <= 3x kernels", diag[0] / kern[0], 3.0, "x kernels"),
            ("diagnose peak RSS <= 2x file size", diag[2] / size_mb, 2.0, "of file"),
            ("diagnose >= 2x faster than nsys analyze", analyze[0] / diag[0], 2.0, "x"),
            ("the same, in CPU time (less sensitive to load)", analyze[1] / diag[1], 2.0, "x"),
        ]
    lines += ["", "| target | measured | met |", "| --- | ---: | --- |"]
    for label, value, bound, unit in checks:
        met = value >= bound if "faster" in label or "CPU time" in label else value <= bound
        lines.append(f"| {label} | {value:.2f} {unit} | {'yes' if met else 'no'} |")
    return lines


def _figures(run: Run) -> tuple[float, float, float]:
    """Median wall s, median CPU s and peak RSS MB of a run (of a kept row: as it was written)."""
    if run.kept_row is not None:
        cells = [c.strip() for c in run.kept_row.strip("|").split("|")]
        return float(cells[1]), float(cells[3]), float(cells[4])
    return run.median, statistics.median(run.cpu), max(run.rss_mb)


if __name__ == "__main__":
    sys.exit(main())
