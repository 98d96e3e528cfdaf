"""Every command on a 1 MB trace, whole process: wall time, and what each one imports.

The trace is the real TraceLens H100 BERT-small trace (1.08 MB of JSON). Each command runs in a
fresh interpreter with the parse cache off (``TRACEWHY_NO_CACHE=1``, the first run a user
sees), output to a pipe (rendered text, as a terminal would get it, but no progress bar) and,
where the command has it, ``--json``; the median of ``--repeats`` runs is reported, next to
Python's own start-up (``python -c pass``) and the floor of importing polars and numpy, which
every command that reads a trace needs.

One more run per command under ``python -X importtime`` says where the import time goes: the
self time of every module summed by top-level package (tracewhy, polars, numpy, rich, duckdb,
matplotlib, everything else), so a command that pays for an import it does not use shows it.
Import times under ``-X importtime`` are a little inflated by the measuring itself.

Usage: python bench/bench_startup.py [--repeats 5] [--commands diagnose,kernels,...]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SOURCE = REPO.parent / "shared/traces/tracelens/h100_bert-small_bs1_seq512.json.gz"
RESULTS = BENCH / "results_startup.md"
TARGET_S = 0.5
#: Packages whose import time is reported on its own; the rest are summed as "other".
PACKAGES = ("tracewhy", "polars", "numpy", "rich", "msgspec", "duckdb", "matplotlib", "pyarrow")
_IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)")


def commands(trace: Path, scratch: Path) -> dict[str, list[str]]:
    """Each command's arguments on ``trace`` (diff and ranks get it twice, as two runs/ranks)."""
    t = str(trace)
    second = scratch / "bert_rank1.json"
    if not second.exists():
        second.write_bytes(trace.read_bytes())
    per_trace = ("diagnose", "gaps", "info", "ops", "lines", "kernels", "nvtx", "steps", "overlap", "blocks",
                 "memory", "compile", "critical-path", "roofline")
    out = {name: [name, t] for name in per_trace}
    out["check"] = ["check", t, "--max-gpu-idle", "100%"]
    out["ranks"] = ["ranks", t, str(second)]
    out["diff"] = ["diff", t, str(second)]
    out["sql"] = ["sql", t, "SELECT count(*) FROM kernels"]
    out["export"] = ["export", t, "-o", str(scratch / "export.json")]
    out["report"] = ["report", t, "-o", str(scratch / "report.html")]
    out["which"] = ["which", "idle"]
    return out


def has_json(argv: list[str]) -> bool:
    return argv[0] not in ("export",)


def wall(argv: list[str], repeats: int) -> tuple[float, float, int]:
    """Median wall seconds and median CPU seconds (user + system, the process and anything it
    waited for) of ``argv`` in fresh processes, and its exit status. On a loaded machine the
    CPU seconds are the steadier figure: wall time there is mostly waiting for a core."""
    env = {**os.environ, "TRACEWHY_NO_CACHE": "1"}
    times, cpus, rc = [], [], 0
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, env=env, cwd=REPO)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        rc = proc.returncode
    return statistics.median(times), statistics.median(cpus), rc


def import_profile(argv: list[str]) -> dict[str, float]:
    """Seconds of import self time per package, from ``-X importtime``."""
    env = {**os.environ, "TRACEWHY_NO_CACHE": "1"}
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv[1:]], capture_output=True, env=env, cwd=REPO)
    totals: dict[str, float] = collections.defaultdict(float)
    for line in proc.stderr.decode(errors="replace").splitlines():
        m = _IMPORT_LINE.match(line)
        if m:
            root = m.group(2).split(".")[0].lstrip("_")
            key = root if root in PACKAGES else "polars" if root.startswith("polars") else "other"
            totals[key] += int(m.group(1)) / 1e6
    return dict(totals)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--commands", default=None, help="comma-separated subset")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tracewhy-startup-"))
    trace = scratch / "bert_rank0.json"
    with gzip.open(SOURCE, "rb") as f:
        trace.write_bytes(f.read())
    chosen = commands(trace, scratch)
    if args.commands:
        chosen = {k: v for k, v in chosen.items() if k in args.commands.split(",")}
    py = [sys.executable]
    load_start = os.getloadavg()
    floor_py, floor_py_cpu, _ = wall([*py, "-c", "pass"], args.repeats)
    floor_libs, floor_libs_cpu, _ = wall([*py, "-c", "import polars, numpy"], args.repeats)
    rows = []
    for name, argv in chosen.items():
        full = [*py, "-m", "tracewhy", *argv]
        text_s, text_cpu, rc = wall(full, args.repeats)
        json_s, json_cpu, json_rc = wall([*full, "--json"], args.repeats) if has_json(argv) else (None, None, 0)
        imports = import_profile([*full, "--json"] if has_json(argv) else full)
        rows.append((name, text_s, text_cpu, rc, json_s, json_cpu, json_rc, imports, os.getloadavg()[0]))
        print(f"{name}: {text_s:.2f} s, {text_cpu:.2f} CPU s, rc {rc}", file=sys.stderr)
    load_end = os.getloadavg()
    trace_mb = trace.stat().st_size / 1e6
    shutil.rmtree(scratch, ignore_errors=True)
    head = " | ".join(f"{k} import s" for k in (*PACKAGES[:4], "other"))
    lines = [
        "# Every command on a 1 MB trace, whole process", "",
        f"Made by `python bench/bench_startup.py`. Trace: {SOURCE.name} decompressed "
        f"({trace_mb:.2f} MB). "
        f"Parse cache off; medians of {args.repeats} fresh processes; target <= {TARGET_S} s whole-process.", "",
        f"- machine: {os.cpu_count()} logical cores, Python {platform.python_version()}",
        f"- load average (1/5/15 min) at start: {' / '.join(f'{v:.2f}' for v in load_start)}; at end: "
        f"{' / '.join(f'{v:.2f}' for v in load_end)} (shared machine: timings are noisy)",
        f"- floors (wall / CPU s): `python -c pass` {floor_py:.3f} / {floor_py_cpu:.3f}; "
        f"`python -c 'import polars, numpy'` {floor_libs:.3f} / {floor_libs_cpu:.3f}", "",
        f"| command | text wall s | text CPU s | --json wall s | --json CPU s | {head} | load 1 min |",
        "| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in range(5)) + " | ---: |",
    ]
    for name, text_s, text_cpu, rc, json_s, json_cpu, json_rc, imports, load in rows:
        cells = [f"{text_s:.2f}" + ("" if rc == 0 else f" (rc {rc})"), f"{text_cpu:.2f}",
                 "" if json_s is None else f"{json_s:.2f}" + ("" if json_rc == 0 else f" (rc {json_rc})"),
                 "" if json_cpu is None else f"{json_cpu:.2f}"]
        cells += [f"{imports.get(k, 0.0):.3f}" for k in (*PACKAGES[:4], "other")]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {load:.1f} |")
    extra = sorted({k for *_, imports, _l in rows for k in imports if k in PACKAGES[4:] and imports[k] > 0.001})
    if extra:
        lines += ["", "Also imported (seconds, --json run): " + "; ".join(
            f"{name}: " + ", ".join(f"{k} {imports[k]:.3f}" for k in extra if imports.get(k, 0) > 0.001)
            for name, *_, imports, _l in rows if any(imports.get(k, 0) > 0.001 for k in extra))]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
