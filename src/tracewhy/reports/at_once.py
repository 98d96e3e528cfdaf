"""Independent pieces of one command run at once on small traces: the rules of a diagnosis, the
two runs of a diff, the report's views beside its diagnosis.

Polars runs each query without the GIL. On a small trace an analysis is mostly many short
queries (a 1 MB trace's diagnosis is about 650 of them, ~0.1 ms each), so while one piece's
query runs another piece's Python proceeds: read + diagnose of a 1 MB trace takes about three
quarters of the time it takes one piece after the other. Large traces run their pieces in turn:
there polars already keeps every core busy, pieces at once would add their peaks in memory, and
an interrupt would wait for the pieces already running. A process that may use one CPU only (a
command on small inputs keeps to one) runs them in turn too (``several_cpus``).
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from tracewhy.model.trace import Trace

#: Up to this many slices in the traces together, their pieces run at once. A diagnosis of
#: 10 k slices (1 MB of JSON) takes about 0.1 s, of 500 k slices a few seconds.
MAX_SLICES: Final = 500_000
#: Two threads: the machines this is tuned on have two cores, and each piece's queries use the
#: polars pool of every core anyway.
THREADS: Final = 2


def small(*traces: Trace) -> bool:
    """Whether the pieces of work on ``traces`` should run at once: small, on a process that
    may use more than one CPU (``several_cpus``)."""
    return sum(t.slices.height for t in traces) <= MAX_SLICES and several_cpus()


def several_cpus() -> bool:
    """Whether this process may run on more than one CPU. A command on small inputs keeps to one
    (``command_process.keep_to_one_cpu``), and there its pieces in turn were as quick or
    quicker than at once: on this machine ``diagnose`` of the 1 MB BERT trace 0.36 against
    0.37 s, ``report`` 0.38-0.39 against 0.39-0.40, of the 2.3 MB nsys export ``report`` 0.57
    against 0.58 s (medians of six, 2026-12-01): the threads' turns on the one CPU cost more
    than they overlapped."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return len(cpus) > 1


def run(pieces: Sequence[Callable[[], Any]], *, together: bool, name: str) -> list[Any]:
    """Every piece's result, in the order given; at once on ``THREADS`` threads named ``name``
    when ``together``, else one after the other on this thread. Each piece runs in its own copy
    of this thread's context variables (output settings such as whole names reach it; a context
    can run on one thread at a time). The first exception a piece raised is raised here."""
    if not together or len(pieces) < 2:
        return [piece() for piece in pieces]
    copies = [contextvars.copy_context() for _ in pieces]
    with ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix=name) as pool:
        return list(pool.map(lambda copy, piece: copy.run(piece), copies, pieces))
