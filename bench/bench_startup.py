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

Python's bytecode cache is on, in a scratch folder, filled by one untimed run of each command:
an installed tracewhy has its .pyc files (pip compiles them). So is the command's own table of
compiled dataclass methods (``tracewhy/code_cache.py``), under a scratch cache directory: a
user's first run of a command fills it, as their first import fills ``__pycache__``. Where PYTHONDONTWRITEBYTECODE is
set (this machine's shell sets it), every run would otherwise compile each tracewhy module it
imports, about 0.1 s of a command's time; ``--no-bytecode-cache`` measures that way.

Each command runs as the ``tracewhy`` script that installing the package writes runs it
(``tracewhy.console``'s ``console_main``, under ``python -c``, so that PYTHONPATH picks the tree
measured), not as ``python -m tracewhy``: run through ``runpy``, the same commands took 10-50 ms longer (on the BERT
trace, 2026-12-01, medians of 9: ``kernels`` 0.333 s against 0.282 s, ``diff`` 0.669 against
0.626, ``diagnose`` 0.483 against 0.474), most of it in numpy's ``numpy._typing`` modules when
numpy is imported after polars (45-50 ms instead of 1.5 ms); the pages before that date were
measured with ``-m``.

``--baseline REV`` also times the source tree of git revision REV (extracted with ``git archive``
and put first on PYTHONPATH) in the same run, its runs taking turns with the current tree's, so
that a before/after table shares the machine's load.

``--trace PATH`` runs the commands on another trace (an Nsight Systems export, say) and
``--results PATH`` writes the table elsewhere.

Usage: python bench/bench_startup.py [--repeats 5] [--commands diagnose,kernels,...] [--baseline REV]
       [--trace PATH] [--results PATH]
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
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SOURCE = REPO.parent / "shared/traces/tracelens/h100_bert-small_bs1_seq512.json.gz"
RESULTS = BENCH / "results_startup.md"
TARGET_S = 0.5
#: What the installed ``tracewhy`` script runs (setuptools' console-script wrapper), as ``-c`` code:
#: ``tracewhy.console`` since 2026-12-01 (it starts a small diff's helper before the command line's
#: imports), ``tracewhy.cli`` in the trees before (a ``--baseline`` run).
SCRIPT = ("import sys\ntry:\n    from tracewhy.console import console_main\n"
          "except ImportError:\n    from tracewhy.cli import console_main\n"
          "sys.argv[0] = 'tracewhy'\nconsole_main()")
#: Packages whose import time is reported on its own; the rest are summed as "other".
PACKAGES = ("tracewhy", "polars", "numpy", "rich", "msgspec", "duckdb", "matplotlib", "pyarrow")
_IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)")


def commands(trace: Path, scratch: Path) -> dict[str, list[str]]:
    """Each command's arguments on ``trace`` (diff and ranks get it twice, as two runs/ranks)."""
    t = str(trace)
    second = trace.with_name("rank1" + "".join(trace.suffixes))
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


def child_env(scratch: Path, bytecode: bool, src: Path | None = None) -> dict[str, str]:
    """The runs' environment: parse cache off; the bytecode cache, and the command's table of
    compiled dataclass methods (``code_cache``), in ``scratch`` (or neither); ``src`` first on
    the path (a baseline tree)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "TRACEWHY_NO_CODE_CACHE")}
    env["TRACEWHY_NO_CACHE"] = "1"
    env["TRACEWHY_CACHE_DIR"] = str(scratch / "cache")
    if bytecode:
        env["PYTHONPYCACHEPREFIX"] = str(scratch / "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["TRACEWHY_NO_CODE_CACHE"] = "1"
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p)
    return env


def baseline_tree(rev: str, scratch: Path) -> Path:
    """The ``src`` folder of git revision ``rev``, extracted into ``scratch``."""
    archive = subprocess.run(["git", "archive", rev, "src"], capture_output=True, cwd=REPO, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
    return scratch / "src"


def _once(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall and CPU seconds (user + system, the process and anything it waited for) of one
    fresh process, and its exit status."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, env=env, cwd=REPO)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return took, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, proc.returncode


def wall(argv: list[str], repeats: int, *envs: dict[str, str]) -> list[tuple[float, float, int]]:
    """Per environment, the median wall seconds and median CPU seconds of ``argv`` over
    ``repeats`` fresh processes, and its last exit status. The environments take turns, run by
    run, so that a baseline and the current tree share the machine's load. On a loaded machine
    the CPU seconds are the steadier figure: wall time there is mostly waiting for a core."""
    runs: list[list[tuple[float, float, int]]] = [[] for _ in envs]
    for _ in range(repeats):
        for i, env in enumerate(envs):
            runs[i].append(_once(argv, env))
    return [(statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs), rs[-1][2]) for rs in runs]


def import_profile(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Seconds of import self time per package, from ``-X importtime``."""
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
    p.add_argument("--no-bytecode-cache", action="store_true", help="compile every module in every run")
    p.add_argument("--baseline", metavar="REV", help="also time the source tree of this git revision")
    p.add_argument("--trace", type=Path, default=SOURCE,
                   help="another trace (gzip is inflated first), e.g. an Nsight Systems export")
    p.add_argument("--results", type=Path, default=RESULTS, help="where the table goes")
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tracewhy-startup-"))
    bytecode = not args.no_bytecode_cache
    # This tree's src first on the path, whatever PYTHONPATH says: an editable install of another
    # checkout would otherwise be what the "after" runs import.
    env = child_env(scratch, bytecode, REPO / "src")
    base_env = child_env(scratch, bytecode, baseline_tree(args.baseline, scratch)) if args.baseline else None
    source: Path = args.trace
    suffixes = [x for x in source.suffixes[-2:] if x != ".gz"] or [".json"]
    trace = scratch / ("rank0" + "".join(suffixes))
    trace.write_bytes(gzip.decompress(source.read_bytes()) if source.suffix == ".gz" else source.read_bytes())
    chosen = commands(trace, scratch)
    if args.commands:
        chosen = {k: v for k, v in chosen.items() if k in args.commands.split(",")}
    py = [sys.executable]
    load_start = os.getloadavg()
    wall([*py, "-c", "import polars, numpy"], 1, env)  # untimed: fills the bytecode cache
    ((floor_py, floor_py_cpu, _),) = wall([*py, "-c", "pass"], args.repeats, env)
    ((floor_libs, floor_libs_cpu, _),) = wall([*py, "-c", "import polars, numpy"], args.repeats, env)
    rows, before = [], {}
    for name, argv in chosen.items():
        full = [*py, "-c", SCRIPT, *argv]
        variants = [[*full, "--json"], full] if has_json(argv) else [full]
        for v in variants:  # untimed: fills the bytecode cache (and the OS's file cache)
            for e in (env, base_env):
                if e is not None and bytecode:
                    _once(v, e)
        envs = [env] if base_env is None else [env, base_env]
        text_runs = wall(full, args.repeats, *envs)
        json_runs = wall([*full, "--json"], args.repeats, *envs) if has_json(argv) else None
        text_s, text_cpu, rc = text_runs[0]
        json_s, json_cpu, json_rc = json_runs[0] if json_runs is not None else (None, None, 0)
        if base_env is not None:
            before[name] = (text_runs[1][:2], json_runs[1][:2] if json_runs is not None else None)
        imports = import_profile([*full, "--json"] if has_json(argv) else full, env)
        rows.append((name, text_s, text_cpu, rc, json_s, json_cpu, json_rc, imports, os.getloadavg()[0]))
        print(f"{name}: {text_s:.2f} s, {text_cpu:.2f} CPU s, rc {rc}"
              + (f"; baseline {before[name][0][0]:.2f} s, {before[name][0][1]:.2f} CPU s" if name in before else ""),
              file=sys.stderr)
    load_end = os.getloadavg()
    trace_mb = trace.stat().st_size / 1e6
    shutil.rmtree(scratch, ignore_errors=True)
    head = " | ".join(f"{k} import s" for k in (*PACKAGES[:4], "other"))
    lines = [
        "# Every command on a 1 MB trace, whole process", "",
        f"Made by `python bench/bench_startup.py`. Trace: {source.name} decompressed "
        f"({trace_mb:.2f} MB). "
        f"Parse cache off; medians of {args.repeats} fresh processes, each run as the installed `tracewhy` script "
        f"runs it (not `python -m tracewhy`); target <= {TARGET_S} s whole-process. "
        + ("Python's bytecode cache on (as installed), and the command's table of compiled dataclass "
           "methods, both filled by an untimed run." if bytecode else
           "No bytecode cache and no table of dataclass methods: every run compiles what it imports."), "",
        f"- machine: {os.cpu_count()} logical cores, Python {platform.python_version()}",
        f"- load average (1/5/15 min) at start: {' / '.join(f'{v:.2f}' for v in load_start)}; at end: "
        f"{' / '.join(f'{v:.2f}' for v in load_end)} (shared machine: timings are noisy)",
        f"- floors (wall / CPU s): `python -c pass` {floor_py:.3f} / {floor_py_cpu:.3f}; "
        f"`python -c 'import polars, numpy'` {floor_libs:.3f} / {floor_libs_cpu:.3f}", "",
    ]
    if before:
        lines += _before_after(rows, before, args.baseline)
    lines += [
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
        args.results.write_text(text)
    return 0


def _before_after(rows: list[tuple[Any, ...]], before: dict[str, Any], rev: str) -> list[str]:
    """The table of wall / CPU seconds at ``rev`` and now, text and --json, same runs' load."""
    out = [f"Before (`{rev}`) and after, wall / CPU s, the two trees' runs taking turns:", "",
           "| command | text before | text after | --json before | --json after |",
           "| --- | ---: | ---: | ---: | ---: |"]
    for name, text_s, text_cpu, _rc, json_s, json_cpu, *_ in rows:
        (b_text, b_json) = before[name]
        cells = [f"{b_text[0]:.2f} / {b_text[1]:.2f}", f"{text_s:.2f} / {text_cpu:.2f}",
                 "" if b_json is None else f"{b_json[0]:.2f} / {b_json[1]:.2f}",
                 "" if json_s is None else f"{json_s:.2f} / {json_cpu:.2f}"]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*out, ""]


if __name__ == "__main__":
    raise SystemExit(main())
