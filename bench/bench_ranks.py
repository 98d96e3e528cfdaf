"""``tracewhy ranks`` on 8 rank files of >= 100 MB each: 2 worker processes vs 1, and the peak
memory of each worker.

The rank files are real traces made big: HTA's sampled 128-rank job (ranks 0 and 1, 1.7 MB
each) inflated with bench/inflate.py to about 105 MB of JSON, then written out as ranks 0-7
(even ranks from rank 0's trace, odd ones from rank 1's) with the rank in ``distributedInfo``
rewritten. They go to the git-ignored bench/out/ranks8/ and are made once.

Each configuration runs ``python -m tracewhy ranks DIR --json --workers N`` in a fresh process
with the parse cache off (TRACEWHY_NO_CACHE=1), interleaved, ``--repeats`` times; the table has
medians. Memory is sampled with psutil every
20 ms over the process tree: the largest resident set of each worker process, and of the parent.

Usage: python bench/bench_ranks.py [--repeats 3] [--target-bytes 105e6]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from inflate import inflate  # noqa: E402 - bench/ is not a package

REPO = BENCH.parent
SOURCES = [REPO.parent / f"shared/traces/hta/sampled_128rank_job_rank{r}.json.gz" for r in (0, 1)]
OUT = BENCH / "out" / "ranks8"
RANKS = 8
SAMPLE_S = 0.02


def make_rank_files(target_bytes: int) -> list[Path]:
    """ranks 0-7 in OUT, each >= 100 MB, made once (delete OUT to remake)."""
    OUT.mkdir(parents=True, exist_ok=True)
    files = [OUT / f"job_rank{r}.json" for r in range(RANKS)]
    if all(f.exists() and f.stat().st_size >= 100_000_000 for f in files):
        return files
    for parity, source in enumerate(SOURCES):
        big = OUT / f"source{parity}.inflated.json"
        inflate(source, big, target_bytes, log=lambda _: None)
        data = big.read_bytes()
        head = data[:4096]
        old = b'"distributedInfo": {"backend": "nccl", "rank": ' + str(parity).encode() + b","
        assert old in head, "the source's distributedInfo is not where this script expects it"
        for r in range(parity, RANKS, 2):
            new = b'"distributedInfo": {"backend": "nccl", "rank": ' + str(r).encode() + b","
            files[r].write_bytes(head.replace(old, new, 1) + data[4096:])
        big.unlink()
    return files


def run(workers: int) -> tuple[float, float, dict[str, int], dict[str, object]]:
    """Wall seconds, CPU seconds of the whole process tree, peak RSS per process (parent and each
    worker), and the command's JSON."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, "-m", "tracewhy", "ranks", str(OUT), "--json", "--workers", str(workers)]
    started = time.perf_counter()
    # Every run parses the JSON: the Parquet cache of earlier runs would turn this into a
    # benchmark of cache reads.
    env = {**os.environ, "TRACEWHY_NO_CACHE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    peaks: dict[int, int] = {}
    parent = psutil.Process(proc.pid)

    def sample() -> None:
        while proc.poll() is None:
            try:
                for p in [parent, *parent.children(recursive=True)]:
                    peaks[p.pid] = max(peaks.get(p.pid, 0), p.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - started
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {err.decode()[-2000:]}")
    # The spawn context starts a small resource tracker too; workers are the big children.
    named = {"parent": peaks.pop(proc.pid, 0)}
    for i, rss in enumerate(sorted(peaks.values(), reverse=True)[:workers]):
        named[f"worker{i + 1}"] = rss
    return seconds, cpu, named, json.loads(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--target-bytes", type=float, default=105e6)
    args = p.parse_args()
    files = make_rank_files(int(args.target_bytes))
    sizes = [f.stat().st_size for f in files]
    print(f"{len(files)} rank files, {min(sizes) / 1e6:.0f}-{max(sizes) / 1e6:.0f} MB each ({sum(sizes) / 1e9:.2f} GB)")
    times: dict[int, list[float]] = {1: [], 2: []}
    cpus: dict[int, list[float]] = {1: [], 2: []}
    mem: dict[int, dict[str, int]] = {1: {}, 2: {}}
    results: dict[int, dict[str, object]] = {}
    for i in range(args.repeats):
        for workers in (1, 2):
            seconds, cpu, peaks, doc = run(workers)
            times[workers].append(seconds)
            cpus[workers].append(cpu)
            for k, v in peaks.items():
                mem[workers][k] = max(mem[workers].get(k, 0), v)
            doc.pop("executor")
            results[workers] = doc
            print(f"  run {i + 1}: {workers} worker(s) {seconds:.1f} s wall, {cpu:.1f} s CPU, peak RSS "
                  + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in peaks.items()))
    assert results[1] == results[2], "1 and 2 workers must give the same result"
    t1, t2 = statistics.median(times[1]), statistics.median(times[2])
    load = os.getloadavg()
    lines = [
        "# tracewhy ranks: 8 rank files, 1 vs 2 worker processes (parse cache off)",
        "",
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"load average after the runs {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        f"input: {len(files)} files of {min(sizes) / 1e6:.0f}-{max(sizes) / 1e6:.0f} MB (uncompressed Kineto JSON), "
        f"{sum(sizes) / 1e9:.2f} GB in all; straggler found: rank {results[2]['straggler']}",
        "",
        "| workers | median wall time | runs | CPU s / wall s | peak RSS parent | peak RSS per worker |",
        "|---|---|---|---|---|---|",
    ]
    for w in (1, 2):
        per_worker = ", ".join(f"{v / 2**20:.0f} MiB" for k, v in sorted(mem[w].items()) if k != "parent")
        runs = ", ".join(f"{t:.1f}" for t in times[w])
        busy = statistics.median(c / t for c, t in zip(cpus[w], times[w], strict=True))
        lines.append(f"| {w} | {statistics.median(times[w]):.1f} s | {runs} s | {busy:.2f} "
                     f"| {mem[w]['parent'] / 2**20:.0f} MiB | {per_worker} |")
    lines += [
        "", f"speedup with 2 workers: {t1 / t2:.2f}x (target >= 1.7x)", "",
        "CPU s / wall s is how many cores the run got: near 2 with 2 workers on an idle 2-core machine; "
        "near 1 means other load took the second core, and no executor can be faster then.", "",
    ]
    text = "\n".join(lines)
    print(text)
    (BENCH / "results_ranks.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
