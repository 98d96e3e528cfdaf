"""Which tables of an Nsight Systems export a partial read reads: the groups of tables that hold
the slice kinds a caller asked for (``read_trace(path, kinds=...)``)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from tracewhy.model.schema import Kind

#: The slice kinds each group of export tables yields, in reading order. A group is read whole
#: (runtime and driver calls share one table).
_TABLE_KINDS: Final[dict[str, tuple[Kind, ...]]] = {
    "runtime": (Kind.RUNTIME, Kind.DRIVER),
    "kernel": (Kind.KERNEL,),
    "memcpy": (Kind.MEMCPY,),
    "memset": (Kind.MEMSET,),
    "sync": (Kind.GPU_SYNC,),
    "nvtx": (Kind.ANNOTATION,),
    "osrt": (Kind.OTHER,),
    "overhead": (Kind.OVERHEAD,),
}
#: Groups another group cannot be read without: sync records are named by the API call that
#: made them.
_GROUP_NEEDS: Final = {"sync": "runtime"}


@dataclass(frozen=True)
class Selection:
    """What a partial read reads: table groups, and the slice kinds the Trace will hold (every
    kind asked for, as nsys has no CPU ops, say, so a whole read would hold none either, plus
    every kind those tables yield)."""

    groups: frozenset[str]
    kinds_read: tuple[str, ...]


def select_tables(kinds: Collection[Kind] | None) -> Selection | None:
    """The tables a partial read of ``kinds`` reads; None (read all) for None."""
    if kinds is None:
        return None
    wanted = {Kind(k) for k in kinds}
    groups = {g for g, yields in _TABLE_KINDS.items() if wanted & set(yields)}
    groups |= {_GROUP_NEEDS[g] for g in groups if g in _GROUP_NEEDS}
    held = {k.value for k in wanted} | {k.value for g in groups for k in _TABLE_KINDS[g]}
    return Selection(frozenset(groups), tuple(sorted(held)))
