"""Issue 3: ``tracewhy diagnose`` must stay within 1.5x the time of ``tracewhy kernels`` on the
same trace (the largest real one and the ~1 GB inflation), cold, cache off.

Each run is a fresh process timed inside itself after its imports (read + model + analysis +
rendering), medians of ``--repeats``; the two commands alternate so machine load hits both.

    python bench/bench_diagnose.py            # after bench_read.py has made bench/out/
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"
FILES = ("h100_owlv2-large_zero-shot.json", "h100_owlv2-large_zero-shot.inflated.json")
RESULTS = BENCH / "results_diagnose.md"

_CHILD = """
import contextlib, io, json, sys, time
from tracewhy.cli import main
import tracewhy.cli.commands.{command}
t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["{command}", sys.argv[1], "--json", "--no-cache"])
print(json.dumps({{"seconds": time.perf_counter() - t0, "code": code}}))
"""


def run(command: str, path: Path) -> float:
    out = subprocess.run([sys.executable, "-c", _CHILD.format(command=command), str(path)],
                         capture_output=True, text=True, check=True, env={**os.environ, "TRACEWHY_NO_CACHE": "1"})
    report = json.loads(out.stdout.strip().splitlines()[-1])
    if report["code"] != 0:
        raise SystemExit(f"{command} {path.name} exited {report['code']}")
    return float(report["seconds"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    load = os.getloadavg()
    lines = ["# diagnose vs kernels (issue 3: diagnose <= 1.5x kernels)", "",
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
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
