"""Target: ``tracewhy diagnose`` on a ``profile_memory`` trace with the memory analysis must
stay within 2x the time of the same diagnosis without it (the real V100 DDP memory trace, and
its ~1 GB inflation made by bench/inflate.py).

Each run is a fresh process timed inside itself after its imports (read + model + analysis +
rendering), medians of ``--repeats``, cache off; the two variants alternate so machine load hits
both. "Without" is the same command with the memory analysis switched off in that process
(``findings.memory.memory_result`` answering None, as for a trace without memory events).

    zcat ../shared/traces/hta/v100_ddp2_rank1_memprofile.json.gz > bench/out/v100_ddp2_rank1_memprofile.json
    python bench/inflate.py bench/out/v100_ddp2_rank1_memprofile.json \\
        -o bench/out/v100_ddp2_rank1_memprofile.inflated.json --target-bytes 1e9
    python bench/bench_memory.py
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
FILES = ("v100_ddp2_rank1_memprofile.json", "v100_ddp2_rank1_memprofile.inflated.json")
RESULTS = BENCH / "results_memory.md"

_CHILD = """
import contextlib, io, json, sys, time
from tracewhy.cli import main
import tracewhy.cli.commands.diagnose
import tracewhy.findings.memory, tracewhy.findings.platform
if sys.argv[2] == "without":
    tracewhy.findings.memory.memory_result = tracewhy.findings.platform.memory_result = lambda ctx: None
t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(["diagnose", sys.argv[1], "--json", "--no-cache"])
codes = sorted({f["code"] for f in json.loads(out.getvalue())["findings"] if "memory" in f["code"]})
print(json.dumps({"seconds": time.perf_counter() - t0, "code": code, "memory_codes": codes}))
"""


def run(path: Path, variant: str) -> tuple[float, list[str]]:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), variant], capture_output=True, text=True,
                         check=True, env={**os.environ, "TRACEWHY_NO_CACHE": "1"})
    report = json.loads(out.stdout.strip().splitlines()[-1])
    if report["code"] != 0:
        raise SystemExit(f"diagnose {path.name} ({variant}) exited {report['code']}")
    return float(report["seconds"]), list(report["memory_codes"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    load = os.getloadavg()
    lines = ["# diagnose with and without the memory analysis (target: with <= 2x without)", "",
             f"Medians of {args.repeats} fresh processes, timed after imports, cache off; "
             f"load average at start {load[0]:.2f}.", "",
             "| file | MB | without s | with s | with / without (target <= 2) | memory findings |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for name in FILES:
        path = OUT / name
        if not path.exists():
            print(f"missing {path}: see this script's docstring", file=sys.stderr)
            return 1
        without, with_, codes = [], [], []
        for _ in range(args.repeats):
            without.append(run(path, "without")[0])
            seconds, codes = run(path, "with")
            with_.append(seconds)
        a, b = statistics.median(without), statistics.median(with_)
        lines.append(f"| {name} | {path.stat().st_size / 1e6:,.0f} | {a:.2f} | {b:.2f} | {b / a:.2f} | "
                     f"{', '.join(codes)} |")
    text = "\n".join(lines) + "\n"
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
