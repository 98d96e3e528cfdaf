"""The settings of a process that runs one command, and how it ends (``cli.as_command`` and
``cli.end_command`` apply them to the ``tracewhy`` command; the helper that diagnoses a small
diff's run B applies them to itself, ``diff_helper.serve``, without importing the command line).

Standard library only: set before polars is imported, which reads some of them once.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
from collections.abc import Sequence
from typing import Final, NoReturn

from tracewhy import code_cache
from tracewhy.input_size import small_inputs

#: Allocations between two collections of the garbage collector's youngest generation while the
#: command runs (Python's default is 700; see ``settle``).
_GC_YOUNGEST_THRESHOLD: Final = 50_000
#: polars' pool size (read once, when polars starts its pool; see ``settle``).
_POLARS_THREADS: Final = "POLARS_MAX_THREADS"
#: The settings of polars' jemalloc (its allocator's ``MALLOC_CONF``, read once, when polars is loaded).
_POLARS_ALLOCATOR: Final = "_RJEM_MALLOC_CONF"
#: How long polars' allocator keeps pages it has freed before it returns them (jemalloc: 10 s).
_FREED_PAGES_KEPT_MS: Final = 100
#: The size of the thread pool of numpy's BLAS library (OpenBLAS in numpy's wheels; read once, when
#: numpy is imported).
_BLAS_THREADS: Final = "OPENBLAS_NUM_THREADS"
#: glibc's ``mallopt`` parameter for the number of arenas (malloc.h: M_ARENA_MAX).
_M_ARENA_MAX: Final = -8
#: Commands that keep polars' default pool whatever their arguments: ``capture`` starts the
#: user's job, ``mcp`` serves traces of any size for as long as it runs.
_OTHER_PROGRAMS_OR_MANY_TRACES: Final = frozenset({"capture", "mcp"})


def settle(command: str | None, rest: Sequence[str], *, code_table: bool) -> None:
    """Settings of a process that runs ``command`` on ``rest`` (the command line's words after
    it); ``code_table``: compile its dataclass methods through the command's table.

    The cyclic garbage collector starts its youngest generation every 50,000 container
    allocations instead of every 700: a command on a
    1 MB trace made ~110 collections (37-46 ms of 0.45 s) walking the objects its imports made,
    where the memory a command holds is columns, which the collector does not look into, and
    cycles among the rest are few. On small inputs (``input_size.small_inputs``) polars runs its
    queries on one thread, unless the user chose a pool size: set before polars is imported,
    which sizes its pool once. The methods of the dataclasses its imports make are compiled
    through the command's table (``code_cache``: kept compiled from earlier runs). Not for the
    commands that start other programs (``capture`` runs the user's job, which would inherit the
    setting) or serve many traces (``mcp``). Only the command sets these: a program that imports
    tracewhy keeps its own settings.

    Polars' allocator (jemalloc) is told to give the pages it frees back to the system after
    ``_FREED_PAGES_KEPT_MS`` instead of its default 10 s, unless the user configured it: a
    command's columns and their temporaries are freed and made anew in bursts, and pages kept
    from one burst to the next were a quarter of the peak (the 271 MB Kineto trace's
    ``kernels``: 356 against 389 MiB, 85 MiB less again when freed at once, which cost 6% more
    time).

    numpy's BLAS library gets no threads of its own, unless the user sized its pool: when numpy
    is imported OpenBLAS starts a thread per core beyond the first, which waits for work by
    spinning before it sleeps, and a command has no matrix products to give it (one
    ``np.polyfit`` of a few hundred points in the memory analysis). On the 2.3 MB nsys export,
    ``diagnose`` took 0.51 s of user CPU instead of 0.61 (wall 0.60 against 0.62 s, two
    cores): the spinning took a core from polars' thread and the command's own."""
    gc.set_threshold(_GC_YOUNGEST_THRESHOLD, *gc.get_threshold()[1:])
    if command is None or command in _OTHER_PROGRAMS_OR_MANY_TRACES or "polars" in sys.modules:
        return
    if code_table:
        code_cache.start(command)
    os.environ.setdefault(_POLARS_ALLOCATOR, f"dirty_decay_ms:{_FREED_PAGES_KEPT_MS},muzzy_decay_ms:0")
    os.environ.setdefault(_BLAS_THREADS, "1")
    if small_inputs(rest):
        os.environ.setdefault(_POLARS_THREADS, "1")
    elif "MALLOC_ARENA_MAX" not in os.environ:
        _one_malloc_arena()


def _one_malloc_arena() -> None:
    """On glibc, every thread that allocates gets its own arena (up to eight per core), and
    memory freed in one arena serves only that arena again. A large read nests its host slices on
    a second thread (``readers/kineto/tables.join_batches``), whose arena then kept what the
    nesting freed: the 271 MB Kineto trace's ``kernels`` peaked at 380 MiB, and at 365 with one
    arena for all threads (``MALLOC_ARENA_MAX=1``, which a user's own setting overrides), at the
    same speed. Elsewhere (no glibc) nothing is changed."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes  # (polars and numpy import it anyway)

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 1)


def end(code: int) -> NoReturn:
    """End a process that ran one command. Its output is flushed and the exit handlers run
    (temporary directories, worker processes); then the process ends without the interpreter's
    teardown: unloading the ~600 modules a diagnosis imports, and collecting what they hold,
    took 35-45 ms of a 0.5 s command on a 1 MB trace, only to free memory that the operating
    system frees at once. Under a tracer or a profiler (coverage, cProfile) it exits the
    ordinary way, so that they write their results."""
    code_cache.finish()
    if sys.gettrace() is not None or sys.getprofile() is not None:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can be shown
            stream.flush()
    atexit._run_exitfuncs()
    os._exit(code)
