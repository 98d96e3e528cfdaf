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
from collections.abc import Collection, Sequence
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
#: The CPU this process keeps to, once ``keep_to_one_cpu`` chose it.
_kept: list[int] = []
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
    which sizes its pool once; and the process keeps to the CPU it runs on
    (``keep_to_one_cpu``). The methods of the dataclasses its imports make are compiled
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
        keep_to_one_cpu()
    elif "MALLOC_ARENA_MAX" not in os.environ:
        _one_malloc_arena()


def keep_to_one_cpu() -> frozenset[int]:
    """Keep this process, and the threads it starts, to the CPU it runs on. Returns the CPUs it
    could use before; nothing is changed (and an empty set returned) where the process already
    keeps to one CPU or chose one before, or where the system cannot set an affinity (not
    Linux).

    For a command on small inputs (``settle``). Each of its ~1,000 polars queries hands its work
    to polars' pool thread and waits for it; on two CPUs that thread wakes on the other CPU and
    then wakes the command's thread back, and on this machine (a virtual one, where waking
    another CPU goes through the hypervisor) those wake-ups were a fifth of the command's CPU
    time. On one CPU the two threads take turns there: ``diagnose`` of the 2.3 MB nsys export
    0.55-0.56 s instead of 0.59-0.61, of the 1 MB BERT trace 0.36-0.37 instead of 0.39-0.40,
    ``report`` and ``export`` 0.03-0.05 s less. The CPU kept to is the one the process runs
    on, where the scheduler placed it when it started."""
    if _kept or not hasattr(os, "sched_setaffinity"):
        return frozenset()
    try:
        allowed = frozenset(os.sched_getaffinity(0))
    except OSError:
        return frozenset()
    if len(allowed) < 2:
        return frozenset()
    now = _current_cpu()
    cpu = now if now is not None and now in allowed else min(allowed)
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:  # not a CPU this process may use (a container's cpuset): left as it was
        return frozenset()
    _kept.append(cpu)
    return allowed


def keep_apart(pid: int, before: Collection[int]) -> None:
    """Keep process ``pid`` (a helper this process started, not yet running threads of its own)
    to the CPUs of ``before`` (``keep_to_one_cpu``'s answer) less the one this process keeps to,
    where there are any: the two then never share a CPU while another is free. The helper,
    started from a process that keeps to one CPU, would otherwise start on that CPU and stay on
    it until its own ``settle``."""
    others = set(before) - set(_kept)
    if others:
        with contextlib.suppress(OSError):  # it has ended already
            os.sched_setaffinity(pid, others)


def _current_cpu() -> int | None:
    """The CPU this process last ran on (``/proc/self/stat``'s 39th field), or None."""
    try:
        with open("/proc/self/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None


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
