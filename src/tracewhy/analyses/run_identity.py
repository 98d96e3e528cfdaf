"""What a trace is a capture of, for telling several traces apart: which rank of which job its
own metadata says it is (``distributedInfo``: rank, world size, backend), the steps it holds
(by number), and the set of operator, kernel and annotation names it ran, and how much of that
set two traces share. Measurements only; ``findings/inputs_grouping.py`` judges from them
whether traces are ranks of one job or runs of one program.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import polars as pl

from tracewhy.analyses.steps import StepCol, StepsResult
from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import Trace

#: The names that say what a program ran: its operators, its kernels and its own annotations.
#: Runtime calls, copies and Python frames say how it was launched or written, not what it did.
NAMED_KINDS: Final = (Kind.CPU_OP, Kind.KERNEL, Kind.ANNOTATION)
#: A run of digits in a name: the step number of "ProfilerStep#12", a layer index, a bucket id.
#: Two runs of one program number these differently, so names are compared with digits folded.
_DIGITS: Final = re.compile(r"\d+")


@dataclass(frozen=True)
class RunIdentity:
    """One trace's identity. ``rank``, ``world_size`` and ``backend`` are the trace's own
    distributed metadata (None where it records none); ``step_numbers``: the N of every step
    "MARKER#N" found (empty without steps or numbers); ``names``: the distinct names of
    ``NAMED_KINDS`` slices, every run of digits written as "N"."""

    path: str
    format: str
    rank: int | None
    world_size: int | None
    backend: str | None
    step_marker: str
    steps: int
    step_numbers: frozenset[int]
    names: frozenset[str]


def run_identity(trace: Trace, steps_result: StepsResult) -> RunIdentity:
    """The identity of ``trace``, whose steps (found with the marker the command uses) are ``steps_result``."""
    meta = trace.meta
    backend = meta.distributed.get("backend")
    numbers = steps_result.table.get_column(StepCol.NUMBER).drop_nulls().to_list()
    names = (trace.kind_columns(NAMED_KINDS, Col.NAME).get_column(Col.NAME).unique().cast(pl.String)
             .drop_nulls().to_list())
    return RunIdentity(
        path=meta.path, format=meta.format, rank=meta.rank, world_size=meta.world_size,
        backend=backend if isinstance(backend, str) else None, step_marker=steps_result.marker,
        steps=steps_result.table.height, step_numbers=frozenset(int(n) for n in numbers),
        names=frozenset(_DIGITS.sub("N", n) for n in names),
    )


def name_share(a: RunIdentity, b: RunIdentity) -> float:
    """The share of names the two traces have in common (Jaccard: names in both over names in
    either); 1.0 for two traces with no names at all (nothing tells them apart)."""
    either = a.names | b.names
    return len(a.names & b.names) / len(either) if either else 1.0
