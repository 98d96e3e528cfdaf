"""Scaling curve: read and ``diagnose`` time and peak RSS, Kineto from 10 MB to 5 GB, Nsight
Systems from 10 k to 5 M kernels.

Each size is measured in fresh processes, parse cache off (``TRACEWHY_NO_CACHE=1``):

- ``staged``: one child imports tracewhy, reads the trace (``read_trace``), runs ``diagnose``
  and serializes its JSON, and reports per stage the seconds and how far the stage pushed the
  process's peak RSS (``ru_maxrss``, exact). Inside ``diagnose`` every analysis the rules ask
  the context for (``Context.cached``) is timed on its own (exclusive of the analyses it asks
  for in turn); what is left is the rules' own judging. Read helpers (two processes for a file
  of 256 MB or more) are outside ``ru_maxrss``: the process tree is sampled as well.
- ``cli``: ``python -m tracewhy diagnose FILE --json``, whole process, the tree's summed RSS
  sampled every 50 ms, and ``ru_maxrss`` of the largest single process.

A sampler kills any run whose tree passes ``--max-rss-gb`` (default 16) so that a shared
machine stays usable; such a run is reported as killed. The files: a real 9.8 MB trace (HTA's
A100 DDP rank 0: no 10 MB trace shares the larger ones' source), the largest real trace
(56 MB) and that trace inflated by ``bench/inflate.py`` to 100 MB, 1 GB and 5 GB, made once in
``--dir`` (default a folder under the system's temp dir, never the repo). Writes
``bench/results_scale.md`` and, where matplotlib is installed, ``bench/scale.png`` (log-log).
Slopes are least-squares fits of log(seconds) and log(MB) on the sizes from 100 MB up, where
fixed costs (interpreter, imports) no longer dominate: 1.0 is linear.

``--format nsys`` measures Nsight Systems exports instead: the real nsys-ai
``nsysai_mfu_2gpu_before`` export (4,010 kernels) with every activity table replicated by
``bench/inflate_nsys.py`` 3, 25, 250 and 1,250 times (12 k, 100 k, 1 M and 5 M kernels; 8 k
events in the model per 1 k kernels), written to ``bench/results_scale_nsys.md`` and
``bench/scale_nsys.png``; slopes from 100 k kernels up.

Usage: python bench/bench_scale.py [--format kineto|nsys] [--dir DIR] [--sizes 10M,56M,100M,1G,5G]
       [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pyc_cache

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import inflate  # noqa: E402 - bench/ holds scripts, not a package
import inflate_nsys  # noqa: E402

REPO = BENCH.parent
SHARED = REPO.parent / "shared/traces"
SMALL_SOURCE = SHARED / "hta/a100_ddp2_rank0_nccl2.17.json.gz"
RESULTS = BENCH / "results_scale.md"
PLOT = BENCH / "scale.png"
RESULTS_NSYS = BENCH / "results_scale_nsys.md"
PLOT_NSYS = BENCH / "scale_nsys.png"
MB = 1_000_000
SAMPLE_S = 0.05
#: Sizes measured, by label: bytes targeted (None: the real file as it is).
SIZES: dict[str, float | None] = {"10M": None, "56M": None, "100M": 1e8, "1G": 1e9, "5G": 5e9}
#: Nsight Systems sizes, by label: copies of the source export (4,010 kernels each).
NSYS_SIZES: dict[str, int] = {"10k": 3, "100k": 25, "1M": 250, "5M": 1250}
#: Sizes from which slopes are fitted (below, start-up dominates).
FIT_FROM_BYTES = 90 * MB
#: The same for exports: from the 100 k-kernel size (25 copies, about 60 MB) up.
NSYS_FIT_FROM_BYTES = 50 * MB
#: results_scale.md keeps what follows this line (figures measured by hand) when rewritten.
HAND_MARKER = "\n---\n\n*Below: added by hand"

_STAGED_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
stages = []
def mark(name, start, before):
    stages.append({"stage": name, "s": time.perf_counter() - start, "peak_growth": peak() - before,
                   "peak": peak()})
s, p = time.perf_counter(), peak()
from tracewhy.readers import read_trace
from tracewhy.findings import context as context_mod
from tracewhy.reports.diagnose import diagnose
from tracewhy.renderers.diagnose import diagnose_payload
mark("import", t0, 0)
s, p = time.perf_counter(), peak()
trace = read_trace(sys.argv[1])
mark("read", s, p)
analyses = {}
stack = []
original = context_mod.Context.cached
def timed(self, key, compute):
    if key in self._cache:
        return original(self, key, compute)
    start, before = time.perf_counter(), peak()
    stack.append(0.0)
    try:
        return original(self, key, compute)
    finally:
        inner = stack.pop()
        took = time.perf_counter() - start
        if stack:
            stack[-1] += took
        a = analyses.setdefault(key, {"s": 0.0, "peak_growth": 0})
        a["s"] += took - inner
        a["peak_growth"] += peak() - before
context_mod.Context.cached = timed
s, p = time.perf_counter(), peak()
report = diagnose(trace)
mark("diagnose", s, p)
s, p = time.perf_counter(), peak()
text = json.dumps(diagnose_payload(report), default=str)
mark("json", s, p)
print(json.dumps({"stages": stages, "analyses": analyses, "slices": trace.slices.height,
                  "kernels": trace.of_kind("kernel").height,
                  "findings": len(report.findings), "total_s": time.perf_counter() - t0}))
"""


@dataclass
class Run:
    """One child process: its wall seconds, peaks, and what it printed."""

    wall_s: float
    tree_peak: int
    max_single: int
    rc: int
    out: str
    err: str
    killed: bool = False
    load: tuple[float, float, float] = field(default_factory=os.getloadavg)


def run_child(cmd: list[str], max_rss: int, timeout_s: float) -> Run:
    """Run ``cmd`` with the parse cache off, sampling its process tree; kill it past ``max_rss``."""
    env = {**os.environ, "TRACEWHY_NO_CACHE": "1"}
    load = os.getloadavg()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    root = psutil.Process(proc.pid)
    tree_peak, single = 0, 0
    killed = False

    def sample() -> None:
        nonlocal tree_peak, single, killed
        while proc.poll() is None:
            try:
                rss = [p.memory_info().rss for p in [root, *root.children(recursive=True)]]
            except psutil.Error:
                rss = []
            if rss:
                tree_peak, single = max(tree_peak, sum(rss)), max(single, max(rss))
            if tree_peak > max_rss and not killed:
                killed = True
                for p in [*root.children(recursive=True), root]:
                    with contextlib.suppress(psutil.Error):
                        p.kill()
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        killed = True
    wall = time.perf_counter() - started
    sampler.join()
    return Run(wall, tree_peak, single, proc.returncode, out.decode(), err.decode()[-2000:], killed, load)


def make_files(folder: Path, labels: list[str]) -> dict[str, Path]:
    """The trace of each size label, made once in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for label in labels:
        target = SIZES[label]
        if label == "10M":
            path = folder / "a100_ddp2_rank0.json"
            if not path.exists():
                with gzip.open(SMALL_SOURCE, "rb") as src, open(path, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        elif target is None:
            path = folder / "owlv2.json"
            if not path.exists():
                path.write_bytes(inflate.read_source(inflate.DEFAULT_SOURCE))
        else:
            path = folder / f"owlv2.{label}.json"
            if not path.exists():
                print(f"making {path.name} ...", file=sys.stderr)
                inflate.inflate(inflate.DEFAULT_SOURCE, path, int(target), log=lambda _: None)
        files[label] = path
    return files


def make_exports(folder: Path, labels: list[str]) -> dict[str, Path]:
    """The export of each kernel-count label, made once in ``folder`` by ``inflate_nsys``."""
    folder.mkdir(parents=True, exist_ok=True)
    base = folder / "base.sqlite"
    if not base.exists():
        with gzip.open(inflate_nsys.DEFAULT_EXPORT, "rb") as src, open(base, "wb") as dst:
            shutil.copyfileobj(src, dst)
    files: dict[str, Path] = {}
    for label in labels:
        path = folder / f"mfu_before.x{NSYS_SIZES[label]}.sqlite"
        if not path.exists():
            print(f"making {path.name} ...", file=sys.stderr)
            partial = path.with_suffix(".partial")
            inflate_nsys.inflate(base, partial, NSYS_SIZES[label])
            partial.rename(path)
        files[label] = path
    return files


def median_run(runs: list[Run]) -> Run:
    """The run of median wall time (its peaks come with it)."""
    return sorted(runs, key=lambda r: r.wall_s)[len(runs) // 2]


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(y) on log(x); None with fewer than two points."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def stage_seconds(staged: dict[str, object], name: str) -> float:
    stages = staged["stages"]
    assert isinstance(stages, list)
    return float(next(s["s"] for s in stages if s["stage"] == name))


def measure(files: dict[str, Path], repeats: int, max_rss: int, timeout_s: float) -> list[dict[str, object]]:
    """For each size: the staged child and the whole-process CLI, ``repeats`` times each below
    1 GB and once from 1 GB up, interleaved."""
    rows: list[dict[str, object]] = []
    for label, path in files.items():
        size = path.stat().st_size
        n = repeats if size < 500 * MB else 1
        staged_runs, cli_runs = [], []
        for _ in range(n):
            staged_runs.append(run_child([sys.executable, "-c", _STAGED_CHILD, str(path)], max_rss, timeout_s))
            cli_runs.append(run_child([sys.executable, "-m", "tracewhy", "diagnose", str(path), "--json"],
                                      max_rss, timeout_s))
        staged, cli = median_run(staged_runs), median_run(cli_runs)
        row: dict[str, object] = {"label": label, "file": path.name, "bytes": size, "staged": staged, "cli": cli}
        if staged.rc == 0 and not staged.killed:
            row["stages"] = json.loads(staged.out.strip().splitlines()[-1])
        rows.append(row)
        print(f"{label}: staged {staged.wall_s:.1f} s rc {staged.rc}, cli {cli.wall_s:.1f} s "
              f"{cli.tree_peak / MB:.0f} MB rc {cli.rc} load {cli.load[0]:.1f}", file=sys.stderr)
        if staged.rc or cli.rc:
            print(staged.err, cli.err, file=sys.stderr)
    return rows


def table(rows: list[dict[str, object]]) -> list[str]:
    out = [
        "| size | file MB | slices (kernels) | read s | read peak growth MB | diagnose s | diagnose peak growth MB "
        "| staged peak RSS MB (tree) | CLI wall s | CLI peak RSS MB (tree) | CLI peak / file | load 1 min |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        st, cli, size = row.get("stages"), row["cli"], int(str(row["bytes"]))
        assert isinstance(cli, Run)
        staged = row["staged"]
        assert isinstance(staged, Run)
        if isinstance(st, dict):
            by = {s["stage"]: s for s in st["stages"]}
            cells = [f"{st['slices']:,} ({st.get('kernels', 0):,})", f"{by['read']['s']:.2f}",
                     f"{by['read']['peak_growth'] / MB:,.0f}",
                     f"{by['diagnose']['s']:.2f}", f"{by['diagnose']['peak_growth'] / MB:,.0f}",
                     f"{staged.tree_peak / MB:,.0f}"]
        else:
            cells = ["failed" if not staged.killed else "killed"] + [""] * 5
        cli_cells = (["killed", "", ""] if cli.killed else
                     [f"{cli.wall_s:.2f}", f"{cli.tree_peak / MB:,.0f}", f"{cli.tree_peak / size:.2f}"])
        out.append(f"| {row['label']} | {size / MB:,.1f} | " + " | ".join(cells + cli_cells)
                   + f" | {cli.load[0]:.1f} |")
    return out


def breakdown(rows: list[dict[str, object]]) -> list[str]:
    """Seconds per analysis inside diagnose, largest first, for the largest size measured."""
    last = next((r for r in reversed(rows) if isinstance(r.get("stages"), dict)), None)
    if last is None:
        return []
    st = last["stages"]
    assert isinstance(st, dict)
    by = {s["stage"]: s for s in st["stages"]}
    analyses = sorted(st["analyses"].items(), key=lambda kv: -kv[1]["s"])
    judged = by["diagnose"]["s"] - sum(a["s"] for _, a in analyses)
    out = [f"Stage breakdown at {last['label']} ({int(str(last['bytes'])) / MB:,.0f} MB), one process "
           "(read helpers excluded from its RSS):", "",
           "| stage | seconds | peak RSS growth MB |", "| --- | ---: | ---: |"]
    for name in ("import", "read"):
        out.append(f"| {name} | {by[name]['s']:.2f} | {by[name]['peak_growth'] / MB:,.0f} |")
    for key, a in analyses:
        if a["s"] >= 0.01:
            out.append(f"| diagnose: {key} | {a['s']:.2f} | {a['peak_growth'] / MB:,.0f} |")
    out.append(f"| diagnose: rules' own judging and the rest | {judged:.2f} | |")
    out.append(f"| JSON | {by['json']['s']:.2f} | {by['json']['peak_growth'] / MB:,.0f} |")
    return out


def _value(row: dict[str, object], what: str) -> float | None:
    """One measured quantity of a row (None where the staged run failed)."""
    st, cli = row.get("stages"), row["cli"]
    assert isinstance(cli, Run)
    if what == "cli":
        return cli.wall_s
    if what == "rss":
        return float(cli.tree_peak)
    return stage_seconds(st, what) if isinstance(st, dict) else None


def slopes(rows: list[dict[str, object]], fit_from: int, since: str) -> list[str]:
    out = [f"Slope of log(y) on log(size), sizes from {since} up (1.0 = linear, above 1 = worse than linear):", ""]
    for what, label in (("read", "read seconds"), ("diagnose", "diagnose seconds (analyses + rules)"),
                        ("cli", "CLI diagnose wall seconds"), ("rss", "CLI peak RSS")):
        pts = [(float(str(r["bytes"])), v) for r in rows
               if int(str(r["bytes"])) >= fit_from and (v := _value(r, what)) is not None]
        s = slope(pts)
        out.append(f"- {label}: {s:.2f}" if s is not None else f"- {label}: too few points")
    return out


def plot(rows: list[dict[str, object]], path: Path, title: str, rss_limit: float) -> bool:
    """A log-log PNG of seconds and peak RSS against size; False where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if isinstance(r.get("stages"), dict)]
    x = [int(str(r["bytes"])) / MB for r in ok]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    series = {label: [_value(r, what) or 0.0 for r in ok] for what, label in
              (("read", "read"), ("diagnose", "diagnose (after read)"), ("cli", "CLI diagnose, whole process"))}
    for name, ys in series.items():
        ax1.plot(x, ys, marker="o", label=name)
    ax1.plot(x, [series["CLI diagnose, whole process"][-1] * xi / x[-1] for xi in x], ":",
             color="grey", label="linear")
    ax1.set(xscale="log", yscale="log", xlabel="trace size (MB)", ylabel="seconds", title="time")
    ax2.plot(x, [(_value(r, "rss") or 0.0) / MB for r in ok], marker="o", label="CLI diagnose peak RSS (tree)")
    ax2.plot(x, [rss_limit * xi for xi in x], "--", color="red", label=f"{rss_limit:g} x file size")
    ax2.set(xscale="log", yscale="log", xlabel="trace size (MB)", ylabel="MB", title="peak RSS")
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"tracewhy on {title} (2 cores, 24 GB)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", choices=("kineto", "nsys"), default="kineto")
    p.add_argument("--dir", type=Path, default=None, help="where the inputs are made (default: under the temp dir)")
    p.add_argument("--sizes", default=None, help="comma-separated labels of " + ", ".join(SIZES)
                   + " (kineto) or " + ", ".join(NSYS_SIZES) + " (nsys); default all")
    p.add_argument("--repeats", type=int, default=3, help="runs per size below 500 MB (median kept)")
    p.add_argument("--max-rss-gb", type=float, default=16.0, help="kill a run whose process tree passes this")
    p.add_argument("--timeout-s", type=float, default=1800)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    pyc_cache.as_installed()
    nsys = args.format == "nsys"
    sizes = NSYS_SIZES if nsys else SIZES
    labels = [s for s in (args.sizes or ",".join(sizes)).split(",") if s]
    if unknown := [s for s in labels if s not in sizes]:
        p.error(f"unknown sizes {unknown}: choose from {', '.join(sizes)}")
    folder = args.dir or Path(tempfile.gettempdir()) / ("tracewhy-scale-nsys" if nsys else "tracewhy-scale")
    files = make_exports(folder, labels) if nsys else make_files(folder, labels)
    results, png = (RESULTS_NSYS, PLOT_NSYS) if nsys else (RESULTS, PLOT)
    load_start = os.getloadavg()
    rows = measure(files, args.repeats, int(args.max_rss_gb * 1e9), args.timeout_s)
    load_end = os.getloadavg()
    lines = [
        "# Scaling: Nsight Systems read and diagnose from 10 k to 5 M kernels" if nsys else
        "# Scaling: Kineto read and diagnose from 10 MB to 5 GB", "",
        f"Made by `python bench/bench_scale.py{' --format nsys' if nsys else ''}`. Parse cache off. "
        "Below 500 MB each cell is the median of "
        f"{args.repeats} fresh processes; from 1 GB up one run. Peak growth = how far the stage pushed "
        "the main process's ru_maxrss; tree RSS = helpers included, sampled every 50 ms.", "",
        f"- machine: {os.cpu_count()} logical cores, {psutil.virtual_memory().total / 2**30:.1f} GiB RAM, "
        f"Python {platform.python_version()}",
        f"- load average (1/5/15 min) at start: {' / '.join(f'{v:.2f}' for v in load_start)}; at end: "
        f"{' / '.join(f'{v:.2f}' for v in load_end)} (shared machine: timings are noisy)", "",
        *table(rows), "",
        *(slopes(rows, NSYS_FIT_FROM_BYTES, "100 k kernels") if nsys else slopes(rows, FIT_FROM_BYTES, "100 MB")),
        "", *breakdown(rows), "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        if plot(rows, png, "Nsight Systems exports" if nsys else "Kineto traces", 2.0 if nsys else 1.5):
            text += f"\n![scaling curve]({png.name})\n"
        old = results.read_text() if results.exists() else ""
        results.write_text(text + (old[old.index(HAND_MARKER):] if HAND_MARKER in old else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
