"""Where ``tracewhy ranks`` should stop reading in its own process and start a worker pool.

A pool costs a fresh interpreter per worker (spawned: polars' thread pool does not survive a
fork), each importing polars and tracewhy before it reads anything, plus pickling each rank's
summary back; it pays off once the parsing it spreads over the cores outweighs that. This
measures both ways on the same files: ``--workers 0`` (read here) against ``--workers N``
(N = min(files, CPUs), what the default used to be), for 2, 4 and 8 rank files of 0.1, 1, 10
and 50 MB each, in fresh processes with the parse cache off, wall and CPU seconds (the
process and its workers). The crossover in ``tracewhy.reports.ranks`` is the total size
where the pool starts to win on wall time.

The rank files are HTA's tracecompare_tiny_base_rank1 trace (a real two-step trace) inflated
with bench/inflate.py, written out as ranks 0..7 with the rank in ``distributedInfo``
rewritten, to the git-ignored bench/out/ranks_crossover/ (made once).

Usage: python bench/bench_ranks_crossover.py [--repeats 3] [--sizes-mb 0.1,1,10,50] [--counts 2,4,8]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from inflate import inflate  # noqa: E402 - bench/ is not a package

REPO = BENCH.parent
SOURCE = REPO.parent / "shared/traces/hta/tracecompare_tiny_base_rank1.json.gz"
OUT = BENCH / "out" / "ranks_crossover"
RESULTS = BENCH / "results_ranks_crossover.md"
_RANK = b'"distributedInfo": {"rank": 1}'


def rank_files(size_mb: float, count: int) -> Path:
    """A directory of ``count`` rank files of about ``size_mb`` MB each (made once)."""
    folder = OUT / f"{size_mb:g}mb_x{count}"
    files = [folder / f"job_rank{r}.json" for r in range(count)]
    if all(f.exists() for f in files):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    big = OUT / f"source_{size_mb:g}mb.json"
    if not big.exists():
        inflate(SOURCE, big, int(size_mb * 1e6), log=lambda _: None)
    data = big.read_bytes()
    assert data.count(_RANK, 0, 4096) == 1, "the source's distributedInfo is not where this script expects it"
    for r, f in enumerate(files):
        f.write_bytes(data.replace(_RANK, b'"distributedInfo": {"rank": %d}' % r, 1))
    return folder


def child_env() -> dict[str, str]:
    """The environment of the runs: parse cache off; Python's bytecode cache on, in a scratch
    folder (an installed tracewhy has its .pyc files; without them every worker would compile
    tracewhy's modules again, and the pool would look dearer than it is)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "TRACEWHY_NO_CACHE": "1", "PYTHONPYCACHEPREFIX": str(OUT / "pycache")}


def run(folder: Path, workers: int) -> tuple[float, float]:
    """Wall and CPU seconds (the process and its workers) of one ``ranks --json`` run."""
    env = child_env()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tracewhy", "ranks", str(folder), "--json", "--workers", str(workers)],
                          capture_output=True, env=env, cwd=REPO)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"ranks failed on {folder}: {proc.stderr.decode(errors='replace')[-500:]}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sizes-mb", default="0.1,1,10,50")
    p.add_argument("--counts", default="2,4,8")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    cpus = os.cpu_count() or 1
    rows: list[tuple[float, int, float, int, int, float, float, float, float]] = []
    load_start = os.getloadavg()
    for size in (float(s) for s in args.sizes_mb.split(",")):
        for count in (int(c) for c in args.counts.split(",")):
            folder = rank_files(size, count)
            total_mb = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
            pool = min(count, cpus)
            run(folder, pool)  # untimed: fills the bytecode cache
            here, there = [], []
            for _ in range(args.repeats if size * count < 200 else 1):  # interleaved, so load hits both
                here.append(run(folder, 0))
                there.append(run(folder, pool))
            hw, hc, pw, pc = (statistics.median(x) for x in (
                [w for w, _ in here], [c for _, c in here], [w for w, _ in there], [c for _, c in there]))
            rows.append((size, count, total_mb, pool, len(here), hw, hc, pw, pc))
            print(f"{count} x {size:g} MB ({total_mb:.1f} MB): here {hw:.2f} s / {hc:.2f} CPU s; "
                  f"{pool} workers {pw:.2f} s / {pc:.2f} CPU s", file=sys.stderr)
    lines = [
        "# ranks: read here or start a pool", "",
        "Made by `python bench/bench_ranks_crossover.py`. Rank files: "
        f"{SOURCE.name} inflated (bench/inflate.py). `ranks DIR --json`, parse cache off, fresh "
        "processes with Python's bytecode cached, medians (runs column), the two ways interleaved.", "",
        f"- machine: {cpus} logical cores, Python {platform.python_version()}",
        f"- load average (1/5/15 min) at start: {' / '.join(f'{v:.2f}' for v in load_start)}; at end: "
        f"{' / '.join(f'{v:.2f}' for v in os.getloadavg())} (shared machine: wall times are noisy)", "",
        "| files | MB each | MB total | runs | here wall s | here CPU s | workers | pool wall s | pool CPU s "
        "| pool / here wall |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size_mb, n_files, total_mb, pool, runs, hw, hc, pw, pc in rows:
        lines.append(f"| {n_files} | {size_mb:g} | {total_mb:.1f} | {runs} | {hw:.2f} | {hc:.2f} | {pool} | {pw:.2f} | "
                     f"{pc:.2f} | {pw / hw:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
