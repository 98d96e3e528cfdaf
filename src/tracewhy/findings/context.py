"""The shared state of one diagnosis: the trace, the options, and analyses computed once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tracewhy.analyses.gaps import GapsOptions, GapsResult, gaps
from tracewhy.analyses.host_activity import HostIndex, build_host_index
from tracewhy.analyses.steps import StepsOptions, StepsResult, steps
from tracewhy.analyses.syncs import SyncsResult, syncs
from tracewhy.analyses.throughput import ThroughputOptions
from tracewhy.analyses.utilization import DeviceBusy
from tracewhy.model.trace import Trace

if TYPE_CHECKING:  # (the TORCH_LOGS parser is imported only where --logs is given)
    from tracewhy.model.torch_logs import TorchLogs

T = TypeVar("T")


@dataclass(frozen=True)
class DiagnoseOptions:
    step_marker: str | None = None
    warmup: int | None = None
    min_gap_ns: int = GapsOptions().min_gap_ns
    #: Items per step and their unit, for the throughput check (``--items-per-step``).
    throughput: ThroughputOptions | None = None
    #: A parsed TORCH_LOGS="graph_breaks,recompiles" capture (``--logs``): names the compile
    #: findings' break reasons and failed guards.
    torch_logs: TorchLogs | None = None


@dataclass
class Context:
    """Rules ask the context for analyses; each analysis runs at most once per diagnosis, also
    when rules run on several threads at once (``diagnose`` does so on small traces): a thread
    that asks for an analysis another thread is computing waits for it. Analyses ask for others
    only down a chain that never comes back (steps before gaps before basis), so no two threads
    wait for each other."""

    trace: Trace
    options: DiagnoseOptions = field(default_factory=DiagnoseOptions)
    _cache: dict[str, Any] = field(default_factory=dict)
    _computing: dict[str, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def cached(self, key: str, compute: Callable[[], T]) -> T:
        if key not in self._cache:
            with self._guard:
                lock = self._computing.setdefault(key, threading.Lock())
            with lock:
                if key not in self._cache:
                    self._cache[key] = compute()
        value: T = self._cache[key]
        return value

    def steps(self) -> StepsResult:
        options = StepsOptions(marker=self.options.step_marker, warmup=self.options.warmup)
        return self.cached("steps", lambda: steps(self.trace, options))

    def host(self) -> HostIndex:
        return self.cached("host", lambda: build_host_index(self.trace))

    def syncs(self) -> SyncsResult:
        return self.cached("syncs", lambda: syncs(self.trace, self.steps(), self.host()))

    def busy(self) -> dict[int, DeviceBusy]:
        return self.gaps().busy

    def gaps(self) -> GapsResult:
        return self.cached(
            "gaps", lambda: gaps(self.trace, self.steps(), GapsOptions(self.options.min_gap_ns), host=self.host())
        )
