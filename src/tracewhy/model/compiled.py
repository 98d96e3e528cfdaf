"""Loops compiled where numba is installed (the ``fast`` extra), for large inputs: the critical
path's replay and walk, the nesting of host slices, and a few numpy chains of passes over whole
columns made one pass (the host tree's nearest and outermost marked slices, the graph's binding
edges, the replay window's edge order).

A replay recomputes every instant of a step's window from its in-edges in one pass over them
(``critical_path_replay._replay_times``). In Python that is about 0.3 us an edge; numba compiles
the same pass to machine code, about 0.01 us an edge. The walk back along the critical path
(``critical_path_walk.walk``) is the same kind of loop, one step an instant. On a 606 MB nsys
export (16 M instants, 17 M edges) the replays took 4.25 s and the walks 2.22 s of a diagnosis in
Python, 0.54 and 0.75 s compiled. The nesting (``linking.nest_host_slices``) finds each host
slice's parent, depth and enclosing op by pointer jumping in numpy, a number of passes over the
rows that grows with the log of the chains; compiled, it is one pass with a stack: on the 9.4 M
host slices of a 5 GB Kineto trace, 2.5 s against 0.25 s. Loading numba and the compiled code costs
a process about 0.6 s (the first run on a machine also compiles, and numba keeps the result in its
cache), so only loops of ``MIN_ITEMS`` edges, instants or rows or more take it. The one-pass
versions of numpy chains gain less each (on a 606 MB export: the ten nearest-slice lookups of a
step account 2.5 -> 1.4 s, the binding edges 1.2 -> 0.3 s). The graph's and the replay window's
run in commands that walk or replay that graph, and so load the loops anyway; the host tree's
take them only where something has loaded them (``load=False``: the reader's nesting of 4 M host
slices, a graph). Without numba, with ``TRACEWHY_JIT=0``, or where numba fails to load, the numpy
and Python loops run; both give the same result, integer for integer.
"""

from __future__ import annotations

import os
import threading
import warnings
from types import ModuleType
from typing import Final

#: Edges a replay passes (instants a walk may pass, host slices a nesting takes) for the compiled
#: loop to pay for loading numba, 0.6 s and 140 MB: the Python loops take about 0.3 s a million, the
#: numpy nesting about 0.25 s a million at this size. On the 97 MB nsys export (a replay of 1.5 M
#: edges, walks over 2.5 M instants) loading at a million gained 0.2 s of 11.4 and cost 120 MB of
#: peak memory; on the 606 MB one it gains 5% of the whole process for 120 MB.
MIN_ITEMS: Final = 4_000_000
#: ``TRACEWHY_JIT=0`` keeps every loop in Python.
ENV_JIT: Final = "TRACEWHY_JIT"

#: The compiled loops once loaded, None where they cannot be; unset until first asked for.
_loaded: list[ModuleType | None] = []
#: Held while they load: the reader's nesting asks on a thread of its own.
_loading = threading.Lock()


def loops(items: int, *, load: bool = True) -> ModuleType | None:
    """The compiled loops (``compiled_loops``) for a loop over ``items`` edges, instants or rows, or
    None: the loop is too short to pay for them, numba is not installed, or they are turned off.
    ``load=False``: only if something has loaded them already (a pass that saves less than the
    0.6 s loading costs)."""
    if items < MIN_ITEMS:
        return None
    if not load and not _loaded:
        return None
    with _loading:
        if not _loaded:
            _loaded.append(_load())
    return _loaded[0]


def _load() -> ModuleType | None:
    if os.environ.get(ENV_JIT, "1") == "0":
        return None
    try:
        with warnings.catch_warnings():  # (numba's own warnings are not the user's business)
            warnings.simplefilter("ignore")
            from tracewhy.model import compiled_loops

            compiled_loops.warm()
    # Not only ImportError: numba refuses to load against a numpy it was not built for
    # (SystemError, AttributeError), its cache can have no place to go (RuntimeError), and
    # compiling can fail. Any of them costs speed alone: the Python loops give the same result.
    except Exception:
        return None
    return compiled_loops
