"""``ranks``: every rank's trace read and summarized where it is read (in this process, on two
threads, or in worker processes or on a Dask cluster, as the files' size and the options say),
the ranks compared, and the findings on them.

``summarize_file`` is what an executor runs, so that only summaries, never whole traces, travel
back; ``load_rank_summaries`` runs it over many files on any ``concurrent.futures.Executor`` (a
process pool, or ``dask.distributed.Client.get_executor()``).
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tracewhy.analyses.rank_compare import RanksResult, compare_ranks
from tracewhy.analyses.ranks import RanksOptions, RankSummary, summarize_trace
from tracewhy.errors import TraceError, UsageError, install_hint
from tracewhy.findings.model import Finding
from tracewhy.findings.ranks import rank_findings
from tracewhy.readers import read_trace
from tracewhy.readers.registry import InputKind, suffixes
from tracewhy.readers.source import content_size
from tracewhy.reports import at_once
from tracewhy.reports.inputs import PLAIN, Loader
from tracewhy.rows import Rows

if TYPE_CHECKING:
    from concurrent.futures import Executor

DASK_SCHEME: Final = "dask://"
POLARS_THREADS: Final = "POLARS_MAX_THREADS"
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


@dataclass(frozen=True)
class RanksReportOptions:
    step_marker: str | None = None
    warmup: int | None = None


@dataclass(frozen=True)
class RanksReport(Rows, rows="result.ranks"):
    """What ``ranks`` computes: each rank's summary (its reader's warnings among them), the ranks
    compared, the findings on them, and where the per-rank work ran (``executor``)."""

    summaries: tuple[RankSummary, ...]
    result: RanksResult
    findings: list[Finding]
    executor: str


def ranks_report(files: list[str], options: RanksReportOptions | None = None, *, workers: int | None = None,
                 executor: str | None = None, done: Callable[[str], None] | None = None,
                 loader: Loader = PLAIN) -> RanksReport:
    """Read and compare the rank traces ``files`` (``trace_files`` lists a directory's).
    ``workers``, ``executor``: as ``executor_for`` takes them; ``done`` is told each file as its
    summary arrives. Each rank's reader warnings go to ``loader.warn`` once all are read (the
    traces are read where the work runs, so ``loader.read`` is not used)."""
    options = options or RanksReportOptions()
    per_rank = RanksOptions(step_marker=options.step_marker, warmup=options.warmup)
    with executor_for(executor, workers, files) as (pool, label):
        summaries = load_rank_summaries(files, pool, per_rank, done)
    result = compare_ranks(summaries)
    report = RanksReport(tuple(summaries), result, rank_findings(result), label)
    for s in summaries:
        loader.warn(s.source, s.warnings)
    return report


@dataclass(frozen=True)
class FileFailure:
    """A file a worker could not read; the caller raises it as a TraceError (exceptions with
    custom constructors do not survive pickling between processes)."""

    path: str
    problem: str


def summarize_file(path: str, options: RanksOptions | None = None) -> list[RankSummary] | FileFailure:
    """Read one trace and summarize each rank in it (an nsys file may hold several processes)."""
    try:
        trace = read_trace(path)
        return summarize_trace(trace, path, options or RanksOptions())
    except TraceError as e:
        return FileFailure(path, e.problem)


def load_rank_summaries(
    paths: Sequence[str], executor: Executor | None = None, options: RanksOptions | None = None,
    done: Callable[[str], None] | None = None,
) -> list[RankSummary]:
    """Summaries of every rank in the files, by rank. ``executor`` None runs in this process.
    ``done`` is told each file as its summary arrives (the CLI's per-rank progress)."""
    results: list[list[RankSummary] | FileFailure] = []
    if executor is None:
        pending: Iterable[Callable[[], list[RankSummary] | FileFailure]] = (
            functools.partial(summarize_file, p, options) for p in paths)
    else:
        pending = [executor.submit(summarize_file, p, options).result for p in paths]
    for path, result in zip(paths, pending, strict=True):
        results.append(result())
        if done is not None:
            done(path)
    out: list[RankSummary] = []
    for r in results:
        if isinstance(r, FileFailure):
            raise TraceError(r.path, r.problem)
        out.extend(r)
    seen: dict[int, str] = {}
    for s in out:
        if s.rank in seen:
            raise TraceError(s.source, f"rank {s.rank} again (also in {seen[s.rank]}): give one trace per rank")
        seen[s.rank] = s.source
    return sorted(out, key=lambda s: s.rank)


def trace_files(paths: list[str]) -> list[str]:
    """The trace files named, with directories expanded to the traces directly inside them (by
    the file-name endings the timeline formats register: a directory holds other files too)."""
    endings = suffixes(InputKind.TIMELINE)
    out: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(str(f) for f in path.iterdir() if f.is_file() and f.name.endswith(endings))
            if not found:
                raise TraceError(path, f"no trace files ({', '.join(endings)}) in this directory")
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
    """The executor the per-rank work runs on (None: this process), and a label for the output:
    ``spec`` a Dask scheduler (``dask://HOST:PORT``), else a pool of ``pool_size`` processes, or
    two threads here for small files."""
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
        # so one file's Python work proceeds while another's queries run (reports/at_once.py).
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
