"""Whether the step account fits in the memory that is left.

A diagnosis asks once the trace is read, before any analysis. The account holds the dependency
graph, its tables per slice and the replay window of the predictions: at their peak about
BYTES_PER_SLICE for each host or GPU slice of the graph. The other analyses hold about
REST_BYTES_PER_SLICE for each slice of the trace at theirs, and both peaks are reached while
the other's results are still held. Where the two together would not fit in the memory
available (the machine's, or the process's cgroup limit if that is lower), a diagnosis leaves
out the account, the critical path and the predictions, and a trust finding says so
(``findings/trust``). Without them, a diagnosis of a 606 MB Nsight Systems export (8 M events)
peaks at 2.9 GB instead of 4.9 GB. With them, where memory is short, the kernel would kill the
process with no output at all.

Measured for the constants (whole processes: RSS after the read, and the peak with and without
the account):
- The 97 MB export x40 (1.29 M slices, 1.28 M of them in the graph): the read 423 MB, then +253
  MB without the account (196 B a slice) and +328 MB more with it (257 B a graph slice).
- The 606 MB export x250 (8.06 M, 7.97 M): the read 1.42 GB, then +1.54 GB (191 B) and +2.0 GB
  more (252 B).
- The 271 MB Kineto trace (a V100 DDP trace inflated, 617 k slices, all in the graph): the read
  306 MB, then +172 MB (279 B) and +147 MB more (238 B).
- The 56 MB Kineto trace of OWLv2 (104 k, 39 k): +20 MB with the account, most of it the
  account's modules.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tracewhy.model.schema import GPU_ACTIVITY_KINDS
from tracewhy.model.trace import Trace

#: The account's peak per host or GPU slice of the graph (238-257 B measured, above).
BYTES_PER_SLICE: Final = 260
#: What the account holds whatever the trace's size: its modules and their tables.
FIXED_BYTES: Final = 32 << 20
#: The other analyses' peak per slice of the trace, over what the read left (191-279 B, above).
REST_BYTES_PER_SLICE: Final = 280
#: The share of the available memory the estimate may fill: its figures are measured on a few
#: traces, and the allocators keep some of what is freed.
HEADROOM: Final = 0.9

_PROC_MEMINFO: Final = Path("/proc/meminfo")
_CGROUP: Final = Path("/sys/fs/cgroup")
_PROC_CGROUP: Final = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class AccountMemory:
    """The account that was left out: the graph's slices, the memory the account would need, what
    the diagnosis would need with it (bytes, both beyond what the read left), and the memory that
    was available."""

    slices: int
    need_bytes: int
    with_account_bytes: int
    available_bytes: int

    @property
    def short_bytes(self) -> int:
        """How much more free memory the diagnosis with the account would have needed."""
        return max(round(self.with_account_bytes / HEADROOM) - self.available_bytes, 0)


def short_of_memory(trace: Trace) -> AccountMemory | None:
    """The account's need, the diagnosis's with it, and the memory available, when the diagnosis
    with the account would take more than HEADROOM of it. None when it fits, or when the
    available memory cannot be read (no /proc: not Linux)."""
    from tracewhy.analyses.critical_path_graph import GRAPH_HOST_KINDS

    available = available_bytes()
    if available is None:
        return None
    slices = trace.count(*GRAPH_HOST_KINDS, *GPU_ACTIVITY_KINDS)
    need = FIXED_BYTES + BYTES_PER_SLICE * slices
    whole = need + REST_BYTES_PER_SLICE * trace.slices.height
    return AccountMemory(slices, need, whole, available) if whole > HEADROOM * available else None


def available_bytes(meminfo: Path = _PROC_MEMINFO, cgroup: Path = _CGROUP, own: Path = _PROC_CGROUP) -> int | None:
    """The memory this process may still take: the kernel's MemAvailable, or less if this process's
    cgroup (v2, else v1; ``own`` names it) has a limit. None when neither can be read."""
    found = [n for n in (_meminfo_available(meminfo), _cgroup_left(cgroup, own)) if n is not None]
    return min(found) if found else None


def _meminfo_available(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                value, unit = line.split()[1:3]
                return int(value) * (1024 if unit == "kB" else 1)
    return None


def _cgroup_left(root: Path, own: Path) -> int | None:
    """The limit of this process's cgroup less its usage: v2 (``memory.max``, ``memory.current``
    in the group ``0::PATH`` names), else v1 (``memory.limit_in_bytes`` and
    ``memory.usage_in_bytes`` in the memory controller's group). None without a limit."""
    groups: list[tuple[Path, str, str]] = []
    with contextlib.suppress(OSError):
        for line in own.read_text().splitlines():
            number, controllers, path = [*line.split(":", 2), "", ""][:3]
            if number == "0" and not controllers:
                groups.append((root / path.lstrip("/"), "memory.max", "memory.current"))
            elif "memory" in controllers.split(","):
                groups.append((root / "memory" / path.lstrip("/"), "memory.limit_in_bytes", "memory.usage_in_bytes"))
    for group, limit, usage in groups:
        with contextlib.suppress(OSError, ValueError):
            text = (group / limit).read_text().strip()
            if text == "max":
                return None
            cap = int(text)
            if cap >= 1 << 60:  # v1 writes "no limit" as 2**63 - 1 rounded down to a page
                return None
            return max(cap - int((group / usage).read_text().strip()), 0)
    return None
