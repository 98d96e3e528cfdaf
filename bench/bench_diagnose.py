"""Target: ``tracewhy diagnose`` must stay within 1.5x the time of ``tracewhy kernels`` on the
same trace (the largest real one and the ~1 GB inflation), cold, cache off.

Each run is a fresh process timed inside itself after its imports (read + model + analysis +
rendering), medians of ``--repeats``; the two commands alternate so machine load hits both.

``--compile``: the torch.compile rule may add at most 15% to ``diagnose`` on the 1 GB
trace. ``diagnose`` runs in fresh processes with the rule and without it (the child drops the
rule, the report's compile analysis and the spike finding's use of it: a toggle only this bench
sets), interleaved, medians of ``--repeats``; ``compile_analysis`` alone is timed on the read
trace too. And a cold compile captured with the Python tracer on (``with_stack=True``, made here
with torch when it is installed) must be analysed in under 2 s: its compile-time events are
counted (host slices inside compile phases) and ``compile_analysis`` timed on the read trace.

    python bench/bench_diagnose.py            # after bench_read.py has made bench/out/
    python bench/bench_diagnose.py --compile [--work-dir DIR]   # the 1 GB trace bench_cache.py made there
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pyc_cache

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"
FILES = ("h100_owlv2-large_zero-shot.json", "h100_owlv2-large_zero-shot.inflated.json")
RESULTS = BENCH / "results_diagnose.md"
DIAGNOSE_VS_KERNELS_HEADING = "# diagnose vs kernels (target: diagnose <= 1.5x kernels)"
COMPILE_COST_HEADING = "# torch.compile in diagnose (target: at most +15% on 1 GB; a 20k-event cold compile under 2 s)"
INFLATED = "h100_owlv2-large_zero-shot.inflated.json"

_CHILD = """
import contextlib, io, json, sys, time
from tracewhy.cli import main
import tracewhy.cli.commands.{command}
t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["{command}", sys.argv[1], "--json", "--no-cache"])
print(json.dumps({{"seconds": time.perf_counter() - t0, "code": code}}))
"""

#: diagnose without the compile rule: the bench's toggle, set in its child process only.
_WITHOUT_COMPILE = """
import tracewhy.reports.diagnose as d, tracewhy.findings.host as host, tracewhy.findings.compile as c
d.RULES = tuple(r for r in d.RULES if r is not c.findings)
d._compile = lambda ctx: None
host._compile_in_spikes = lambda ctx, spike_steps: ({}, 0)
"""

_ANALYSIS = """
import json, sys, time
from tracewhy.analyses.compile import compile_analysis
from tracewhy.analyses.host_activity import build_host_index
from tracewhy.analyses.steps import steps
from tracewhy.analyses.syncs import compiler_rows
from tracewhy.model.schema import Col
from tracewhy.readers import read_trace
trace = read_trace(sys.argv[1])
st = steps(trace)
seconds = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    r = compile_analysis(trace, st)
    seconds.append(time.perf_counter() - t0)
host = build_host_index(trace)
events = int(compiler_rows(trace.slices.get_column(Col.NAME).gather(host.ids), host).sum())
print(json.dumps({"seconds": sorted(seconds)[len(seconds) // 2], "slices": trace.slices.height,
                  "compile_events": events, "compile_ns": r.compile_ns}))
"""

#: A cold torch.compile captured with the Python tracer on: every Dynamo, AOT autograd and
#: inductor frame of the compile is a slice (the target's "20 k compile-time events").
_COLD_STACK = """
import sys, torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
model = torch.compile(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)))
x = torch.randn(16, 32)
with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
    for step in range(3):
        with record_function(f"ProfilerStep#{step}"):
            model(x).sum().backward()
prof.export_chrome_trace(sys.argv[1])
"""


def _child(code: str, *argv: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True,
                         env={**os.environ, "TRACEWHY_NO_CACHE": "1"})
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run(command: str, path: Path, prelude: str = "") -> float:
    report = _child(prelude + _CHILD.format(command=command), str(path))
    if report["code"] != 0:
        raise SystemExit(f"{command} {path.name} exited {report['code']}")
    return float(report["seconds"])


def cold_stack_trace(work_dir: Path) -> Path | None:
    """The cold compile with stacks, made once in ``work_dir`` (None without torch)."""
    path = work_dir / "cold_compile_with_stack.pt.trace.json"
    raw = work_dir / "cold_compile_with_stack.raw.json"
    if path.exists():
        return path
    if not raw.exists():
        try:
            import torch  # noqa: F401  (only whether it is installed)
        except ImportError:
            return None
        work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="inductor-", dir=work_dir) as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
            subprocess.run([sys.executable, "-c", _COLD_STACK, str(raw)], check=True, env=env, timeout=1800,
                           capture_output=True)
    _escape_names(raw, path)
    return path


#: torch 2.13's export_chrome_trace writes Python frame names of exec'd code unescaped
#: (``"name": "torch/_higher_order_ops/passes/inline_invoke_subgraph.py(0):     "ReLU",",``), which
#: is not JSON (tracewhy rejects the file). The export puts one key per line, so each
#: ``"name"`` line is written again with its value escaped.
_NAME_LINE = re.compile(r'^(\s*"name": )"(.*)",$')


def _escape_names(raw: Path, path: Path) -> None:
    with raw.open(encoding="utf-8") as src, path.open("w", encoding="utf-8") as dst:
        for line in src:
            m = _NAME_LINE.match(line.rstrip("\n"))
            unescaped = m is not None and '"' in m.group(2).replace('\\"', "")
            dst.write(f"{m.group(1)}{json.dumps(m.group(2))},\n" if m and unescaped else line)


def write_section(title: str, text: str) -> None:
    """Replace this section of results_diagnose.md (its title to the next title), keep the others."""
    old = RESULTS.read_text() if RESULTS.exists() else ""
    kept = ["# " + part.rstrip("\n") + "\n" for part in ("\n" + old).split("\n# ")[1:]
            if not ("# " + part).startswith(title)]
    RESULTS.write_text("\n".join([*kept, text]))


def compile_cost(work_dir: Path, repeats: int) -> int:
    path = work_dir / INFLATED
    if not path.exists():
        print(f"missing {path}: run bench/bench_cache.py --work-dir {work_dir} first", file=sys.stderr)
        return 1
    load = os.getloadavg()
    on, off = [], []
    for _ in range(repeats):
        on.append(run("diagnose", path))
        off.append(run("diagnose", path, _WITHOUT_COMPILE))
    with_s, without_s = statistics.median(on), statistics.median(off)
    big = _child(_ANALYSIS, str(path), str(repeats))
    lines = [COMPILE_COST_HEADING, "",
             f"Fresh processes, timed after imports, cache off, medians of {repeats} (with and without the rule "
             f"interleaved); load average at start {load[0]:.2f}, on a 2-core machine shared with other work.", "",
             "| trace | MB | slices | diagnose s | without the compile rule s | added (target <= +15%) | "
             "compile_analysis alone s |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
             f"| {path.name} | {path.stat().st_size / 1e6:,.0f} | {int(big['slices']):,} | {with_s:.2f} | "
             f"{without_s:.2f} | {with_s / without_s - 1:+.1%} | {big['seconds']:.3f} |"]
    if not big["compile_ns"]:
        lines += ["", "It holds no torch.compile markers (an eager model): what the rule adds there is the search "
                      "for them; the cold compile below is the trace full of them."]
    cold = cold_stack_trace(work_dir)
    if cold is None:
        lines += ["", "torch is not installed here: the cold compile with stacks was not made."]
    else:
        c = _child(_ANALYSIS, str(cold), str(repeats))
        lines += ["", "| cold compile, with_stack=True | MB | slices | compile-time events | compile time | "
                      "compile_analysis s (target < 2) |", "| --- | ---: | ---: | ---: | ---: | ---: |",
                  f"| {cold.name} | {cold.stat().st_size / 1e6:,.1f} | {int(c['slices']):,} | "
                  f"{int(c['compile_events']):,} | {c['compile_ns'] / 1e9:.1f} s | {c['seconds']:.3f} |"]
    text = "\n".join(lines) + "\n"
    write_section(COMPILE_COST_HEADING, text)
    print(text)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="the compile rule's cost (see the docstring)")
    p.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "tracewhy-bench",
                   help="where bench_cache.py made the 1 GB trace (never inside the repo)")
    args = p.parse_args()
    pyc_cache.as_installed()
    if args.compile:
        return compile_cost(args.work_dir.resolve(), args.repeats)
    load = os.getloadavg()
    lines = [DIAGNOSE_VS_KERNELS_HEADING, "",
             f"Medians of {args.repeats} fresh processes, timed after imports, cache off; "
             f"load average at start {load[0]:.2f}.", "",
             "| file | MB | kernels s | diagnose s | diagnose / kernels (target <= 1.5) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name in FILES:
        path = OUT / name
        if not path.exists():
            print(f"missing {path}: run bench/bench_read.py first", file=sys.stderr)
            return 1
        k, d = [], []
        for _ in range(args.repeats):
            k.append(run("kernels", path))
            d.append(run("diagnose", path))
        km, dm = statistics.median(k), statistics.median(d)
        lines.append(f"| {name} | {path.stat().st_size / 1e6:,.0f} | {km:.2f} | {dm:.2f} | {dm / km:.2f} |")
    text = "\n".join(lines) + "\n"
    write_section(DIAGNOSE_VS_KERNELS_HEADING, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
