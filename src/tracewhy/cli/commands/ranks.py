from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tracewhy.analyses.rank_compare import compare_ranks
from tracewhy.analyses.ranks import RanksOptions, load_rank_summaries
from tracewhy.cli.base import Command, add_output_options, emit, positive_int, shows_progress, warn
from tracewhy.errors import TraceError, UsageError, install_hint
from tracewhy.findings import at_once
from tracewhy.findings.ranks import rank_findings
from tracewhy.readers.source import content_size
from tracewhy.renderers.overlap import ranks_payload, render_ranks
from tracewhy.units import printable

if TYPE_CHECKING:
    from concurrent.futures import Executor

#: File names a directory argument contributes (profiler JSON, nsys exports).
TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".sqlite.gz", ".nsys-rep")
DASK_SCHEME = "dask://"
POLARS_THREADS = "POLARS_MAX_THREADS"
#: Rank files smaller than this in all (gzip counted inflated) are read in this process, on two
#: threads, unless --workers is given: a spawned worker imports polars and tracewhy before
#: it reads a byte, which only pays off once there is enough parsing to spread over the cores.
#: bench/bench_ranks_crossover.py (results_ranks_crossover.md), pool of two / here, wall, on 2
#: cores: on a quiet machine (load 0.4-2) 1.66x at 2 MB, 1.28x at 4, 1.03x at 8, 1.12x at 10,
#: 0.94-0.98x at 20, 0.71-0.73x at 41, 0.69x at 51 and 0.56-0.60x at 102 MB; with the cores
#: shared (load 2.4-5.6) the pool lost up to ~100 MB. The quiet machine decides: a user's
#: machine has its cores, and more of them than two. Those runs read in this process one file
#: after another; on two threads it is quicker still, so the crossover lies at 16 MB or above.
IN_PROCESS_MAX_BYTES: Final = 16 * 10**6


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
        options = RanksOptions(step_marker=args.step, warmup=args.warmup)
        with executor_for(args.executor, args.workers, files) as (executor, label), \
                rank_progress(files) as done:
            summaries = load_rank_summaries(files, executor, options, done)
        for s in summaries:
            warn(s.source, s.warnings)
        result = compare_ranks(summaries)
        found = rank_findings(result)
        emit(args, self.name, ranks_payload(result, found, label), lambda: render_ranks(result, found, args.top))
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


def trace_files(paths: list[str]) -> list[str]:
    """The trace files named, with directories expanded to the traces directly inside them."""
    out: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(str(f) for f in path.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise TraceError(path, f"no trace files ({', '.join(TRACE_SUFFIXES)}) in this directory")
            out.extend(found)
        elif path.is_file():
            out.append(str(path))
        else:
            raise TraceError(path, "no such file or directory")
    return out


def pool_size(workers: int | None, files: list[str]) -> int:
    """Worker processes for ``files`` (0: read them in this process): ``--workers`` when given,
    else none for files under ``IN_PROCESS_MAX_BYTES`` in all (gzip counted inflated, as it is
    parsed), else one per file up to the CPU count."""
    if workers is not None:
        return min(workers, len(files))
    if sum(content_size(Path(f)) for f in files) < IN_PROCESS_MAX_BYTES:
        return 0
    return min(len(files), os.cpu_count() or 1)


@contextmanager
def executor_for(spec: str | None, workers: int | None, files: list[str]) -> Iterator[tuple[Executor | None, str]]:
    """The executor the per-rank work runs on (None: this process), and a label for the output."""
    if spec is not None:
        if not spec.startswith(DASK_SCHEME):
            raise UsageError(f"--executor must look like dask://HOST:PORT, got {spec!r}")
        try:
            # Imported by name: Dask is an optional extra without type information.
            distributed = importlib.import_module("distributed")
        except ImportError:
            raise UsageError(f"--executor dask://... needs Dask: {install_hint('dask')}") from None
        address = "tcp://" + spec[len(DASK_SCHEME):]
        try:
            client = distributed.Client(address, timeout=30)
        except OSError as e:
            raise UsageError(f"cannot reach the Dask scheduler at {address}: {e}") from None
        with client:
            yield client.get_executor(), f"dask {address}"
        return
    n = pool_size(workers, files)
    if len(files) <= 1 or (n == 0 and workers is not None):
        yield None, "in-process"
        return
    if n == 0:
        # Small files: two threads here, no processes. Polars runs its queries without the GIL,
        # so one file's Python work proceeds while another's queries run (findings/at_once.py).
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=at_once.THREADS, thread_name_prefix="tracewhy-rank") as threads:
            yield threads, "in-process"
        return
    import multiprocessing  # (a run read in-process imports neither)
    from concurrent.futures import ProcessPoolExecutor

    # Each worker's polars thread pool gets its share of the cores (N pools of all cores
    # oversubscribe them), unless the user chose a size. Workers inherit it when they start.
    chosen = os.environ.get(POLARS_THREADS)
    if chosen is None:
        os.environ[POLARS_THREADS] = str(max(1, (os.cpu_count() or 1) // n))
    try:
        # spawn, not fork: polars' thread pool does not survive a fork.
        with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as pool:
            yield pool, f"{n} worker processes"
    finally:
        if chosen is None:
            del os.environ[POLARS_THREADS]
