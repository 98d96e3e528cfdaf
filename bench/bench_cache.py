"""Time a cache hit against a cold read, and the whole-file hash that keys the entry.

Each measurement is a fresh interpreter; ``read_trace`` (or the hash) is timed inside it after
its imports, and the process's wall time and peak RSS come from ``bench_read.run_child``:

- cold, no cache: ``CacheOptions(enabled=False)``, the plain read;
- cold, first run: an empty ``TRACEWHY_CACHE_DIR``: hash, read, hash again, check and write the entry;
- cache hit: the same directory again: the file's identity (device, inode, size, mtime, ctime)
  is the stored one, so the entry's Parquet tables are loaded without hashing the trace;
- entry load: the hit's entry loaded alone (``model.cache._load``);
- hash alone: ``model.cache._content_hash`` (xxh3-128 of every byte, 1 MiB reads), what a hit
  adds when the identity changed (a ``touch``, a copy, a restored mtime), with the peak RSS
  above what the imports hold, which shows that hashing does not hold the file.

Files: ``bench_read.prepare_files``'s three (the largest real trace, gzipped and decompressed,
56 MB of JSON, and its ~1 GB inflation by ``inflate.py``), made once in ``--work-dir``
(default: ``tracewhy-bench`` in the system's temporary directory, never inside the repo).
The target: a hit on the 1 GB trace at least 20x faster than a cold read. Medians of
``--repeats`` rounds, the modes interleaved within each; the table goes to stdout and to
``bench/results_cache.md``. ``--big-only`` measures the 1 GB trace alone; ``--baseline REV``
measures the tree at git revision REV too (its ``src/`` exported into the work directory), its
runs taking turns with this tree's within each round, each tree with its own cache directory.

Usage: python bench/bench_cache.py [--repeats 5] [--work-dir DIR] [--big-only] [--baseline REV] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_read  # bench/ holds scripts, not a package
import inflate

#: Its own file, as every bench here has: bench_read.py rewrites results.md whole.
RESULTS = bench_read.BENCH / "results_cache.md"
SECTION = "# Parsed-trace cache: cold read vs cache hit (bench_cache.py)"
TARGET_SPEEDUP = 20.0
MODES = ("no cache", "first run", "cache hit", "entry load", "hash")

_CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from pathlib import Path
from tracewhy.model.cache import CacheOptions, _content_hash, _entry_name, _load, _place, _read_manifest
from tracewhy.model.schema import Kind
from tracewhy.readers import read_trace
import tracewhy.readers.kineto.reader  # imported by any cold read; imports are not the read
t1 = time.perf_counter()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
path, mode = Path(sys.argv[1]), sys.argv[2]
t2, c2 = time.perf_counter(), time.process_time()
if mode == "hash":
    digest = _content_hash(path)
elif mode == "entry load":  # what a hit costs without the hash: the entry's tables alone
    root, key, _identity = _place(path, CacheOptions())
    entry = root / _entry_name(key)
    manifest = _read_manifest(entry)
    loaded = _load(entry, manifest, key, path) if manifest is not None else None
else:
    trace = read_trace(path, cache=CacheOptions(enabled=mode != "no cache"))
t3, c3 = time.perf_counter(), time.process_time()
if mode == "hash":
    out = {"digest": digest}
elif mode == "entry load":
    out = {"found": loaded is not None}
else:
    out = {"slices": trace.slices.height, "kernel_dur_ns": int(trace.of_kind(Kind.KERNEL)["dur_ns"].sum())}
print(json.dumps({**out, "import_s": t1 - t0, "work_s": t3 - t2, "work_cpu_s": c3 - c2,
                  "rss_after_imports_bytes": base}))
"""


#: A tree under test: its label in the table and what its children add to the environment.
Tree = tuple[str, dict[str, str]]


def run_mode(path: Path, mode: str, cache_dir: Path, timeout_s: float, tree_env: dict[str, str]) -> bench_read.Run:
    env = {**tree_env, "TRACEWHY_CACHE_DIR": str(cache_dir)}  # added to this process's environment
    r = bench_read.run_child([sys.executable, "-c", _CHILD, str(path), mode], timeout_s, env=env)
    if not r.ok:
        raise SystemExit(f"{path.name} | {mode}: {r.note}")
    return r


def measure(f: bench_read.BenchFile, repeats: int, work_dir: Path, timeout_s: float,
            trees: list[Tree]) -> dict[str, dict[str, list[bench_read.Run]]]:
    """Each tree's runs of each mode; the trees take turns within a round, the modes in order."""
    by_tree: dict[str, dict[str, list[bench_read.Run]]] = {label: {m: [] for m in MODES} for label, _ in trees}
    for i in range(repeats):
        for label, tree_env in trees:
            runs = by_tree[label]
            with tempfile.TemporaryDirectory(prefix="cache-", dir=work_dir) as tmp:
                cache = Path(tmp)
                for mode in MODES:  # interleaved: a change in the machine's load hits every mode alike
                    r = run_mode(f.path, mode, cache, timeout_s, tree_env)
                    runs[mode].append(r)
                    bench_read.log(f"{f.label}{label} | {mode} | round {i + 1}: "
                                   f"work {float(r.report['work_s']):.3f} s "  # type: ignore[arg-type]
                                   f"({float(r.report['work_cpu_s']):.3f} CPU s), "  # type: ignore[arg-type]
                                   f"wall {r.wall_s:.2f} s, CPU {r.cpu_s:.2f} s, "
                                   f"peak RSS {r.peak_rss_bytes / bench_read.MB:,.0f} MB")
            cold, hit = runs["no cache"][-1].report, runs["cache hit"][-1].report
            if (cold["slices"], cold["kernel_dur_ns"]) != (hit["slices"], hit["kernel_dur_ns"]):
                raise SystemExit(f"{f.label}{label}: the cache hit differs from the cold read: {hit} vs {cold}")
            if not runs["entry load"][-1].report["found"]:
                raise SystemExit(f"{f.label}{label}: no entry after the first run")
            if len({r.report["digest"] for r in runs["hash"]}) != 1:
                raise SystemExit(f"{f.label}{label}: the hash changed between rounds")
    return by_tree


def _work(runs: list[bench_read.Run], field: str = "work_s") -> float:
    return statistics.median(float(r.report[field]) for r in runs)  # type: ignore[arg-type]


def _wall(runs: list[bench_read.Run]) -> float:
    return statistics.median(r.wall_s for r in runs)


def _above_imports_mb(runs: list[bench_read.Run]) -> float:
    return statistics.median(
        r.peak_rss_bytes - int(r.report["rss_after_imports_bytes"]) for r in runs  # type: ignore[call-overload]
    ) / bench_read.MB


def render(files: list[bench_read.BenchFile], results: dict[str, dict[str, dict[str, list[bench_read.Run]]]],
           repeats: int, loads: list[tuple[float, float, float]]) -> str:
    lines = [
        SECTION,
        "",
        f"Made by `python bench/bench_cache.py`. Medians of {repeats} rounds of fresh processes, the five modes "
        "interleaved in each round (warm OS file cache). *read* is `read_trace` timed inside the process after "
        "its imports; *wall* is the whole process (interpreter start and imports, about 0.3-0.5 s, which no "
        "cache removes). A first run hashes every byte of the trace (xxh3-128, 1 MiB reads: `model/cache.py`), "
        "reads it, hashes again, checks the Trace and writes the entry; a hit whose file has the stored identity "
        "(device, inode, size, mtime and ctime) loads the entry without hashing (*hash alone* is what a hit adds "
        "when the identity changed: a `touch`, a copy). *entry load*: the hit's tables loaded alone; "
        "*hash's cost to a hit* = hit - entry load (about zero when the identity holds).",
        "",
        *bench_read.machine_facts(bench_read.tracewhy_provenance()),
        "- load average (1/5/15 min) at start: {:.2f} / {:.2f} / {:.2f}; at end: {:.2f} / {:.2f} / {:.2f} "
        "(other agents share this machine: timings are noisy)".format(*loads[0], *loads[-1]),
        "",
        "| file | MB on disk | slices | read: no cache | read: first run | read: cache hit | entry load | "
        "hash alone | hash GB/s | hash's cost to a hit | **no cache / hit** (target >= 20 on 1 GB) | "
        "first run / hit | no cache / entry load | wall: no cache | wall: hit | CPU s: hit (whole process) | "
        "read CPU s: no cache / hit | "
        "hash peak RSS above imports |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: |",
    ]
    for f, tree, runs in ((bf, tree, runs) for bf in files for tree, runs in results[bf.label].items()):
        size = f.path.stat().st_size
        cold, first, hit, load, hashed = (_work(runs[m]) for m in MODES)
        lines.append(
            f"| {f.label}{tree} | {size / bench_read.MB:,.0f} | {int(runs['cache hit'][0].report['slices']):,} | "  # type: ignore[call-overload]
            f"{cold:.2f} s | {first:.2f} s | {hit:.3f} s | {load:.3f} s | {hashed:.3f} s | "
            f"{size / hashed / 1e9:.1f} | {hit - load:+.3f} s | **{cold / hit:.1f}x** | {first / hit:.1f}x | "
            f"{cold / load:.1f}x | "
            f"{_wall(runs['no cache']):.2f} s | {_wall(runs['cache hit']):.2f} s | "
            f"{statistics.median(r.cpu_s for r in runs['cache hit']):.2f} s | "
            f"{_work(runs['no cache'], 'work_cpu_s'):.2f} s / {_work(runs['cache hit'], 'work_cpu_s'):.3f} s | "
            f"{_above_imports_mb(runs['hash']):.1f} MB |"
        )
    big = [f for f in files if f.inflated]
    if big:
        for tree, runs in results[big[0].label].items():
            speedup = _work(runs["no cache"]) / _work(runs["cache hit"])
            verdict = "meets" if speedup >= TARGET_SPEEDUP else "MISSES"
            lines += ["", f"On the ~1 GB trace{tree} a cache hit is {speedup:.1f}x faster than a cold read without "
                          f"the cache: this {verdict} the target of {TARGET_SPEEDUP:.0f}x."]
    return "\n".join(lines) + "\n"


def write_section(section: str) -> None:
    """The results file holds this bench's latest run alone."""
    RESULTS.write_text(section)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="rounds of the five modes per file (median kept)")
    p.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "tracewhy-bench",
                   help="where the benchmark files are made once and the cache directories live")
    p.add_argument("--source", type=Path, default=inflate.DEFAULT_SOURCE)
    p.add_argument("--target-bytes", type=float, default=inflate.DEFAULT_TARGET_BYTES)
    p.add_argument("--timeout-s", type=float, default=600, help="limit per child process")
    p.add_argument("--big-only", action="store_true", help="measure the ~1 GB trace alone")
    p.add_argument("--baseline", metavar="REV", help="also measure src/ at this git revision, taking turns")
    p.add_argument("--no-write", action="store_true", help="print the table, leave results_cache.md alone")
    args = p.parse_args(argv)
    work_dir: Path = args.work_dir.resolve()
    if work_dir.is_relative_to(inflate.REPO):
        raise SystemExit(f"--work-dir {work_dir} is inside the repo: a 1 GB trace must not land there")
    os.environ.pop("TRACEWHY_NO_CACHE", None)  # the children inherit this environment
    bench_read.OUT_DIR = work_dir  # prepare_files makes (once) and finds its files there
    files = bench_read.prepare_files(args.source, int(args.target_bytes), bench_read.log)
    if args.big_only:
        files = [f for f in files if f.inflated]
    with tempfile.TemporaryDirectory(prefix="baseline-", dir=work_dir) as exported:
        trees: list[Tree] = [("", {})]
        if args.baseline:
            own = dict(os.environ)
            bench_read.use_tracewhy_commit(args.baseline, Path(exported))  # sets PYTHONPATH: for its children only
            trees.append((f" (baseline {args.baseline})", {"PYTHONPATH": str(Path(exported) / "src")}))
            os.environ.clear()
            os.environ.update(own)
        loads = [os.getloadavg()]
        results = {f.label: measure(f, args.repeats, work_dir, args.timeout_s, trees) for f in files}
    loads.append(os.getloadavg())
    section = render(files, results, args.repeats, loads)
    print(section)
    if not args.no_write:
        write_section(section)
        bench_read.log(f"written to {RESULTS.relative_to(inflate.REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
