from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int, shows_progress
from tracewhy.renderers.ranks import RanksPayload, ranks_payload, render_ranks
from tracewhy.reports.ranks import IN_PROCESS_MAX_BYTES, RanksReportOptions, ranks_report, trace_files
from tracewhy.units import printable


class RanksCommand(Command):
    """Many ranks: per-rank step time, compute, exposed comm, idle and input; the straggler.

    Give a directory or the trace files, one per rank (rank from distributedInfo, else from a
    'rankN' in the file name). Each rank is read in its own worker process (--workers) or on a
    Dask cluster (--executor dask://HOST:PORT); only a compact summary per rank comes back.
    Small rank files are read in this process instead, where a pool would cost more than it saves
    (see --workers).
    Collectives are matched across ranks by step, process group, op and order; ranks are
    compared by durations only, never by their (separate) clocks.
    """

    name = "ranks"
    json_payloads = (RanksPayload,)
    takes_trace = False

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("paths", nargs="+", metavar="DIR_OR_FILES", help="a directory of rank traces, or the files")
        add_output_options(parser)
        parser.add_argument("--workers", type=positive_int, default=None, metavar="N",
                            help="worker processes (default: one per file, at most the CPU count, and none "
                                 f"when the files hold under {IN_PROCESS_MAX_BYTES // 10**6} MB in all; 0: read here)")
        parser.add_argument("--executor", metavar="dask://HOST:PORT", default=None,
                            help="run the per-rank work on this Dask distributed scheduler instead")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        files = trace_files(args.paths)
        options = RanksReportOptions(step_marker=args.step, warmup=args.warmup)
        with rank_progress(files) as done:
            r = ranks_report(files, options, workers=args.workers, executor=args.executor, done=done, loader=loader())
        emit(args, self.name, ranks_payload(r.result, r.findings, r.executor),
             lambda: render_ranks(r.result, r.findings, args.top))
        return 0


@contextmanager
def rank_progress(files: list[str]) -> Iterator[Callable[[str], None] | None]:
    """A line per rank trace on stderr that ticks when its summary arrives (on a terminal, not
    with --json); None where nothing is drawn."""
    if not shows_progress() or len(files) < 2:
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(SpinnerColumn(finished_text="✓"), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    tasks = {f: progress.add_task(printable(Path(f).name), total=1) for f in files}
    with progress:
        yield lambda f: progress.update(tasks[f], completed=1)
