"""Time reading a Kineto trace: tracewhy next to HTA and a plain json.loads, in one run.

Each measurement runs in a fresh interpreter (cold: imports and all), on the same files:

- tracewhy: ``python -m tracewhy kernels FILE --json`` (read + model + analysis), in a process
  set up and ended as the command's (``tracewhy.cli.as_command`` / ``end_command``), with its
  parsed-trace cache off (``TRACEWHY_NO_CACHE=1``); also, as an extra row, the same command
  finding the trace in a cache primed once beforehand (in ``bench/out/tracewhy-cache``);
- HTA (PyPI ``traceinsight``, import ``hta``): ``TraceAnalysis(trace_dir=DIR)``, DIR holding
  only a symlink to FILE (HTA takes a directory of per-rank ``*.json``/``*.gz`` files; it reads
  the rank from ``"rank": N`` in the file, else assumes rank 0);
- json.loads: read the file's decompressed bytes, then ``json.loads`` them (both timed).

Wall time is the child's whole life seen from here; peak RSS is the larger of the kernel's
``ru_maxrss`` for the child (largest single process, reaped descendants included) and the
process tree's summed RSS sampled every 100 ms (HTA parses in a forked pool worker; tracewhy
reads a file of 256 MB or more with a helper process on the second core).
Each measurement is repeated (default 3) and the median reported. Results go to stdout and
to ``bench/results.md`` (``--results`` names another file).

Usage: python bench/bench_read.py [--repeats 3] [--hta-timeout-s 900] [--skip-hta]
       python bench/bench_read.py --throughput [--sizes 271M,1G,5G] [--file 271M=PATH]
           [--baseline-src WORKTREE/src --baseline-label main] [--skip-loads]

``--throughput`` measures the whole ``tracewhy kernels FILE --no-cache --json`` process instead
(MB/s, CPU seconds, peak RSS over the file's size) on the V100 DDP trace inflated to 271 MB,
1 GB and 5 GB, beside json.loads of the same bytes (not run above 1.2 GB: it would hold 5x
the file), writing ``bench/results_read_throughput.md``. ``--skip-loads`` leaves json.loads out
(a change measured against its baseline tree alone, in a third of the time and without json.loads'
5x-the-file peak).
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime
import gzip
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO

import psutil
import pyc_cache

sys.path.insert(0, str(Path(__file__).resolve().parent))
import inflate  # bench/ holds scripts, not a package

BENCH = inflate.BENCH
REPO = inflate.REPO
OUT_DIR = inflate.DEFAULT_OUT_DIR
RESULTS = BENCH / "results.md"
MB = 1_000_000

_JSON_LOADS_CHILD = """
import gzip, json, sys, time
path = sys.argv[1]
t0 = time.perf_counter()
with open(path, "rb") as f:
    gz = f.read(2) == b"\\x1f\\x8b"
with (gzip.open if gz else open)(path, "rb") as f:
    data = f.read()
t1 = time.perf_counter()
obj = json.loads(data)
t2 = time.perf_counter()
print(json.dumps({"read_s": t1 - t0, "loads_s": t2 - t1, "events": len(obj["traceEvents"])}))
"""

_HTA_CHILD = """
import json, sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
rows = sum(len(df) for df in analysis.t.traces.values())
print(json.dumps({"import_s": t1 - t0, "construct_s": t2 - t1, "rows": rows}))
"""


@dataclass
class Run:
    """One child process: how long it lived, its peak memory, what it printed last."""

    wall_s: float
    peak_rss_bytes: int
    ok: bool
    note: str = ""
    report: dict[str, object] = field(default_factory=dict)
    #: User + system CPU seconds of the child and the children it waited for (its read helpers).
    cpu_s: float = 0.0


def run_child(
    argv: list[str], timeout_s: float, mem_limit_bytes: int | None = None,
    env: dict[str, str] | None = None,
) -> Run:
    """Run ``argv`` in its own session; time it, sample its tree's RSS, reap it with wait4."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        return _run_child(argv, timeout_s, mem_limit_bytes, {**os.environ, **(env or {})}, out, err)


def _run_child(
    argv: list[str], timeout_s: float, mem_limit_bytes: int | None, env: dict[str, str],
    out: IO[bytes], err: IO[bytes],
) -> Run:
    def limit() -> None:
        if mem_limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (mem_limit_bytes, mem_limit_bytes))

    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=out, stderr=err, start_new_session=True,
                            preexec_fn=limit, cwd=REPO, env=env)
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)  # the child's own session: only what we started

    timer = threading.Timer(timeout_s, kill)
    timer.start()
    sampled = [0]
    done = threading.Event()
    sampler = threading.Thread(target=_sample_tree, args=(proc.pid, sampled, done), daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    timer.cancel()
    done.set()
    sampler.join()
    peak = max(usage.ru_maxrss * 1024, sampled[0])
    cpu = usage.ru_utime + usage.ru_stime
    out.seek(0)
    err.seek(0)
    stdout, stderr = out.read(), err.read()
    if timed_out.is_set():
        return Run(wall, peak, False, f"timed out after {timeout_s:.0f} s", cpu_s=cpu)
    if proc.returncode != 0:
        tail = stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        if b"MemoryError" in stderr or b"out of memory" in stderr or proc.returncode == -9:
            return Run(wall, peak, False, f"out of memory (exit {proc.returncode}): {tail[0][:120]}", cpu_s=cpu)
        return Run(wall, peak, False, f"exit {proc.returncode}: {tail[0][:160]}", cpu_s=cpu)
    return Run(wall, peak, True, report=_last_json(stdout), cpu_s=cpu)


def _sample_tree(pid: int, peak: list[int], done: threading.Event) -> None:
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    while not done.wait(0.1):
        try:
            procs = [root, *root.children(recursive=True)]
            total = 0
            for p in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    total += p.memory_info().rss
            peak[0] = max(peak[0], total)
        except psutil.NoSuchProcess:
            return


def _last_json(stdout: bytes) -> dict[str, object]:
    text = stdout.decode(errors="replace").strip()
    if text.startswith("{") and text.endswith("}"):
        try:
            value = json.loads(text)
            if isinstance(value, dict):
                return value
        except json.JSONDecodeError:
            pass
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
                if isinstance(value, dict):
                    return value
            except json.JSONDecodeError:
                continue
    return {}


# --- the three contenders -------------------------------------------------------------------


# tracewhy keeps parsed traces in a cache (model/cache.py): a cold read must not find one.
NO_CACHE = {"TRACEWHY_NO_CACHE": "1"}
CACHE_DIR = OUT_DIR / "tracewhy-cache"


# `tracewhy kernels FILE --json` run in-process after the imports, so that its read + model +
# analysis time ("work") compares like for like with HTA's construct time and json.loads.
# The process is set up and ended as the ``tracewhy`` command's is (``as_command``: the garbage
# collector's thresholds; ``end_command``: no interpreter teardown after the output is flushed).
_TRACEWHY_CHILD = """
import contextlib, io, json, resource, sys, time
t0 = time.perf_counter()
from tracewhy.cli import as_command, end_command, main
as_command()
# The CLI imports the command's module and the reader lazily (a cached trace needs no reader):
# both are part of what any cold read imports, as pandas is part of HTA's imports.
import tracewhy.cli.commands.kernels, tracewhy.readers.kineto.reader
t1 = time.perf_counter()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(["kernels", sys.argv[1], "--json"])
t2 = time.perf_counter()
doc = json.loads(out.getvalue())
print(json.dumps({"import_s": t1 - t0, "work_s": t2 - t1, "rss_after_imports_bytes": base, "code": code,
                  "total_count": doc["total_count"], "total_time_ns": doc["total_time_ns"]}))
end_command(code)
"""


def tracewhy_run(path: Path, timeout_s: float, env: dict[str, str] | None = None) -> Run:
    argv = [sys.executable, "-c", _TRACEWHY_CHILD, str(path)]
    r = run_child(argv, timeout_s, env=env or NO_CACHE)
    if r.ok:
        r.note = f"{r.report.get('total_count')} kernels"
    return r


def hta_run(path: Path, timeout_s: float, mem_limit_bytes: int | None) -> Run:
    with tempfile.TemporaryDirectory(prefix="bench-hta-") as tmp:
        # HTA lists *.json / *.gz in the directory; the suffix must stay, so keep the name.
        os.symlink(path.resolve(), Path(tmp) / path.name)
        r = run_child([sys.executable, "-c", _HTA_CHILD, tmp], timeout_s, mem_limit_bytes)
    if r.ok:
        r.note = f"{r.report['rows']} rows"
    return r


def json_loads_run(path: Path, timeout_s: float) -> Run:
    r = run_child([sys.executable, "-c", _JSON_LOADS_CHILD, str(path)], timeout_s)
    if r.ok:
        r.note = f"read {float(r.report['read_s']):.2f} s + loads {float(r.report['loads_s']):.2f} s"  # type: ignore[arg-type]
    return r


# --- files ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchFile:
    label: str
    path: Path
    uncompressed_bytes: int
    inflated: bool = False


def prepare_files(source: Path, target_bytes: int, log: Callable[[str], None]) -> list[BenchFile]:
    """The real trace (.json.gz and decompressed) and its inflation to ``target_bytes``."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    stem = source.name.removesuffix(".gz").removesuffix(".json")
    plain = OUT_DIR / f"{stem}.json"
    if not plain.exists():
        with gzip.open(source, "rb") as src, open(plain.with_suffix(".partial"), "wb") as dst:
            shutil.copyfileobj(src, dst, 16 * MB)
        plain.with_suffix(".partial").replace(plain)
    # Another size than the default (which bench_diagnose and bench_memory read too) is in the
    # name, so a trace inflated to another size is never taken for this one.
    sized = "" if target_bytes == inflate.DEFAULT_TARGET_BYTES else f"-{target_bytes / MB:.0f}MB"
    big = OUT_DIR / f"{stem}.inflated{sized}.json"
    if not big.exists():
        log(f"making {big.name} (once; kept in bench/out/)")
        plan = inflate.inflate(source, big, target_bytes, log=log)
        problems = inflate.check(source, big, plan.repeats, log=log)
        if problems:
            big.unlink()
            raise SystemExit("inflated trace failed its check: " + "; ".join(problems))
    size = plain.stat().st_size
    return [
        BenchFile(f"{source.name} (real, gzip)", source, size),
        BenchFile(f"{plain.name} (real, decompressed)", plain, size),
        BenchFile(f"{big.name} (inflated)", big, big.stat().st_size, inflated=True),
    ]


# --- which tracewhy ------------------------------------------------------------------------


def use_tracewhy_commit(rev: str, into: Path) -> str:
    """Export ``src/`` at ``rev`` into ``into`` and put it first on the children's PYTHONPATH.

    Measures a committed reader even while the working tree is being edited.
    """
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            check=True, capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(into / "src") + (os.pathsep + old if old else "")
    return f"git commit {commit[:10]} (exported; working tree not used)"


def tracewhy_provenance() -> str:
    """Which tracewhy the children import: the installed one, at the work tree's commit."""
    found = subprocess.run([sys.executable, "-c", "import tracewhy; print(tracewhy.__file__)"],
                           capture_output=True, text=True, cwd=REPO).stdout.strip()
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=10", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src"],
                           capture_output=True, text=True).stdout.strip()
    where = "this repo's src/" if found.startswith(str(REPO / "src")) else "an installed copy"
    return f"{where} at {head}{' with uncommitted changes in src/' if dirty else ''}"


# --- report ---------------------------------------------------------------------------------


def machine_facts(tracewhy_source: str) -> list[str]:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    mem_total = psutil.virtual_memory().total
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return [
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {os.cpu_count()} logical cores ({cpu}), {mem_total / 2**30:.1f} GiB RAM, "
        f"{platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}; tracewhy {version('tracewhy')}, polars "
        f"{version('polars')}, msgspec {version('msgspec')}, numpy {version('numpy')}; "
        f"traceinsight (HTA) {version('traceinsight')}, pandas {version('pandas')}",
        f"- tracewhy measured: {tracewhy_source}",
    ]


def _median(runs: list[Run], attr: str) -> float | None:
    ok = [getattr(r, attr) for r in runs if r.ok]
    return statistics.median(ok) if ok else None


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _fmt_mb(value: float | None) -> str:
    return "-" if value is None else f"{value / MB:,.0f}"


def _report_median(runs: list[Run], key: str) -> float | None:
    values = [float(r.report[key]) for r in runs if r.ok and key in r.report]  # type: ignore[arg-type]
    return statistics.median(values) if values else None


def render(
    files: list[BenchFile],
    results: dict[tuple[str, str], list[Run]],
    repeats: int,
    loads: list[tuple[float, float, float]],
    tracewhy_source: str,
) -> str:
    lines = [
        "# Reading a Kineto trace: tracewhy vs HTA vs json.loads",
        "",
        "Made by `python bench/bench_read.py`. Each cell is the median of "
        f"{repeats} fresh processes (cold interpreter, warm OS file cache). Wall = the child "
        "process's whole life (interpreter start, imports, read, work). Peak RSS = max of "
        "the kernel's ru_maxrss and the process tree's RSS sampled every 100 ms.",
        "",
        *machine_facts(tracewhy_source),
        "- load average (1/5/15 min) at start: {:.2f} / {:.2f} / {:.2f}; at end: "
        "{:.2f} / {:.2f} / {:.2f} (other agents share this machine: timings are noisy)".format(
            *loads[0], *loads[-1]
        ),
        "",
        "| file | uncompressed MB | tool | wall s | peak RSS MB | runs ok | notes |",
        "| --- | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    for f in files:
        for tool in ("tracewhy", "tracewhy, cache hit", "HTA", "json.loads"):
            runs = results.get((f.label, tool), [])
            if not runs:
                continue
            ok = [r for r in runs if r.ok]
            note = ok[len(ok) // 2].note if ok else runs[-1].note
            if tool == "json.loads" and ok:
                note = (f"read {_fmt_s(_report_median(runs, 'read_s'))} s + loads "
                        f"{_fmt_s(_report_median(runs, 'loads_s'))} s (medians)")
            if tool.startswith("tracewhy") and ok:
                note = (f"import {_fmt_s(_report_median(runs, 'import_s'))} s, read+model+analysis "
                        f"{_fmt_s(_report_median(runs, 'work_s'))} s (medians); {note}")
            if tool == "HTA" and ok:
                note = (f"import {_fmt_s(_report_median(runs, 'import_s'))} s, construct "
                        f"{_fmt_s(_report_median(runs, 'construct_s'))} s (medians); {note}")
            failed = [r.note for r in runs if not r.ok]
            if failed:
                note = (note + "; " if ok else "") + "; ".join(sorted(set(failed)))
            lines.append(
                f"| {f.label} | {f.uncompressed_bytes / MB:,.0f} | {tool} | "
                f"{_fmt_s(_median(runs, 'wall_s'))} | {_fmt_mb(_median(runs, 'peak_rss_bytes'))} | "
                f"{len(ok)}/{len(runs)} | {note} |"
            )
    lines += [
        "",
        "Ratios against the targets (tracewhy wall vs json.loads alone, i.e. without "
        "its read and interpreter start; HTA wall vs tracewhy wall; tracewhy peak RSS vs the "
        "uncompressed size):",
        "",
        "| file | tracewhy / json.loads (target <= 1.0) | tracewhy / (read + json.loads) | "
        "HTA / tracewhy (target >= 10) | tracewhy RSS / size (target <= 2.0) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for f in files:
        tw = results.get((f.label, "tracewhy"), [])
        tw_wall, tw_rss = _median(tw, "wall_s"), _median(tw, "peak_rss_bytes")
        loads_s, read_loads_s = _json_loads_s(results.get((f.label, "json.loads"), []))
        hta = results.get((f.label, "HTA"), [])
        hta_wall = _median(hta, "wall_s")
        hta_failed = [r for r in hta if not r.ok]
        lines.append(
            f"| {f.label} | {_ratio(tw_wall, loads_s)} | "
            f"{_ratio(tw_wall, read_loads_s)} | "
            f"{_hta_ratio(hta_wall, tw_wall, hta_failed, hta)} | "
            f"{_ratio(tw_rss, f.uncompressed_bytes)} |"
        )
    lines += [
        "",
        "Like for like, every tool timed inside its process after its imports (tracewhy: read + "
        "model + analysis; HTA: TraceAnalysis construction; json.loads: read + loads), and "
        "tracewhy's memory above what its imports already hold:",
        "",
        "| file | tracewhy work / (read + json.loads) (target <= 1.0) | HTA construct / tracewhy work "
        "(target >= 10) | tracewhy (peak RSS - RSS after imports) / size (target <= 2.0) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for f in files:
        tw = results.get((f.label, "tracewhy"), [])
        work = _report_median(tw, "work_s")
        base = _report_median(tw, "rss_after_imports_bytes")
        peak = _median(tw, "peak_rss_bytes")
        _, read_loads_s = _json_loads_s(results.get((f.label, "json.loads"), []))
        construct = _report_median(results.get((f.label, "HTA"), []), "construct_s")
        lines.append(
            f"| {f.label} | {_ratio(work, read_loads_s)} | "
            f"{_ratio(construct, work)} | "
            f"{_ratio(None if peak is None or base is None else peak - base, f.uncompressed_bytes)} |"
        )
    return "\n".join(lines) + "\n"


def _json_loads_s(runs: list[Run]) -> tuple[float | None, float | None]:
    """json.loads alone, and the file's read plus json.loads (medians; None when not measured)."""
    loads_s, read_s = _report_median(runs, "loads_s"), _report_median(runs, "read_s")
    return loads_s, None if loads_s is None or read_s is None else loads_s + read_s


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def _hta_ratio(hta: float | None, tw: float | None, failed: list[Run], runs: list[Run]) -> str:
    if not runs:
        return "not run"
    if hta is None and failed and tw:
        # A run cut off at the timeout still bounds the ratio from below.
        return f"> {failed[0].wall_s / tw:.1f} ({failed[0].note})"
    return _ratio(hta, tw)


# --- throughput: the whole command's MB/s at 271 MB, 1 GB and 5 GB ------------------------

#: The throughput rows: the V100 DDP memory-profile trace (many [memory] instants with args)
#: inflated to each size (bytes aimed at; inflate.py lands a little under).
THROUGHPUT_SOURCE = REPO.parent / "shared/traces/hta/v100_ddp2_rank1_memprofile.json.gz"
THROUGHPUT_SIZES = {"271M": 285_000_000, "1G": 1_000_000_000, "5G": 5_000_000_000}
THROUGHPUT_RESULTS = BENCH / "results_read_throughput.md"
#: The targets: MB/s of the whole command, and its peak RSS (process tree) over the file's size.
TARGET_MB_S, TARGET_RSS_RATIO = 200, 1.5
#: json.loads holds about 5.4x the file (measured at 1 GB): above this size it is not run.
LOADS_MAX_BYTES = 1.2e9


def throughput_file(label: str, folder: Path, given: dict[str, Path]) -> Path:
    """The file of a throughput row: as given (``--file LABEL=PATH``), else made once in ``folder``."""
    if label in given:
        return given[label]
    path = folder / f"{THROUGHPUT_SOURCE.name.removesuffix('.json.gz')}.{label}.json"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        log(f"making {path} (once)")
        partial = path.with_suffix(".partial")
        plan = inflate.inflate(THROUGHPUT_SOURCE, partial, THROUGHPUT_SIZES[label], log=log)
        problems = inflate.check(THROUGHPUT_SOURCE, partial, plan.repeats, log=log)
        if problems:
            partial.unlink()
            raise SystemExit("inflated trace failed its check: " + "; ".join(problems))
        partial.replace(path)
    return path


def command_run(path: Path, src: Path | None, timeout_s: float) -> Run:
    """``python -m tracewhy kernels FILE --no-cache --json``, the whole process (interpreter start
    to exit), importing tracewhy from ``src`` when given."""
    env = {**NO_CACHE, **({"PYTHONPATH": str(src)} if src else {})}
    return run_child([sys.executable, "-m", "tracewhy", "kernels", str(path), "--no-cache", "--json"],
                     timeout_s, env=env)


def throughput(args: argparse.Namespace) -> int:
    given = dict((label, Path(p)) for label, _, p in (f.partition("=") for f in args.file))
    labels = [s.strip() for s in args.sizes.split(",") if s.strip()]
    files = {label: throughput_file(label, args.dir, given) for label in labels}
    tools: list[tuple[str, Callable[[Path], Run]]] = [
        ("tracewhy", lambda f: command_run(f, None, args.timeout_s))]
    if args.baseline_src:
        compileall.compile_dir(args.baseline_src, quiet=1)  # (as pyc_cache does for this tree)
        tools.append((f"tracewhy at {args.baseline_label}",
                      lambda f: command_run(f, args.baseline_src, args.timeout_s)))
    if not args.skip_loads:
        tools.append(("json.loads", lambda f: json_loads_run(f, args.timeout_s)))
    loads = [os.getloadavg()]
    results: dict[tuple[str, str], list[Run]] = {}
    for label, path in files.items():
        size = path.stat().st_size
        repeats = args.repeats_large if size > LOADS_MAX_BYTES else args.repeats  # (5 GB: 25 s or more a run)
        for i in range(repeats):
            # Interleaved, so that a change in load hits every tool alike, in an order that turns each
            # round, so that no tool always runs just after the same one (json.loads has just freed
            # 1.4 GB, 5.3 GB on the 1 GB file, when the next process starts).
            for tool, measure in tools[i % len(tools):] + tools[:i % len(tools)]:
                if tool.startswith("json.loads") and size > LOADS_MAX_BYTES:
                    continue
                r = measure(path)
                results.setdefault((label, tool), []).append(r)
                log(f"{label} | {tool} | run {i + 1}: {r.wall_s:.2f} s wall, {r.cpu_s:.2f} s CPU, "
                    f"{r.peak_rss_bytes / MB:,.0f} MB, {'ok' if r.ok else 'FAILED ' + r.note}")
                loads.append(os.getloadavg())
    table = throughput_table(files, results, loads, tools)
    print(table)
    if not args.no_write:
        args.results.write_text(table)
        log(f"written to {args.results}")
    return 0


def throughput_table(files: dict[str, Path], results: dict[tuple[str, str], list[Run]],
                     loads: list[tuple[float, float, float]], tools: list[tuple[str, object]]) -> str:
    lines = [
        "# Reading a Kineto trace: the whole command's throughput",
        "",
        "Made by `python bench/bench_read.py --throughput`. Each tracewhy row: `python -m tracewhy kernels FILE "
        "--no-cache --json`, a fresh process from interpreter start to exit (parse cache off, warm OS "
        "file cache), beside a plain `json.loads` of the same bytes (read + loads: the floor a "
        "Python reader starts from), runs interleaved (their order turning each round), medians. "
        "CPU = user + system seconds of the process and its read helper. Peak RSS = max of ru_maxrss "
        "and the process tree's RSS "
        f"sampled every 100 ms. Targets: >= {TARGET_MB_S} MB/s, peak RSS <= {TARGET_RSS_RATIO}x the file.",
        "",
        *machine_facts(tracewhy_provenance()),
        "- load average (1/5/15 min) at start: {:.2f} / {:.2f} / {:.2f}; at end: {:.2f} / {:.2f} / {:.2f} "
        "(wall times need a quiet machine; CPU seconds are steadier)".format(*loads[0], *loads[-1]),
        "",
        "| file | uncompressed MB | tool | runs ok | wall s | MB/s | CPU s | peak RSS MB | RSS / file |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    skipped = []
    for label, path in files.items():
        size = path.stat().st_size
        for tool, _ in tools:
            runs = results.get((label, tool), [])
            if not runs:
                skipped.append(f"{tool} on {label}")
                continue
            wall, rss = _median(runs, "wall_s"), _median(runs, "peak_rss_bytes")
            lines.append(
                f"| {label}: {path.name} | {size / MB:,.0f} | {tool} | {sum(r.ok for r in runs)}/{len(runs)} | "
                f"{_fmt_s(wall)} | {'-' if not wall else f'{size / MB / wall:,.0f}'} | "
                f"{_fmt_s(_median(runs, 'cpu_s'))} | {_fmt_mb(rss)} | {_ratio(rss, size)} |")
    if skipped:
        lines += ["", f"Not run: {', '.join(skipped)} (json.loads holds about 5.4x the file; above "
                  f"{LOADS_MAX_BYTES / 1e9:.1f} GB it would not fit beside other work)."]
    return "\n".join(lines + _against_baseline(files, results, tools)) + "\n"


def _against_baseline(files: dict[str, Path], results: dict[tuple[str, str], list[Run]],
                      tools: list[tuple[str, object]]) -> list[str]:
    """tracewhy over its baseline tree, run by run: each pair ran one after the other, so a change
    in the machine's load weighs on both alike (the medians above can pair different moments)."""
    baseline = next((tool for tool, _ in tools if tool.startswith("tracewhy at ")), None)
    if baseline is None:
        return []
    lines = ["", f"tracewhy / {baseline}, the median of the ratios of runs made side by side "
             "(below 1: this tree is quicker or smaller):", "",
             "| file | pairs | wall | CPU | peak RSS |", "| --- | ---: | ---: | ---: | ---: |"]
    for label in files:
        pairs = [(a, b) for a, b in zip(results.get((label, "tracewhy"), []), results.get((label, baseline), []),
                                        strict=False) if a.ok and b.ok]
        if not pairs:
            continue
        ratios = [statistics.median(getattr(a, attr) / getattr(b, attr) for a, b in pairs if getattr(b, attr))
                  for attr in ("wall_s", "cpu_s", "peak_rss_bytes")]
        lines.append(f"| {label} | {len(pairs)} | " + " | ".join(f"{r:.3f}" for r in ratios) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=inflate.DEFAULT_SOURCE,
                   help="real trace to measure and inflate (default: the largest in ../shared/traces)")
    p.add_argument("--target-bytes", type=float, default=inflate.DEFAULT_TARGET_BYTES,
                   help="size of the inflated trace (default 1e9)")
    p.add_argument("--repeats", type=int, default=3, help="runs per tool and file (median kept)")
    p.add_argument("--timeout-s", type=float, default=600, help="limit per tracewhy/json.loads run")
    p.add_argument("--hta-timeout-s", type=float, default=900, help="limit per HTA run (default 15 min)")
    p.add_argument("--hta-mem-limit-gb", type=float, default=16,
                   help="address-space limit for HTA runs, so a blow-up cannot take the machine")
    p.add_argument("--hta-repeats-large", type=int, default=None,
                   help="HTA runs on the inflated file (default: --repeats)")
    p.add_argument("--skip-hta", action="store_true")
    p.add_argument("--skip-cache-hit", action="store_true",
                   help="do not also time tracewhy re-reading through its parsed-trace cache")
    p.add_argument("--only", choices=("real", "inflated"), default=None, help="measure one size only")
    p.add_argument("--no-write", action="store_true", help="print the table, leave results.md alone")
    p.add_argument("--results", type=Path, default=RESULTS,
                   help="where the table goes (default bench/results.md; the 271 MB comparison: results_271.md)")
    p.add_argument("--tracewhy-commit", metavar="REV", default=None,
                   help="measure src/ as committed at REV instead of the installed tracewhy")
    p.add_argument("--throughput", action="store_true",
                   help="measure the whole command's MB/s and peak RSS at --sizes instead (results_read_throughput.md)")
    p.add_argument("--sizes", default="271M,1G,5G", help="throughput rows, of " + ", ".join(THROUGHPUT_SIZES))
    p.add_argument("--repeats-large", type=int, default=1,
                   help="throughput: runs per tool of a file over 1.2 GB (the 5 GB one), where json.loads is not run")
    p.add_argument("--file", action="append", default=[], metavar="LABEL=PATH",
                   help="a throughput row's file, already made (else made once in --dir)")
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "tracewhy-bench-read",
                   help="where throughput files are made")
    p.add_argument("--baseline-src", type=Path, default=None,
                   help="also measure the tracewhy whose src/ this is (a worktree of the baseline), side by side")
    p.add_argument("--baseline-label", default="baseline", help="the baseline's name in the table")
    p.add_argument("--skip-loads", action="store_true",
                   help="throughput: leave out the json.loads rows (tracewhy beside its baseline only)")
    args = p.parse_args(argv)
    pyc_cache.as_installed()
    if args.throughput:
        if args.results == RESULTS:
            args.results = THROUGHPUT_RESULTS
        return throughput(args)
    with tempfile.TemporaryDirectory(prefix="bench-tracewhy-") as tmp:
        return _main(args, Path(tmp))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _main(args: argparse.Namespace, tmp: Path) -> int:
    commit = args.tracewhy_commit
    tracewhy_source = use_tracewhy_commit(commit, tmp) if commit else tracewhy_provenance()
    log(f"tracewhy: {tracewhy_source}")
    files = prepare_files(args.source, int(args.target_bytes), log)
    if args.only == "real":
        files = files[:2]
    elif args.only == "inflated":
        files = files[2:]
    loads = [os.getloadavg()]
    log("load average at start: {:.2f} {:.2f} {:.2f}".format(*loads[0]))
    results: dict[tuple[str, str], list[Run]] = {}
    mem_limit = int(args.hta_mem_limit_gb * 2**30) if args.hta_mem_limit_gb else None
    with_cache = {"TRACEWHY_CACHE_DIR": str(CACHE_DIR)}
    for f in files:
        cache_hit = False
        if not args.skip_cache_hit:
            # Prime the cache (untimed); the row is kept only if this tracewhy wrote an entry.
            shutil.rmtree(CACHE_DIR, ignore_errors=True)
            tracewhy_run(f.path, args.timeout_s, env=with_cache)
            cache_hit = CACHE_DIR.is_dir() and any(CACHE_DIR.iterdir())
        hta_repeats = args.repeats
        if f.inflated and args.hta_repeats_large is not None:
            hta_repeats = args.hta_repeats_large
        for i in range(args.repeats):
            # Interleaved, so that a change in the machine's load hits every tool alike.
            contenders: list[tuple[str, Callable[[], Run]]] = [
                ("json.loads", lambda f=f: json_loads_run(f.path, args.timeout_s)),
                ("tracewhy", lambda f=f: tracewhy_run(f.path, args.timeout_s)),
            ]
            if cache_hit:
                contenders.append(("tracewhy, cache hit",
                                   lambda f=f: tracewhy_run(f.path, args.timeout_s, env=with_cache)))
            if not args.skip_hta and i < hta_repeats:
                contenders.append(("HTA", lambda f=f: hta_run(f.path, args.hta_timeout_s, mem_limit)))
            for tool, measure in contenders:
                r = measure()
                results.setdefault((f.label, tool), []).append(r)
                log(f"{f.label} | {tool} | run {i + 1}: {r.wall_s:.2f} s, "
                    f"{r.peak_rss_bytes / MB:,.0f} MB, {'ok' if r.ok else 'FAILED'} {r.note}")
                loads.append(os.getloadavg())
    shutil.rmtree(CACHE_DIR, ignore_errors=True)
    loads.append(os.getloadavg())
    table = render(files, results, args.repeats, loads, tracewhy_source)
    print(table)
    if not args.no_write:
        args.results.write_text(table)
        log(f"written to {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
