"""Time tracewhy's critical path against HTA's critical_path_analysis on the same traces and the
same windows, side by side in one process.

For each trace, one window: an annotation's instance as HTA takes it (``annotation``,
``instance_id``: the instance's own span), given to tracewhy as ``CriticalPathOptions.window_ns``
so that both build their graph and path over the same events. Timed, each as the median of
``--repeats`` rounds with the two tools interleaved:

- read: HTA's ``TraceAnalysis(trace_dir=...)`` (parse into pandas) and tracewhy's ``read_trace``
  without the parsed-trace cache;
- path: HTA's ``critical_path_analysis`` (graph and networkx longest path) and tracewhy's
  ``critical_path`` for the window, which also replays the path without each of its top
  ``gain_items`` items (HTA computes no such gains);
- tracewhy's ``critical_path`` over all the trace's steps, for scale.

HTA is the ``traceinsight`` distribution (module ``hta``); the trace files are copied to a
temporary directory because HTA reads every trace in a directory. The table goes to stdout and
to ``bench/results_critical_path.md``.

Usage: python bench/bench_critical_path.py [--repeats 3] [--no-write]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from tracewhy.analyses.critical_path import CriticalPathOptions, critical_path
from tracewhy.model.cache import CacheOptions
from tracewhy.readers import read_trace

BENCH = Path(__file__).resolve().parent
TRACES = BENCH.parent.parent / "shared" / "traces"
RESULTS = BENCH / "results_critical_path.md"

#: (trace under shared/traces, annotation, instance) as HTA's critical_path_analysis takes them.
CASES = (
    ("hta/a100_alexnet_critical_path.json.gz", "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1),
    ("hta/a100_ddp2_rank0_nccl2.17.json.gz", "ProfilerStep", 1),
    ("hta/v100_ddp2_rank1_memprofile.json.gz", "ProfilerStep", 1),
)


def _median(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times: list[float] = []
    result: Any = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def _window(path: Path, annotation: str, instance: int) -> tuple[int, int]:
    """The instance's span, found as HTA finds it: the annotations whose name contains the text,
    in trace order."""
    s = read_trace(path).slices
    marks = s.filter(pl.col("name").cast(pl.String).str.contains(annotation, literal=True)
                     & pl.col("kind").cast(pl.String).is_in(["annotation", "cpu_op"])).sort("ts_ns")
    row = marks.row(instance, named=True)
    return int(row["ts_ns"]), int(row["ts_ns"] + row["dur_ns"])


def bench_case(relative: str, annotation: str, instance: int, repeats: int, work: Path) -> dict[str, Any]:
    from hta.trace_analysis import TraceAnalysis  # type: ignore[import-untyped]

    path = TRACES / relative
    folder = work / path.name.split(".")[0]
    folder.mkdir(exist_ok=True)
    shutil.copy(path, folder / path.name)
    window = _window(path, annotation, instance)
    hta_read, ta = _median(lambda: TraceAnalysis(trace_dir=str(folder)), repeats)
    rank = next(iter(ta.t.traces))  # the file's rank (distributedInfo)
    hta_path, (graph, ok) = _median(
        lambda: ta.critical_path_analysis(rank=rank, annotation=annotation, instance_id=instance), repeats)
    tw_read, trace = _median(lambda: read_trace(path, cache=CacheOptions(enabled=False)), repeats)
    tw_path, result = _median(lambda: critical_path(trace, CriticalPathOptions(window_ns=window)), repeats)
    tw_all, every = _median(lambda: critical_path(trace), repeats)
    step = result.steps.row(0, named=True)
    hta_total_us = sum(e.weight for e in graph.critical_path_edges_set) if ok else None
    return {
        "trace": relative, "window": f"{annotation} #{instance}", "events": trace.slices.height,
        "hta_read": hta_read, "hta_path": hta_path, "tw_read": tw_read, "tw_path": tw_path,
        "tw_all_steps": tw_all, "steps": every.steps.height,
        "window_ms": (window[1] - window[0]) / 1e6, "tw_total_ms": step["total_ns"] / 1e6,
        "hta_total_ms": hta_total_us / 1e3 if hta_total_us is not None else None,
    }


def render(rows: list[dict[str, Any]], repeats: int) -> str:
    lines = [
        "# Critical path: tracewhy vs HTA (bench_critical_path.py)",
        "",
        f"Median of {repeats} rounds, one process, the two tools interleaved; HTA = traceinsight "
        "(module `hta`), same window (an annotation instance's span) for both. `path`: graph and "
        "longest path for the window (tracewhy also replays its top 5 items for the gains); "
        "`all steps`: tracewhy over every step of the trace.",
        "",
        "| trace | window | slices | HTA read s | tracewhy read s | HTA path s | tracewhy path s | path ratio "
        "| tracewhy all steps s (steps) | window ms | tracewhy path ms | HTA path ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        hta_total = f"{r['hta_total_ms']:.3f}" if r["hta_total_ms"] is not None else "failed"
        window = r["window"].replace("|", "&#124;")  # a pipe in an annotation's name would split the cell
        lines.append(
            f"| {r['trace']} | {window} | {r['events']:,} | {r['hta_read']:.3f} | {r['tw_read']:.3f} "
            f"| {r['hta_path']:.3f} | {r['tw_path']:.3f} | {r['hta_path'] / r['tw_path']:.1f}x "
            f"| {r['tw_all_steps']:.3f} ({r['steps']}) | {r['window_ms']:.3f} | {r['tw_total_ms']:.3f} | {hta_total} |")
    lines += [
        "",
        "HTA's path is shorter than the window because it gives zero weight to the edges between "
        "top-level ops (host time between them, annotated or not) and to every sync; tracewhy's covers "
        "the window (tests/test_critical_path.py reconciles the two on the alexnet trace).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # HTA logs every unmatched kernel
    with tempfile.TemporaryDirectory(prefix="tracewhy-bench-cp-") as work:
        rows = [bench_case(t, a, i, args.repeats, Path(work)) for t, a, i in CASES]
    text = render(rows, args.repeats)
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
