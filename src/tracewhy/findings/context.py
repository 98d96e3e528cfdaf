"""The shared state of one diagnosis: the trace, the options, and analyses computed once."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl

from tracewhy.analyses.gaps import GapsOptions, GapsResult, gaps
from tracewhy.analyses.host_activity import HostIndex, build_host_index
from tracewhy.analyses.host_tree import HostTree
from tracewhy.analyses.steps import StepCol, StepsOptions, StepsResult, steps
from tracewhy.analyses.throughput import ThroughputOptions
from tracewhy.analyses.utilization import DeviceBusy
from tracewhy.model.trace import Trace

if TYPE_CHECKING:
    # The step account, its graph and the what-if replays, the kernel table, the syncs and the
    # compile markers are imported by the methods that compute them: a command that asks the
    # context for steps, gaps or blocks alone (check --max-gpu-idle, blocks, memory) imports none
    # of their ~40 modules. The TORCH_LOGS parser is imported only where --logs is given.
    from tracewhy.analyses.account import AccountResult, StepModel
    from tracewhy.analyses.account_memory import AccountMemory
    from tracewhy.analyses.critical_path_graph import Graph
    from tracewhy.analyses.kernels import KernelsResult
    from tracewhy.analyses.syncs import SyncsResult
    from tracewhy.analyses.what_if import Prediction
    from tracewhy.analyses.what_if_edits import Fix
    from tracewhy.analyses.what_if_window import WindowEdges
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
    #: Whether the top fixes are also replayed together (``Report.together``): only ``diagnose``
    #: shows them; diff, report, export, sql and check leave this off and skip that replay.
    fixes_together: bool = True


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
    #: What ``graph`` does before it waits for ``start_graph``'s thread (``start_graph``).
    _meanwhile: list[Callable[[], object]] = field(default_factory=list)

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
        return self.cached("steps", lambda: steps(self.trace, options, host=self.host))

    def steady_windows(self) -> list[tuple[int, int]]:
        """The steady steps' windows, [start, end) in ns: where the per-step rules look."""
        def compute() -> list[tuple[int, int]]:
            steady = self.steps().table.filter(pl.col(StepCol.STEADY))
            return list(zip(steady.get_column(StepCol.TS).to_list(), steady.get_column(StepCol.WINDOW_END).to_list(),
                            strict=True))
        return self.cached("steady_windows", compute)

    def kernels(self) -> KernelsResult:
        """Kernel time per name and family: a rule and the report's kernel table share it."""
        from tracewhy.analyses.kernels import kernels

        return self.cached("kernels", lambda: kernels(self.trace))

    def host(self) -> HostIndex:
        return self.cached("host", lambda: build_host_index(self.trace))

    def host_tree(self) -> HostTree:
        """The host nesting by slice id: the step account, memory, the source-line findings and the
        anti-pattern and extra-copy analyses share it."""
        return self.cached("host_tree", lambda: HostTree.of(self.trace))

    def compile_marked(self) -> pl.DataFrame:
        """The host slices with a compile role (``marked_slices``): the step account's and memory's
        host contexts and the compile analysis share them."""
        from tracewhy.analyses.compile_slices import marked_slices

        return self.cached("compile_marked", lambda: marked_slices(self.trace))

    def syncs(self) -> SyncsResult:
        from tracewhy.analyses.syncs import syncs

        return self.cached("syncs", lambda: syncs(self.trace, self.steps(), self.host()))

    def busy(self) -> dict[int, DeviceBusy]:
        return self.gaps().busy

    def gaps(self) -> GapsResult:
        return self.cached(
            "gaps", lambda: gaps(self.trace, self.steps(), GapsOptions(self.options.min_gap_ns), host=self.host())
        )

    def graph(self) -> Graph:
        """The step's dependency graph, built once: the step account and the critical path share it."""
        from tracewhy.analyses.critical_path_graph import build_graph

        if self._meanwhile and "graph" not in self._cache:
            work = list(self._meanwhile)
            self._meanwhile.clear()
            for compute in work:
                compute()
        return self.cached("graph", lambda: build_graph(self.trace))

    def start_graph(self, meanwhile: Sequence[Callable[[], object]] = ()) -> None:
        """Start building the graph on a thread of its own, while the rules that come before the
        step account (steps, gaps, the host index) run on this one: on a large trace the build is
        mostly numpy and polars, which let go of the GIL for a large array, so the two share the
        machine's cores (a 606 MB export: 11 s of graph beside 5 s of those rules; the whole
        diagnosis 0.91 of the time, for 2% more peak memory). ``graph`` waits for it, but first,
        if it is still being built, computes ``meanwhile``: analyses the diagnosis asks for later
        anyway. A build that fails leaves nothing cached: ``graph`` then builds again on the asking
        thread, where the error is raised."""
        from tracewhy.analyses.critical_path_graph import build_graph

        if self.account_memory() is not None:  # (no account, so no graph to build)
            return

        def build() -> None:
            with contextlib.suppress(Exception):
                self.cached("graph", lambda: build_graph(self.trace))
        self._meanwhile.extend(meanwhile)
        copy = contextvars.copy_context()
        threading.Thread(target=copy.run, args=(build,), name="tracewhy-graph", daemon=True).start()

    def step_model(self) -> StepModel:
        from tracewhy.analyses.account import AccountOptions, step_model

        # (The graph asked last: where ``start_graph`` builds it on its own thread, the host tree
        # and the compile markers are made here meanwhile.)
        return self.cached("step_model", lambda: step_model(
            self.trace, AccountOptions(marker=self.options.step_marker), steps_result=self.steps(),
            host=self.host(), tree=self.host_tree(), marked=self.compile_marked(), graph=self.graph()))

    def account_memory(self) -> AccountMemory | None:
        """Set when the step account would not fit in the memory available (``account_memory``):
        the diagnosis then leaves out the account, the critical path and the predictions."""
        from tracewhy.analyses.account_memory import short_of_memory

        return self.cached("account_memory", lambda: short_of_memory(self.trace))

    def account(self) -> AccountResult | None:
        """The step account (None for a trace with no slices or no window to account for, and
        where it would not fit in memory: ``account_memory``)."""
        from tracewhy.analyses.account import step_account

        def compute() -> AccountResult | None:
            if self.trace.slices.height == 0 or self.account_memory() is not None:
                return None
            r = step_account(self.trace, model=self.step_model())
            return r if r.mean_step_ns > 0 and r.parts.height else None
        return self.cached("account", compute)

    def what_if_windows(self) -> list[WindowEdges]:
        """The analysed windows predictions replay (``what_if.window_edges``'s choice)."""
        from tracewhy.analyses.what_if import window_edges

        return self.cached("what_if_windows", lambda: window_edges(self.step_model()))

    def measured_step_ns(self) -> int:
        """The mean of the windows predictions replay: the step they are measured against."""
        windows = self.what_if_windows()
        return round(sum(w.path.window_end - w.path.window_start for w in windows) / max(len(windows), 1))

    def predict(self, edits: tuple[Fix, ...]) -> Prediction:
        """The steps replayed with these edits at once, each set of edits replayed once per diagnosis
        (a finding and the fixes-together line ask for the same ones)."""
        from tracewhy.analyses.what_if import predict

        windows = self.what_if_windows()
        key = "predict:" + " + ".join(sorted(repr(e) for e in edits))
        return self.cached(key, lambda: predict(self.step_model(), edits, windows))
