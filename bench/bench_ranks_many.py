"""``tracewhy ranks`` on 64 rank files of ~54 MB: 2 local worker processes, and a Dask
``LocalCluster`` of 2 single-threaded worker processes.

The rank files are one real rank trace, HTA's V100 DDP rank 1 with memory profiling (54 MB of
JSON, 2 GPUs' worth of kernels, NCCL collectives), written out 64 times with the rank in
``distributedInfo`` rewritten to 0-63 (and ``world_size`` to 64), into a folder under the
system's temp dir (``--dir``), never the repo; made once. 3.4 GB in all.

Each configuration runs ``python -m tracewhy ranks DIR --json`` in a fresh process, parse
cache off (``TRACEWHY_NO_CACHE=1``), interleaved, ``--repeats`` times (medians reported):

- ``--workers 2``: the command's own process pool; the pool's workers are children of the
  command, so its process tree is sampled every 50 ms for each worker's peak RSS;
- ``--executor dask://...``: a ``LocalCluster(n_workers=2, threads_per_worker=1)`` started here
  (its workers are children of this process, sampled the same way; their RSS before the run
  is reported too, as Dask's own floor).

What travels back: the pickled size of one file's summaries (what a worker sends), times 64,
against the bytes of the traces read; and the size of the command's JSON.

Usage: python bench/bench_ranks_many.py [--dir DIR] [--ranks 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import os
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pyc_cache

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SOURCE = REPO.parent / "shared/traces/hta/v100_ddp2_rank1_memprofile.json.gz"
RESULTS = BENCH / "results_ranks_many.md"
OLD_RANK = b'"distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2}'
MB = 1_000_000
SAMPLE_S = 0.05


def make_rank_files(folder: Path, ranks: int) -> list[Path]:
    """Rank files 0..ranks-1 in ``folder`` (made once; delete the folder to remake)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / f"v100_ddp_rank{r}.json" for r in range(ranks)]
    if all(f.exists() for f in files):
        return files
    with gzip.open(SOURCE, "rb") as f:
        data = f.read()
    cut = data.index(OLD_RANK)
    head, tail = data[:cut], data[cut + len(OLD_RANK):]
    for r, path in enumerate(files):
        new = b'"distributedInfo": {"backend": "nccl", "rank": %d, "world_size": %d}' % (r, ranks)
        with open(path, "wb") as out:
            out.write(head)
            out.write(new)
            out.write(tail)
    return files


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    parent_peak: int
    worker_peaks: list[int]
    out_bytes: int
    rc: int
    err: str
    load: float


def sampled_run(cmd: list[str], watch: psutil.Process | None) -> Run:
    """Run ``cmd``; sample the command's tree, and ``watch``'s children (Dask workers) if given."""
    load = os.getloadavg()[0]
    env = {**os.environ, "TRACEWHY_NO_CACHE": "1"}
    before = psutil.Process().cpu_times()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    root = psutil.Process(proc.pid)
    peaks: dict[int, int] = {}
    workers: set[int] = set()
    # Dask workers outlive the command: their CPU seconds are counted from the first sample.
    dask_cpu: dict[int, tuple[float, float]] = {}

    def sample() -> None:
        while proc.poll() is None:
            try:
                procs = [root, *root.children(recursive=True)]
                if watch is not None:
                    procs += watch.children(recursive=True)
                for p in procs:
                    if p.pid != root.pid:
                        workers.add(p.pid)
                    peaks[p.pid] = max(peaks.get(p.pid, 0), p.memory_info().rss)
                    if watch is not None and p.pid != root.pid:
                        now = sum(p.cpu_times()[:2])
                        dask_cpu[p.pid] = (dask_cpu.get(p.pid, (now, now))[0], now)
            except psutil.Error:
                pass
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    sampler.join()
    after = psutil.Process().cpu_times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    cpu += sum(last - first for first, last in dask_cpu.values())
    worker_peaks = sorted((peaks[p] for p in workers if p in peaks), reverse=True)
    return Run(wall, cpu, peaks.get(root.pid, 0), worker_peaks, len(out), proc.returncode,
               err.decode()[-1500:], load)


def summary_bytes(path: Path) -> tuple[int, int]:
    """Pickled bytes of one file's summaries (what a worker sends back), and how many ranks."""
    from tracewhy.reports.ranks import summarize_file

    got = summarize_file(str(path))
    assert isinstance(got, list), got
    return len(pickle.dumps(got)), len(got)


def row(label: str, runs: list[Run], floor: list[int] | None = None) -> str:
    ok = [r for r in runs if r.rc == 0]
    if not ok:
        return f"| {label} | failed: {runs[0].err.strip().splitlines()[-1:]} | | | | | | |"
    med = sorted(ok, key=lambda r: r.wall_s)[len(ok) // 2]
    walls = ", ".join(f"{r.wall_s:.1f}" for r in runs)
    peaks = ", ".join(f"{p / 2**20:,.0f}" for p in med.worker_peaks[:2])
    floor_text = f" (idle before: {', '.join(f'{p / 2**20:,.0f}' for p in floor)})" if floor else ""
    load = statistics.fmean(r.load for r in runs)
    return (f"| {label} | {med.wall_s:.1f} s | {walls} | {med.cpu_s:.1f} s | {med.cpu_s / med.wall_s:.2f} "
            f"| {med.parent_peak / 2**20:,.0f} MiB | {peaks} MiB{floor_text} | {med.out_bytes / 1000:,.0f} kB "
            f"| {load:.1f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "tracewhy-ranks64")
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    pyc_cache.as_installed()
    files = make_rank_files(args.dir, args.ranks)
    total = sum(f.stat().st_size for f in files)
    one, per_file = summary_bytes(files[0])

    # Imported by name: Dask is an optional extra without type information.
    local_cluster = importlib.import_module("distributed").LocalCluster

    base = [sys.executable, "-m", "tracewhy", "ranks", str(args.dir), "--json"]
    local: list[Run] = []
    dask: list[Run] = []
    load_start = os.getloadavg()
    with local_cluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        me = psutil.Process()
        floor = sorted((c.memory_info().rss for c in me.children(recursive=True)), reverse=True)[:2]
        spec = "dask://" + cluster.scheduler_address.removeprefix("tcp://")
        for _ in range(args.repeats):
            local.append(sampled_run([*base, "--workers", "2"], None))
            print(f"local: {local[-1].wall_s:.1f} s rc {local[-1].rc}", file=sys.stderr)
            dask.append(sampled_run([*base, "--executor", spec], me))
            print(f"dask: {dask[-1].wall_s:.1f} s rc {dask[-1].rc}", file=sys.stderr)
    load_end = os.getloadavg()
    lines = [
        f"# tracewhy ranks: {args.ranks} rank files, 2 local workers vs a Dask LocalCluster of 2", "",
        "Made by `python bench/bench_ranks_many.py`. Parse cache off; medians of "
        f"{args.repeats} fresh runs, interleaved.", "",
        f"- machine: {os.cpu_count()} logical cores, {psutil.virtual_memory().total / 2**30:.1f} GiB RAM, "
        f"Python {platform.python_version()}",
        f"- load average (1/5/15 min) at start: {' / '.join(f'{v:.2f}' for v in load_start)}; at end: "
        f"{' / '.join(f'{v:.2f}' for v in load_end)} (shared machine: timings are noisy)",
        f"- input: {len(files)} files of {files[0].stat().st_size / MB:.1f} MB (uncompressed Kineto JSON, one real "
        f"V100 DDP rank with its rank rewritten), {total / 1e9:.2f} GB in all", "",
        "| executor | median wall | runs (s) | CPU s (all processes) | CPU s / wall s | peak RSS of the command "
        "| peak RSS per worker | JSON out | load 1 min |",
        "| --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: |",
        row("2 worker processes (--workers 2)", local),
        row("Dask LocalCluster, 2 workers x 1 thread", dask, floor),
        "",
        f"What travels back: one file's summaries pickle to {one / 1000:,.1f} kB ({per_file} rank(s)); "
        f"{args.ranks} files send {one * args.ranks / MB:,.1f} MB back for {total / 1e9:.2f} GB read "
        f"({one * args.ranks / total:.2e} of the input). No trace, table or event travels: each worker reads "
        "its files from the shared file system and returns RankSummary objects only.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
