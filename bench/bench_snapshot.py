"""Target: a ~100 MB CUDA allocator snapshot read and analysed by tracewhy within 2x the
time of a plain ``pickle.load`` of it (what torch's own ``torch/cuda/_memory_viz.py`` does,
running whatever the file names), side by side with that viewer's own CPU-side work.

Each variant runs in a fresh process, timed inside itself after its imports, and the whole
process is timed too (interpreter start and imports included); medians of ``--repeats``,
variants interleaved so machine load hits them all alike:

- ``pickle.load``: the unsafe baseline, as ``python -m torch.cuda._memory_viz`` loads a file;
- ``pickle.load, gc off``: the same with the cyclic collector paused, for reference (tracewhy
  pauses it while it loads and walks a snapshot);
- ``tracewhy load``: the restricted unpickler alone (every global refused);
- ``tracewhy read``: ``read_memory_snapshot``, the load plus the segment, block and event tables;
- ``tracewhy memory --json``: the command, read + replay + findings + JSON;
- ``torch _memory_viz``: ``pickle.load``, then ``segsum`` (segment summary), ``trace`` (the
  history as text) and ``trace_plot`` (the HTML for the browser viewer, which replays it there).

The numbers are checked too: tracewhy's peak, its trace entry and the final allocated bytes
must equal a plain-Python replay of the same file loaded with ``pickle.load``.

    python bench/make_snapshot.py           # /tmp/tracewhy-bench/snapshot.pickle, ~100 MB
    python bench/bench_snapshot.py          # writes bench/results_snapshot.md
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results_snapshot.md"
DEFAULT_SNAPSHOT = Path(tempfile.gettempdir()) / "tracewhy-bench" / "snapshot.pickle"
TARGET_RATIO = 2.0
ALLOCATED_STATES = ("active_allocated", "active_awaiting_free")

_CHILD = r"""
import json, resource, sys, time
variant, path = sys.argv[1], sys.argv[2]
import gc, pickle
if variant.startswith("tracewhy"):
    import contextlib, io
    from tracewhy.cli import main
    import tracewhy.cli.commands.memory
    from tracewhy.readers.memory.snapshot import load_plain_pickle, read_memory_snapshot
    from pathlib import Path
if variant == "torch":
    from torch.cuda import _memory_viz
stages, check = {}, None
t0 = last = time.perf_counter()
def stage(name):
    global last
    now = time.perf_counter()
    stages[name], last = now - last, now
if variant in ("pickle", "pickle-nogc", "torch"):
    if variant == "pickle-nogc":
        gc.disable()
    with open(path, "rb") as f:
        data = pickle.load(f)
    stage("load")
    if variant == "torch":
        _memory_viz.segsum(data)
        stage("segsum")
        _memory_viz.trace(data)
        stage("trace")
        _memory_viz.trace_plot(data)
        stage("trace_plot")
elif variant == "tracewhy-load":
    load_plain_pickle(Path(path))
elif variant == "tracewhy-read":
    read_memory_snapshot(path)
elif variant == "tracewhy-memory":
    with contextlib.redirect_stdout(io.StringIO()) as out:
        if main(["memory", path, "--json"]) != 0:
            raise SystemExit("tracewhy memory failed")
    check = [{k: d[k] for k in ("device", "events", "peak_allocated_bytes", "peak_seq", "final_allocated_bytes")}
             for d in json.loads(out.getvalue())["devices"]]
total = time.perf_counter() - t0
print(json.dumps({"seconds": total, "stages": stages, "check": check,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

#: Variant -> its label in the table.
VARIANTS = {
    "pickle": "`pickle.load` (unsafe baseline)",
    "pickle-nogc": "`pickle.load`, gc off (reference)",
    "tracewhy-load": "tracewhy restricted load",
    "tracewhy-read": "tracewhy read (load + tables)",
    "tracewhy-memory": "`tracewhy memory --json` (read + analysis + JSON)",
    "torch": "torch `_memory_viz` (load, segsum, trace, trace_plot)",
}


def run(variant: str, path: Path) -> dict[str, Any]:
    """One fresh process: its own timing after imports, and its wall time from here."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _CHILD, variant, str(path)], capture_output=True, text=True,
                         check=True, env={**os.environ, "TRACEWHY_NO_CACHE": "1"})
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    report["process_seconds"] = time.perf_counter() - t0
    return report


def replayed(path: Path) -> list[dict[str, Any]]:
    """The oracle: per device, the final allocated bytes less each entry's change replayed
    backward, in plain Python over ``pickle.load``'s data (a file this script's sibling wrote)."""
    with open(path, "rb") as f:
        data = pickle.load(f)  # our own generated file
    out = []
    for device, trace in enumerate(data["device_traces"]):
        final = sum(b["size"] for s in data["segments"] if s["device"] == device for b in s["blocks"]
                    if b["state"] in ALLOCATED_STATES)
        if not trace and final == 0:
            continue
        deltas = [e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed" else 0
                  for e in trace]
        level = best = final - sum(deltas)
        best_seq = None
        for seq, delta in enumerate(deltas):
            level += delta
            if level > best:
                best, best_seq = level, seq
        out.append({"device": f"cuda:{device}", "events": len(trace), "peak_allocated_bytes": best,
                    "peak_seq": best_seq, "final_allocated_bytes": final})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("snapshot", nargs="?", type=Path, default=DEFAULT_SNAPSHOT)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    args = p.parse_args()
    if not args.snapshot.exists():
        print(f"missing {args.snapshot}: run bench/make_snapshot.py first", file=sys.stderr)
        return 1
    variants = args.variants.split(",")
    load_start = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for i in range(args.repeats):
        for v in variants:
            runs[v].append(run(v, args.snapshot))
            print(f"repeat {i + 1} {v}: {runs[v][-1]['seconds']:.2f} s", file=sys.stderr)
    load_end = os.getloadavg()
    text = render(args.snapshot, runs, load_start[0], load_end[0], args.repeats)
    RESULTS.write_text(text)
    print(text)
    return 0


def render(path: Path, runs: dict[str, list[dict[str, Any]]], load_start: float, load_end: float,
           repeats: int) -> str:
    def median(v: str, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[v]))

    base = median("pickle", "seconds") if "pickle" in runs else None
    base_process = median("pickle", "process_seconds") if "pickle" in runs else None
    lines = [
        "# CUDA allocator snapshot: tracewhy against `pickle.load` (target: read + analysis <= 2x)", "",
        f"`{path.name}`: {path.stat().st_size / 1e6:,.1f} MB, written by `bench/make_snapshot.py`. "
        f"Medians of {repeats} fresh processes per variant, interleaved; load average {load_start:.2f} at start, "
        f"{load_end:.2f} at the end ({os.cpu_count()} cores). \"after imports\" is timed inside the process; "
        "\"process\" is the whole process from outside (interpreter start and imports included).", "",
        "| variant | after imports s | / pickle.load | process s | / pickle.load | peak RSS MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for v, rs in runs.items():
        s, ps = median(v, "seconds"), median(v, "process_seconds")
        ratio = f"{s / base:.2f}" if base else "-"
        ratio_p = f"{ps / base_process:.2f}" if base_process else "-"
        lines.append(f"| {VARIANTS[v]} | {s:.2f} | {ratio} | {ps:.2f} | {ratio_p} | "
                     f"{statistics.median(r['maxrss_mb'] for r in rs):,.0f} |")
    if "torch" in runs:
        stages = {k: statistics.median(r["stages"][k] for r in runs["torch"]) for k in runs["torch"][0]["stages"]}
        lines += ["", "torch `_memory_viz` by stage (medians, s): "
                  + ", ".join(f"{k} {val:.2f}" for k, val in stages.items()) + "."]
    if "tracewhy-memory" in runs:
        got, want = runs["tracewhy-memory"][0]["check"], replayed(path)
        verdict = "equal" if got == want else f"DIFFER: tracewhy {got} vs replay {want}"
        lines += ["", f"Check: tracewhy's events, peak, peak entry and final allocated bytes against a plain-Python "
                  f"replay of `pickle.load`'s data: {verdict} ({json.dumps(want)})."]
    if base and "tracewhy-memory" in runs:
        target = median("tracewhy-memory", "seconds") / base
        lines += ["", f"Target: `tracewhy memory --json` after imports / `pickle.load` = {target:.2f} "
                  f"({'within' if target <= TARGET_RATIO else 'over'} {TARGET_RATIO:g}x)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
