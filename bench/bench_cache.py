"""Time a second run on the same trace (parsed-trace cache hit) against the first (cold read).

Each measurement is a fresh interpreter with its own ``TRACEWHY_CACHE_DIR``:

- first run: an empty cache directory, so the trace is parsed and the entry written;
- second run: the same directory, so the Trace comes from the Parquet entry;
- peer: ``--no-cache``, the plain read, to show what writing the entry costs the first run.

Two things are timed in each child: ``read_trace`` alone (imports excluded), and the whole
``tracewhy steps --json FILE`` command as a user runs it (the wall time of the process).
Default files: the largest real trace in ../shared (``tracelens/h100_owlv2-large_zero-shot``,
56 MB of JSON) and ``bench/out/h100_owlv2-large_zero-shot.inflated.json`` (~1 GB), made by
``bench/inflate.py`` when absent. Medians of ``--repeats`` runs go to stdout and to
``bench/results_cache.md``.

Usage: python bench/bench_cache.py [--repeats 3] [FILE ...]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SHARED_LARGEST = REPO.parent / "shared/traces/tracelens/h100_owlv2-large_zero-shot.json.gz"
INFLATED = BENCH / "out" / "h100_owlv2-large_zero-shot.inflated.json"
RESULTS = BENCH / "results_cache.md"

_READ_CHILD = """
import sys, time
from tracewhy.readers import read_trace
from tracewhy.model.cache import CacheOptions
t0 = time.perf_counter()
trace = read_trace(sys.argv[1], cache=CacheOptions(enabled=sys.argv[2] == "cache"))
print(time.perf_counter() - t0, trace.slices.height)
"""


def _read_s(path: Path, cache_dir: Path, use_cache: bool) -> tuple[float, int]:
    env = {**os.environ, "TRACEWHY_CACHE_DIR": str(cache_dir)}
    out = subprocess.run(
        [sys.executable, "-c", _READ_CHILD, str(path), "cache" if use_cache else "nocache"],
        env=env, check=True, capture_output=True, text=True,
    ).stdout.split()
    return float(out[0]), int(out[1])


def _command_s(path: Path, cache_dir: Path, use_cache: bool) -> float:
    env = {**os.environ, "TRACEWHY_CACHE_DIR": str(cache_dir)}
    argv = [sys.executable, "-m", "tracewhy", "steps", "--json", str(path)]
    if not use_cache:
        argv.append("--no-cache")
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def measure(path: Path, repeats: int) -> dict[str, float | int]:
    read_first, read_second, read_plain = [], [], []
    cmd_first, cmd_second, cmd_plain = [], [], []
    rows = 0
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="tw-bench-cache-") as tmp:
            cache = Path(tmp)
            s, rows = _read_s(path, cache / "read", use_cache=False)
            read_plain.append(s)
            read_first.append(_read_s(path, cache / "read", use_cache=True)[0])
            read_second.append(_read_s(path, cache / "read", use_cache=True)[0])
            cmd_plain.append(_command_s(path, cache / "cmd", use_cache=False))
            cmd_first.append(_command_s(path, cache / "cmd", use_cache=True))
            cmd_second.append(_command_s(path, cache / "cmd", use_cache=True))
    med = statistics.median
    return {
        "bytes": path.stat().st_size, "slices": rows,
        "read_plain_s": med(read_plain), "read_first_s": med(read_first), "read_second_s": med(read_second),
        "cmd_plain_s": med(cmd_plain), "cmd_first_s": med(cmd_first), "cmd_second_s": med(cmd_second),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    files: list[Path] = args.files
    if not files:
        if not INFLATED.exists():
            subprocess.run([sys.executable, str(BENCH / "inflate.py"), "--no-check"], check=True)
        files = [SHARED_LARGEST, INFLATED]
    lines = [
        "# Parsed-trace cache: first run vs second run",
        "",
        f"{datetime.date.today()}, {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.2f} at start; medians of {args.repeats} fresh processes each.",
        "",
        "| file | MB | slices | read: no cache | read: first run | read: second run | speedup | "
        "`steps --json`: no cache | first run | second run | speedup |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in files:
        r = measure(f, args.repeats)
        lines.append(
            f"| {f.name} | {r['bytes'] / 1e6:.0f} | {r['slices']:,} | {r['read_plain_s']:.2f} s | "
            f"{r['read_first_s']:.2f} s | {r['read_second_s']:.3f} s | "
            f"**{r['read_first_s'] / r['read_second_s']:.0f}x** | {r['cmd_plain_s']:.2f} s | "
            f"{r['cmd_first_s']:.2f} s | {r['cmd_second_s']:.2f} s | "
            f"**{r['cmd_first_s'] / r['cmd_second_s']:.1f}x** |"
        )
        print(lines[-1], flush=True)
    lines += [
        "",
        f"load average {os.getloadavg()[0]:.2f} at the end. The command's time includes starting Python and "
        "importing polars (about 0.3-0.5 s here), which no cache removes.",
    ]
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
