"""Several traces on one command line: whether they are the ranks of one job (read as ranks,
compared by ``ranks``) or separate captures, read one after another; and, for each capture after
the first, whether it is a run of the same program as the first (then compared with it, as
``diff`` compares two runs). Judged from each trace's identity (``analyses/run_identity.py``):
its own distributed metadata, its steps and the names it ran, never its file name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from tracewhy.analyses.run_identity import RunIdentity, name_share
from tracewhy.findings import thresholds as th

#: How several traces are read: as the ranks of one job, or one after another.
AS_RANKS: Final = "ranks"
AS_RUNS: Final = "runs"


@dataclass(frozen=True)
class RunRelation:
    """A trace after the first, against the first: the share of names they have in common,
    whether it is another rank of the first's job (``same_job``), a run of the same program
    (``same_program``: compared with the first), and why, in a phrase."""

    path: str
    name_share: float
    same_job: bool
    same_program: bool
    why: str


@dataclass(frozen=True)
class Grouping:
    """``read_as``: ``AS_RANKS`` or ``AS_RUNS``; ``reason``: why, in a sentence; ``relations``:
    each trace after the first against the first (empty when read as ranks)."""

    read_as: str
    reason: str
    relations: tuple[RunRelation, ...] = ()

    @property
    def compared(self) -> tuple[RunRelation, ...]:
        """The traces compared with the first: runs of its program that are not its job's ranks."""
        return tuple(r for r in self.relations if r.same_program and not r.same_job)


def group(identities: Sequence[RunIdentity]) -> Grouping:
    """How to read the traces (at least two), in the order given: the first is the baseline."""
    why_not = not_one_job(identities)
    if why_not is None:
        return Grouping(AS_RANKS, _one_job(identities))
    first = identities[0]
    relations = tuple(relation(first, other) for other in identities[1:])
    has_ranks = any(i.rank is not None for i in identities)
    reason = (f"not the ranks of one job ({why_not}): read one after another" if has_ranks
              else "no rank metadata (distributedInfo): read one after another")
    return Grouping(AS_RUNS, reason, relations)


def not_one_job(identities: Sequence[RunIdentity]) -> str | None:
    """Why the traces are not the ranks of one job, or None when they are: every trace names
    its rank, the same world size (over one) and backend, no rank twice, and the steps line up
    (a step number they all hold; without numbers, as many steps each)."""
    missing = [i.path for i in identities if i.rank is None or i.world_size is None]
    if missing:
        return f"{missing[0]} records no rank and world size"
    sizes = sorted({i.world_size for i in identities if i.world_size is not None})
    if len(sizes) > 1:
        return f"world sizes differ ({', '.join(map(str, sizes))})"
    if sizes[0] < 2:
        return "a world size of 1"
    backends = sorted({i.backend or "none" for i in identities})
    if len(backends) > 1:
        return f"backends differ ({', '.join(backends)})"
    seen: dict[int, str] = {}
    for i in identities:
        assert i.rank is not None
        if i.rank in seen:
            return f"rank {i.rank} twice ({seen[i.rank]}, {i.path})"
        seen[i.rank] = i.path
    if all(i.step_numbers for i in identities):
        if not frozenset.intersection(*(i.step_numbers for i in identities)):
            return "no step number in common"
    elif len({i.steps for i in identities}) > 1:
        return "their steps do not line up"
    return None


def _one_job(identities: Sequence[RunIdentity]) -> str:
    first = identities[0]
    ranks = ", ".join(str(i.rank) for i in sorted(identities, key=lambda i: i.rank or 0))
    common = frozenset.intersection(*(i.step_numbers for i in identities))
    steps = (f"steps {min(common)}-{max(common)} in common" if len(common) > 1
             else f"step {min(common)} in common" if common else f"{first.steps} steps each")
    return (f"ranks {ranks} of one job (world size {first.world_size}, backend {first.backend or 'none'}, "
            f"{steps})")


def relation(first: RunIdentity, other: RunIdentity) -> RunRelation:
    """``other`` against ``first``: another rank of its job, a run of its program, or neither."""
    share = name_share(first, other)
    if not_one_job((first, other)) is None:
        return RunRelation(other.path, share, True, False,
                           f"rank {other.rank} of the same job as rank {first.rank}: compare ranks with tracewhy ranks")
    if first.step_marker != other.step_marker:
        return RunRelation(other.path, share, False, False,
                           f"a different step marker ({other.step_marker} vs {first.step_marker})")
    names = f"{share:.0%} of op, kernel and annotation names shared"
    if share < th.SAME_PROGRAM_MIN_NAME_SHARE:
        return RunRelation(other.path, share, False, False,
                           f"a different program: {names} (under {th.SAME_PROGRAM_MIN_NAME_SHARE:.0%})")
    return RunRelation(other.path, share, False, True, f"the same program: step marker {other.step_marker}, {names}")
