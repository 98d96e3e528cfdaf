"""Would ``diff A B`` on small traces be quicker with run B read and diagnosed in a second process?

``diff`` reads and diagnoses both runs in one process, the two diagnoses on two threads
(``reports/at_once.py``). A second process for run B would pay its own imports (polars, numpy and
tracewhy: ~0.35 CPU s) and then send back what the comparison needs of B (its findings, steps,
memory and compile figures, and the per-name op, kernel and annotation tables, which today read
B's slices). The best such a split can do is both runs' work in two processes started together,
with nothing sent, plus the comparison and the output (a few ms). This times, in fresh processes
taking turns (medians and minima of ``--repeats``), wall and CPU seconds of:

- ``diff``: ``python -m tracewhy diff A B`` as it is;
- ``one side``: one process that imports what ``diff`` imports, reads A and finds its findings
  (the rules, and the diagnosis without replay: what ``diff`` does when both runs have the same
  finding codes, as A against a copy of itself has);
- ``two sides at once``: two such processes, for A and for B, started together: the split's
  lower bound, before anything crosses between them.

The side processes get the one-thread polars pool the command line gives small inputs
(``input_size.small_inputs``), as ``diff`` itself does. Each pair is a trace against a copy of
itself: the TraceLens H100 BERT-small trace (1.08 MB of JSON) and the 2.3 MB Nsight Systems
export. Children run with Python's bytecode cache (``pyc_cache.as_installed``).

Usage: python bench/bench_diff_split.py [--repeats 7] [--results PATH] [--no-write]
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyc_cache import as_installed

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SHARED = REPO.parent / "shared/traces"
PAIRS = {"BERT (1.08 MB JSON)": SHARED / "tracelens/h100_bert-small_bs1_seq512.json.gz",
         "nsys export (2.3 MB)": SHARED / "nsys/nsysai_h100_2gpu_1s.sqlite.gz"}
RESULTS = BENCH / "results_diff_split.md"

#: One side of a split diff: the imports diff makes, one read, the rules and the unpriced diagnosis.
SIDE = """
import sys
from tracewhy.cli.commands.diff import DiffCommand
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.readers import read_trace
from tracewhy.reports.diagnose import diagnose_in, rule_findings
trace = read_trace(sys.argv[1])
ctx = Context(trace, DiagnoseOptions(fixes_together=False))
report = diagnose_in(ctx, rule_findings(ctx), replay=False)
print(len(report.findings))
"""


def timed(argvs: list[list[str]], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds until every process of ``argvs`` (started together) has ended, and their CPU
    seconds together."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    procs = [subprocess.Popen(a, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
             for a in argvs]
    codes = [p.wait() for p in procs]
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if any(codes):
        raise SystemExit(f"a run failed ({codes}): {argvs}")
    return took, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def plain_copy(source: Path, scratch: Path) -> tuple[Path, Path]:
    """The trace decompressed, and a copy of it (run B)."""
    name = source.name.removesuffix(".gz")
    a, b = scratch / name, scratch / f"copy_{name}"
    with gzip.open(source, "rb") as f, open(a, "wb") as out:
        shutil.copyfileobj(f, out)
    shutil.copyfile(a, b)
    return a, b


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    as_installed()
    env = dict(os.environ, TRACEWHY_NO_CACHE="1", PYTHONPATH=str(REPO / "src"))
    env.pop("POLARS_MAX_THREADS", None)
    side_env = dict(env, POLARS_MAX_THREADS="1")  # as the command line sets it for small inputs
    py = sys.executable
    load_start = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tracewhy-diff-split-") as tmp:
        for label, source in PAIRS.items():
            a, b = plain_copy(source, Path(tmp))
            runs: dict[str, tuple[list[list[str]], dict[str, str]]] = {
                "diff": ([[py, "-m", "tracewhy", "diff", str(a), str(b)]], env),
                "one side": ([[py, "-c", SIDE, str(a)]], side_env),
                "two sides at once": ([[py, "-c", SIDE, str(a)], [py, "-c", SIDE, str(b)]], side_env),
            }
            for argvs, run_env in runs.values():  # untimed: fills the bytecode cache
                timed(argvs, run_env)
            times: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
            for _ in range(args.repeats):
                for name, (argvs, run_env) in runs.items():
                    times[name].append(timed(argvs, run_env))
            for name, t in times.items():
                walls, cpus = [w for w, _ in t], [c for _, c in t]
                rows.append(f"| {label} | {name} | {statistics.median(walls):.2f} ({min(walls):.2f}) | "
                            f"{statistics.median(cpus):.2f} ({min(cpus):.2f}) |")
                print(rows[-1], flush=True)
    load_end = os.getloadavg()
    text = "\n".join([
        "# diff A B in one process, or B in a second one",
        "",
        "Made by `python bench/bench_diff_split.py` (what each row runs: its docstring). Fresh processes,",
        f"parse cache off, medians (minima) of {args.repeats}, the three runs of a pair taking turns.",
        "",
        f"- machine: {os.cpu_count()} logical cores, Python {platform.python_version()}",
        f"- load average (1/5/15 min) at start: {' / '.join(f'{x:.2f}' for x in load_start)}; at end: "
        f"{' / '.join(f'{x:.2f}' for x in load_end)} (shared machine: timings are noisy)",
        "",
        "| pair (a trace and its copy) | run | wall s | CPU s |",
        "| --- | --- | ---: | ---: |",
        *rows,
        "",
    ])
    if not args.no_write:
        args.results.write_text(text)
        print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
