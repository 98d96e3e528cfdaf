"""Two runs side by side: the shift in steady step time, per-op and per-kernel time per step,
and what differs in how and where they were captured. Measurements only; ``findings.compare``
judges them.

Ops and kernels are counted inside each run's steady window (first to last steady step), per
steady step, so runs with different step counts or warm-up compare fairly. GPU work belongs to
the window its launch fell in. A run without steps is compared as a whole (one "step").
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.shift import Shift, hodges_lehmann, in_whole_ns
from tracewhy.analyses.steps import StepCol, StepsOptions, StepsResult, steps
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, DeviceCol, Kind
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows

if TYPE_CHECKING:  # (memory is analysed here only when a caller has no memory analysis to give)
    from tracewhy.analyses.compile import CompileResult
    from tracewhy.analyses.memory import MemoryResult


@dataclass(frozen=True)
class DiffOptions:
    step_marker: str | None = None
    warmup: int | None = None
    confidence: float = 0.95


@dataclass(frozen=True)
class RunSummary:
    """What one side is: enough to tell whether two runs can be compared."""

    path: str
    format: str
    step_marker: str
    steady_steps: int
    window_ns: tuple[int, int] | None  # the steady window, None when the run has no steps
    devices: list[str]  # device names, in device order
    rank: int | None
    world_size: int | None
    capture: dict[str, Any]  # profiler options (Kineto) or capture settings (nsys)
    versions: dict[str, str]
    #: From the first event's start to the last one's end: what a comparison of totals covers.
    span_ns: int = 0


@dataclass(frozen=True)
class Difference:
    """One way the two captures differ (device, option, version, ...)."""

    what: str
    a: str
    b: str


@dataclass(frozen=True)
class MemoryChange:
    """One device's allocation peak in each run (None: no memory events for it in that run) and
    its ledger at the peak; ``ledger_change`` is B - A per category, over the categories either
    has, and empty when one run lacks the device (there is nothing to subtract)."""

    device: str
    a_peak_allocated_bytes: int | None
    b_peak_allocated_bytes: int | None
    a_peak_reserved_bytes: int | None
    b_peak_reserved_bytes: int | None
    a_ledger: dict[str, int]
    b_ledger: dict[str, int]
    ledger_source: str

    @property
    def peak_change_bytes(self) -> int | None:
        if self.a_peak_allocated_bytes is None or self.b_peak_allocated_bytes is None:
            return None
        return self.b_peak_allocated_bytes - self.a_peak_allocated_bytes

    @property
    def ledger_change(self) -> dict[str, int]:
        if self.peak_change_bytes is None:
            return {}
        keys = [*self.a_ledger, *(k for k in self.b_ledger if k not in self.a_ledger)]
        return {k: self.b_ledger.get(k, 0) - self.a_ledger.get(k, 0) for k in keys}


@dataclass(frozen=True)
class CompileChange:
    """torch.compile in each run: graph breaks per step (the steady median; without steady steps,
    those of every captured step), recompiles in the captured steps and regions per step. A run
    without compile markers has none of them (0)."""

    a_graph_breaks_per_step: float
    b_graph_breaks_per_step: float
    a_recompiles: int
    b_recompiles: int
    a_regions_per_step: float
    b_regions_per_step: float


def compile_change(a: CompileResult | None, b: CompileResult | None) -> CompileChange | None:
    """Both runs' compile figures; None when neither run has compile markers."""
    if not (a is not None and a.has_compile) and not (b is not None and b.has_compile):
        return None

    def figures(r: CompileResult | None) -> tuple[float, int, float]:
        if r is None or not r.has_compile:
            return 0.0, 0, 0.0
        return r.graph_breaks_measured, r.recompile_count, r.regions_per_step or 0.0

    (ab, ar, ag), (bb, br, bg) = figures(a), figures(b)
    return CompileChange(a_graph_breaks_per_step=ab, b_graph_breaks_per_step=bb, a_recompiles=ar, b_recompiles=br,
                         a_regions_per_step=ag, b_regions_per_step=bg)


#: ``DiffResult.annotations`` and ``kernels``: per name, calls and time per steady step in A and B.
DELTAS_SCHEMA: Final = pl.Schema({
    Col.NAME: pl.String(), "a_calls_per_step": pl.Float64(), "b_calls_per_step": pl.Float64(),
    "a_ns_per_step": pl.Float64(), "b_ns_per_step": pl.Float64(), "delta_ns_per_step": pl.Float64(),
})
#: ``DiffResult.ops``: the same, with the GPU time the ops launched.
OP_DELTAS_SCHEMA: Final = pl.Schema({
    **{k: v for k, v in DELTAS_SCHEMA.items() if k != "delta_ns_per_step"},
    "a_gpu_ns_per_step": pl.Float64(), "b_gpu_ns_per_step": pl.Float64(), "delta_ns_per_step": pl.Float64(),
    "delta_gpu_ns_per_step": pl.Float64(),
})


@dataclass(frozen=True)
class DiffResult(Rows, rows="ops", key="name"):
    """``steps`` is None when either run has no steady steps; its times are whole nanoseconds.

    ``ops`` (OP_DELTAS_SCHEMA), ``annotations`` and ``kernels`` (DELTAS_SCHEMA) columns: name,
    a_calls_per_step, b_calls_per_step, a_ns_per_step, b_ns_per_step, delta_ns_per_step (B - A);
    largest absolute delta first. Ops
    carry CPU self time (``*_ns_per_step``) and the GPU time they launched (``*_gpu_ns_per_step``);
    annotations (``record_function`` / NVTX blocks other than the step marker) their inclusive
    time on the CPU.
    """

    a: RunSummary
    b: RunSummary
    steps: Shift | None
    a_step_durations_ns: list[int]
    b_step_durations_ns: list[int]
    ops: pl.DataFrame
    annotations: pl.DataFrame
    kernels: pl.DataFrame
    differences: list[Difference] = field(default_factory=list)
    #: Per device of either run, from ``profile_memory`` traces; empty when neither has memory events.
    memory: list[MemoryChange] = field(default_factory=list)
    #: torch.compile in each run, from the diagnoses' compile analyses; None when not given or
    #: when neither run has compile markers.
    compiled: CompileChange | None = None


@dataclass(frozen=True)
class DiffSide:
    """One run's part of a diff, made from its trace alone (``side``): the diff of two runs is
    that of their sides (``diff_sides``), so each can be made where its trace is."""

    summary: RunSummary
    #: The steady steps' durations (ns), in step order.
    steady_ns: list[int]
    #: Per name inside the steady window: ``calls`` and ``ns`` (ops also ``gpu_ns``).
    ops: pl.DataFrame
    kernels: pl.DataFrame
    annotations: pl.DataFrame
    memory: MemoryResult | None


def diff(a: Trace, b: Trace, options: DiffOptions = DiffOptions(), *,
         memory: tuple[MemoryResult | None, MemoryResult | None] | None = None,
         compiled: tuple[CompileResult | None, CompileResult | None] | None = None,
         step_results: tuple[StepsResult, StepsResult] | None = None) -> DiffResult:
    """``memory``: each run's memory analysis when the caller has it (a diagnosis does), so it is
    not made twice; else it is made here for a run with memory events. ``compiled``: each run's
    compile analysis (a diagnosis has it); without it the result has no compile figures.
    ``step_results``: each run's steps when the caller has them with ``options``' marker and
    warm-up (a diagnosis does); else they are found here."""
    a.require_whole()
    b.require_whole()
    if step_results is None:
        step_options = StepsOptions(marker=options.step_marker, warmup=options.warmup)
        step_results = steps(a, step_options), steps(b, step_options)
    sa, sb = step_results
    ma, mb = memory if memory is not None else (_memory(a, sa), _memory(b, sb))
    return diff_sides(side(a, sa, ma), side(b, sb, mb), options, compiled=compiled)


def side(t: Trace, s: StepsResult, memory: MemoryResult | None) -> DiffSide:
    """Run ``t``'s part of a diff, given its steps (with the diff's marker and warm-up) and its
    memory analysis (None: no memory events)."""
    t.require_whole()
    summary = _summary(t, s)
    return DiffSide(summary=summary, steady_ns=_steady(s), ops=_op_times(t, summary.window_ns),
                    kernels=_kernel_times(t, summary.window_ns), annotations=_annotation_times(t, summary),
                    memory=memory)


def diff_sides(a: DiffSide, b: DiffSide, options: DiffOptions = DiffOptions(), *,
               compiled: tuple[CompileResult | None, CompileResult | None] | None = None) -> DiffResult:
    """Run B's side against baseline A's (``compiled``: as ``diff`` takes it)."""
    da, db = a.steady_ns, b.steady_ns
    shift = in_whole_ns(hodges_lehmann(da, db, options.confidence)) if da and db else None
    ra, rb = a.summary, b.summary
    na, nb = max(ra.steady_steps, 1), max(rb.steady_steps, 1)
    return DiffResult(
        a=ra, b=rb, steps=shift, a_step_durations_ns=da, b_step_durations_ns=db,
        ops=_joined(a.ops, b.ops, na, nb, gpu=True),
        annotations=_joined(a.annotations, b.annotations, na, nb, gpu=False),
        kernels=_joined(a.kernels, b.kernels, na, nb, gpu=False), differences=_differences(ra, rb),
        memory=memory_changes(a.memory, b.memory),
        compiled=compile_change(*compiled) if compiled is not None else None,
    )


def _memory(t: Trace, s: StepsResult) -> MemoryResult | None:
    from tracewhy.analyses.memory import analyze_memory

    return analyze_memory(t, steps_result=s) if t.memory.height else None


def memory_changes(a: MemoryResult | None, b: MemoryResult | None) -> list[MemoryChange]:
    """The devices of either run, in label order, each with both runs' peaks and ledgers."""
    da = {d.device: d for d in a.devices} if a is not None else {}
    db = {d.device: d for d in b.devices} if b is not None else {}
    sources = {r.ledger_source for r in (a, b) if r is not None}
    out: list[MemoryChange] = []
    for device in sorted(set(da) | set(db)):
        x, y = da.get(device), db.get(device)
        out.append(MemoryChange(
            device=device,
            a_peak_allocated_bytes=x.peak_allocated_bytes if x else None,
            b_peak_allocated_bytes=y.peak_allocated_bytes if y else None,
            a_peak_reserved_bytes=x.peak_reserved_bytes if x else None,
            b_peak_reserved_bytes=y.peak_reserved_bytes if y else None,
            a_ledger=dict(x.ledger) if x else {}, b_ledger=dict(y.ledger) if y else {},
            ledger_source="/".join(sorted(sources)),
        ))
    return out


def _steady(r: StepsResult) -> list[int]:
    return [int(v) for v in r.table.filter(pl.col(StepCol.STEADY)).get_column(StepCol.DUR).to_list()]


def _summary(t: Trace, s: StepsResult) -> RunSummary:
    steady = s.table.filter(pl.col(StepCol.STEADY))
    window = None
    if steady.height:
        ts = steady.get_column(Col.TS).to_numpy()
        window = (int(ts.min()), int((ts + steady.get_column(Col.DUR).to_numpy()).max()))
    m = t.meta
    capture: dict[str, Any] = {
        k: v for k, v in vars(m.capture).items() if k != "source" and v is not None
    }
    capture.update({f"nsys:{k}": v for k, v in m.capture_settings.items()})
    return RunSummary(
        path=m.path, format=m.format, step_marker=s.marker, steady_steps=steady.height, window_ns=window,
        devices=[str(n) for n in t.devices.sort(DeviceCol.DEVICE).get_column(DeviceCol.NAME).to_list()],
        rank=m.rank, world_size=m.world_size, capture=capture, versions=dict(m.versions),
        span_ns=t.span_ns,
    )


def _in_window(ts: pl.Expr, window: tuple[int, int] | None) -> pl.Expr:
    return pl.lit(True) if window is None else ts.is_between(window[0], window[1], closed="left")


def _op_times(t: Trace, window: tuple[int, int] | None) -> pl.DataFrame:
    """Per op name inside the window: calls, CPU self time, GPU time of work it launched."""
    s = t.slices
    ops = s.filter((pl.col(Col.KIND) == Kind.CPU_OP.value) & _in_window(pl.col(Col.TS), window))
    # CPU self = own duration less that of CPU ops directly nested in it (their op_id is it).
    child = ops.filter(pl.col(Col.OP).is_not_null()).group_by(Col.OP).agg(pl.col(Col.DUR).sum().alias("_child"))
    ops = ops.join(child, left_on=Col.ID, right_on=Col.OP, how="left").with_columns(
        (pl.col(Col.DUR) - pl.col("_child").fill_null(0)).clip(lower_bound=0).alias("_self")
    )
    cpu = ops.group_by(pl.col(Col.NAME).cast(pl.String)).agg(
        pl.len().cast(pl.Int64).alias("calls"), pl.col("_self").sum().alias("ns")
    )
    gpu = _launched(t, window).filter(pl.col(Col.OP).is_not_null())
    op_names = s.get_column(Col.NAME).gather(gpu.get_column(Col.OP)).cast(pl.String)
    gpu_by_op = pl.DataFrame({Col.NAME: op_names, "gpu_ns": gpu.get_column(Col.DUR)}).group_by(Col.NAME).agg(
        pl.col("gpu_ns").sum()
    )
    return cpu.join(gpu_by_op, on=Col.NAME, how="full", coalesce=True).with_columns(
        pl.col("calls").fill_null(0), pl.col("ns").fill_null(0), pl.col("gpu_ns").fill_null(0)
    )


def _launched(t: Trace, window: tuple[int, int] | None) -> pl.DataFrame:
    """GPU activity whose launch (or, unlinked, whose own start) lies in the window."""
    s = t.slices
    gpu = s.filter(pl.col(Col.KIND).is_in([k.value for k in GPU_ACTIVITY_KINDS]))
    if window is None or gpu.height == 0:
        return gpu
    launch_ts = np.where(
        gpu.get_column(Col.LAUNCH).is_null().to_numpy(),
        gpu.get_column(Col.TS).to_numpy(),
        s.get_column(Col.TS).gather(gpu.get_column(Col.LAUNCH).fill_null(0)).to_numpy(),
    )
    return gpu.filter(pl.Series((launch_ts >= window[0]) & (launch_ts < window[1])))


def _annotation_times(t: Trace, run: RunSummary) -> pl.DataFrame:
    marker = re.compile(rf"^{re.escape(run.step_marker)}(?:#?\d+)?$")
    a = t.slices.filter((pl.col(Col.KIND) == Kind.ANNOTATION.value) & _in_window(pl.col(Col.TS), run.window_ns))
    # emit_nvtx ranges carry a per-call suffix: grouped by the op's name, as every command does.
    table = a.group_by(pl.col(Col.NAME).cast(pl.String).str.replace(api_names.OP_RANGE_SUFFIX, "")).agg(
        pl.len().cast(pl.Int64).alias("calls"), pl.col(Col.DUR).sum().alias("ns")
    )
    return table.filter(~pl.col(Col.NAME).map_elements(lambda n: bool(marker.match(n)), return_dtype=pl.Boolean))


def _kernel_times(t: Trace, window: tuple[int, int] | None) -> pl.DataFrame:
    k = _launched(t, window).filter(pl.col(Col.KIND) == Kind.KERNEL.value)
    return k.group_by(pl.col(Col.NAME).cast(pl.String)).agg(
        pl.len().cast(pl.Int64).alias("calls"), pl.col(Col.DUR).sum().alias("ns")
    )


def _joined(a: pl.DataFrame, b: pl.DataFrame, na: int, nb: int, gpu: bool) -> pl.DataFrame:
    cols = ["calls", "ns", *(["gpu_ns"] if gpu else [])]
    j = a.rename({c: f"a_{c}" for c in cols}).join(
        b.rename({c: f"b_{c}" for c in cols}), on=Col.NAME, how="full", coalesce=True
    )
    out = j.select(
        Col.NAME,
        (pl.col("a_calls").fill_null(0) / na).alias("a_calls_per_step"),
        (pl.col("b_calls").fill_null(0) / nb).alias("b_calls_per_step"),
        (pl.col("a_ns").fill_null(0) / na).alias("a_ns_per_step"),
        (pl.col("b_ns").fill_null(0) / nb).alias("b_ns_per_step"),
        *(
            [(pl.col("a_gpu_ns").fill_null(0) / na).alias("a_gpu_ns_per_step"),
             (pl.col("b_gpu_ns").fill_null(0) / nb).alias("b_gpu_ns_per_step")]
            if gpu else []
        ),
    ).with_columns((pl.col("b_ns_per_step") - pl.col("a_ns_per_step")).alias("delta_ns_per_step"))
    if gpu:
        out = out.with_columns(
            (pl.col("b_gpu_ns_per_step") - pl.col("a_gpu_ns_per_step")).alias("delta_gpu_ns_per_step")
        )
        key = pl.max_horizontal(pl.col("delta_ns_per_step").abs(), pl.col("delta_gpu_ns_per_step").abs())
    else:
        key = pl.col("delta_ns_per_step").abs()
    return out.with_columns(key.alias("_key")).sort(["_key", Col.NAME], descending=[True, False]).drop("_key")


def _differences(a: RunSummary, b: RunSummary) -> list[Difference]:
    out: list[Difference] = []

    def note(what: str, va: object, vb: object) -> None:
        if va != vb:
            out.append(Difference(what, _text(va), _text(vb)))

    note("format", a.format, b.format)
    note("devices", a.devices, b.devices)
    note("world_size", a.world_size, b.world_size)
    note("rank", a.rank, b.rank)
    note("step_marker", a.step_marker, b.step_marker)
    for key in sorted(set(a.capture) | set(b.capture)):
        note(f"capture.{key}", a.capture.get(key), b.capture.get(key))
    for key in sorted(set(a.versions) | set(b.versions)):
        note(f"version.{key}", a.versions.get(key), b.versions.get(key))
    return out


def _text(value: object) -> str:
    if value is None:
        return "not recorded"
    if isinstance(value, list):  # device names: "8 x NVIDIA A100", in first-seen order
        counts = Counter(str(v) for v in value)
        return ", ".join(f"{n} x {name}" if n > 1 else name for name, n in counts.items()) or "none"
    return str(value)
