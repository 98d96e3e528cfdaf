"""``diagnose`` of a large Nsight Systems export under a cgroup memory limit, this tree beside an
older one: the kernel's OOM killer is the judge.

A run that takes more memory than its group's limit is killed (SIGKILL) with no output at all.
Since the memory check of ``analyses/account_memory.py``, a diagnosis that would not fit with
its step account leaves the account out and says so (``account-skipped``). Each run is a whole
process (``python -m tracewhy diagnose --json``, parse cache off) moved into a fresh memory
cgroup (v2 ``memory.max``, else v1 ``memory.limit_in_bytes``) before it execs. Its wall time,
peak RSS (``os.wait4``), exit status and first finding go on the page. Needs root and a writable
cgroup memory controller; the groups are removed afterwards.

The export is built by bench/inflate_nsys.py (``--copies``, 250 by default: 606 MB) in a
temporary folder unless ``--export`` names one.

Usage: python bench/bench_memory_limit.py [--export X.sqlite] [--copies 250] [--limits-gb 4,8]
           [--before OLD_SRC_DIR] [--md OUT (default bench/results_memory_limit.md; '-': none)]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyc_cache

REPO = Path(__file__).resolve().parent.parent
CGROUP = Path("/sys/fs/cgroup")


@dataclass
class Result:
    tree: str
    limit_gb: float
    wall_s: float
    peak_mb: float
    exit: int
    first: str  # the first finding's code, or what happened instead
    digest: str  # of the JSON document (short sha256; "-" without one)


@contextmanager
def memory_group(limit_bytes: int) -> Iterator[Path]:
    """A fresh memory cgroup limited to ``limit_bytes`` (v2 if the unified hierarchy is mounted
    with the memory controller, else v1); its ``cgroup.procs`` path. Removed on exit."""
    name = f"tracewhy-bench-{os.getpid()}-{limit_bytes >> 20}"
    if (CGROUP / "cgroup.controllers").exists():
        group = CGROUP / name
        group.mkdir()
        (group / "memory.max").write_text(str(limit_bytes))
        if (group / "memory.swap.max").exists():  # (v1's limit has no swap here either: the machine has none)
            (group / "memory.swap.max").write_text("0")
    else:
        group = CGROUP / "memory" / name
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
    try:
        yield group / "cgroup.procs"
    finally:
        time.sleep(0.2)  # (the group empties once its last process is reaped)
        group.rmdir()


def run(argv: list[str], env: dict[str, str], procs: Path, out: Path) -> tuple[float, float, int]:
    """Wall seconds, peak RSS (MB) and exit status of ``argv``, run inside the group."""
    def enter() -> None:
        procs.write_text(str(os.getpid()))

    t0 = time.perf_counter()
    with open(out, "wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.DEVNULL, env=env, preexec_fn=enter)
        _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - t0, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def first_finding(out: Path, code: int) -> str:
    if code < 0:
        return f"killed by signal {-code}, no output" if out.stat().st_size == 0 else f"killed by signal {-code}"
    try:
        findings = json.loads(out.read_bytes())["findings"]
    except (ValueError, KeyError):
        return "no JSON document"
    return str(findings[0]["code"]) if findings else "(no findings)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", type=Path, default=None, help="an inflated export to reuse (built if missing)")
    ap.add_argument("--copies", type=int, default=250)
    ap.add_argument("--limits-gb", default="4,8", help="comma-separated memory limits, GiB")
    ap.add_argument("--before", type=Path, default=None,
                    help="an older src/ folder (git archive REV src | tar -x -C DIR): its tracewhy runs too")
    ap.add_argument("--before-label", default=None, help="how the page names the older tree (a commit, say)")
    ap.add_argument("--md", default=str(REPO / "bench" / "results_memory_limit.md"))
    args = ap.parse_args()
    pyc_cache.as_installed()
    limits = [float(x) for x in args.limits_gb.split(",")]
    trees = [("this tree", REPO / "src")] + ([("before", args.before.resolve())] if args.before else [])
    results: list[Result] = []
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="tracewhy-bench-limit-") as tmp:
        export = args.export or Path(tmp) / f"inflated_{args.copies}x.sqlite"
        if not export.exists():
            subprocess.run([sys.executable, str(REPO / "bench" / "inflate_nsys.py"), str(export),
                            "--copies", str(args.copies)], check=True, stdout=subprocess.DEVNULL)
        for limit in limits:
            for label, src in trees:
                env = {**os.environ, "TRACEWHY_NO_CACHE": "1", "PYTHONPATH": str(src)}
                out = Path(tmp) / "out.json"
                with memory_group(int(limit * 2**30)) as procs:
                    wall, peak, code = run([sys.executable, "-m", "tracewhy", "diagnose", "--json", str(export)],
                                           env, procs, out)
                digest = hashlib.sha256(out.read_bytes()).hexdigest()[:12] if out.stat().st_size else "-"
                results.append(Result(label, limit, wall, peak, code, first_finding(out, code), digest))
                r = results[-1]
                print(f"{limit:4.1f} GiB {label:10} {wall:7.1f} s {peak:7.0f} MB exit {code:4d}  {r.first}", flush=True)
        size_mb = export.stat().st_size / 1e6
    lines = _markdown(results, size_mb, args.copies if args.export is None else None,
                      args.before_label or shown(args.before), (load, os.getloadavg()[0]))
    print("\n".join(lines))
    if args.md != "-":
        Path(args.md).write_text("\n".join(lines) + "\n")
    return 0


def shown(before: Path | None) -> str:
    return f"`{before.parent.name}/{before.name}`" if before is not None else "none"


def _account(r: Result) -> str:
    return "left out (`account-skipped`)" if r.first == "account-skipped" else "made" if r.exit == 0 else "-"


def _markdown(results: list[Result], size_mb: float, copies: int | None, before: str,
              load: tuple[float, float]) -> list[str]:
    return [
        "# diagnose under a memory limit",
        "",
        "Written by `python bench/bench_memory_limit.py`: each run a whole process "
        "(`python -m tracewhy diagnose --json`, parse cache off) in a fresh memory cgroup of the limit shown; "
        "a run over its limit is killed by the kernel.",
        "",
        f"Export: {size_mb:,.0f} MB" + (f" (bench/inflate_nsys.py, {copies} copies)" if copies else "")
        + f"; older tree: {before}. python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{load[0]:.1f} at the start and {load[1]:.1f} at the end (shared machine: wall times are noisy; the "
        "memory figures are not).",
        "",
        "| limit | tree | exit | wall s | peak RSS MB | step account | first finding | document (sha256) |",
        "| ---: | --- | ---: | ---: | ---: | --- | --- | --- |",
        *(f"| {r.limit_gb:g} GiB | {r.tree} | {r.exit} | {r.wall_s:.1f} | {r.peak_mb:,.0f} | {_account(r)} "
          f"| {r.first} | {r.digest} |" for r in results),
    ]


if __name__ == "__main__":
    raise SystemExit(main())
