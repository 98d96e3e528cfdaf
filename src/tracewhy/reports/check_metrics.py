"""The CI gate's metrics: named numbers of a trace, each one small function over a diagnosis
context (or saying why it cannot be measured), and the limits a user sets on them
(``max-gpu-idle = 20%``). To add a metric, write a function ``Context -> Measured`` and register
it in ``METRICS``; ``check`` gains the option ``--max-NAME`` (or ``--min-NAME``) with it.

A metric reads the diagnosis' own context, so that the analyses the rules also use run once;
``high-findings`` runs the diagnosis itself, which is why the metrics are a report's, not a rule's.
A metric imports what only it measures with (the diagnosis' rules, the step account behind the
overlap figures, memory, compile) when it is measured: ``check --max-gpu-idle`` imports none of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses.overlap import OverlapCol
from tracewhy.analyses.steps import StepCol
from tracewhy.analyses.throughput import UNITS, from_step_stats
from tracewhy.findings.basis import basis
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Severity
from tracewhy.findings.sync_count import COUNTED, blocking_syncs
from tracewhy.findings.throughput import describe, fmt_rate, gated_rate
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Kind
from tracewhy.units import fmt_ns, fmt_pct

SHARE, DURATION, COUNT, BYTES, RATE = "share", "duration", "count", "bytes", "rate"


@dataclass(frozen=True)
class Measured:
    """A metric's value, or None with ``note`` saying why it cannot be measured on this trace."""

    value: float | None
    note: str | None = None


@dataclass(frozen=True)
class Metric:
    name: str
    bounds: tuple[str, ...]  # which of "max" / "min" make sense
    unit: str  # SHARE (0..1, written as a percentage), DURATION (ns), COUNT, BYTES or RATE (items/s)
    help: str
    measure: Callable[[Context], Measured]
    #: A speed figure (step time, GPU idle, overlap, throughput): one that a capture timed block
    #: by block measures slower than the job runs.
    speed: bool = False
    #: The slice kinds the figure counts: events of these kinds that the reader left out make
    #: it a figure of part of the run (``check``'s partial-trace); None: every kind.
    counts: frozenset[str] | None = None


@dataclass(frozen=True)
class Limit:
    """``bound`` ("max" or "min") of ``metric`` at ``value`` (in the metric's unit)."""

    metric: str
    bound: str
    value: float
    text: str  # as the user wrote it

    @property
    def key(self) -> str:
        return f"{self.bound}-{self.metric}"



# --- the metrics ---------------------------------------------------------------------------------


def _step_quantile(attr: str) -> Callable[[Context], Measured]:
    def measure(ctx: Context) -> Measured:
        stats = ctx.steps().stats
        if stats is None:
            return Measured(None, "no steady steps (name the step annotation with --step NAME)")
        return Measured(float(getattr(stats, attr)), f"{stats.count} steady steps")

    return measure


def _gpu_idle(ctx: Context) -> Measured:
    b = basis(ctx)
    if b.device is None:
        return Measured(None, "no GPU activity in the trace")
    return Measured(1.0 - b.active_share, f"GPU {b.device} {b.unit}")


def _comm_rows(ctx: Context) -> tuple[pl.DataFrame, str] | None:
    from tracewhy.findings.overlap import overlap_result

    r = overlap_result(ctx)
    if r.devices.height == 0:
        return None
    if r.steady.height:
        return r.steady, "per steady step"
    return r.devices.rename({OverlapCol.SPAN: OverlapCol.WINDOW}), "over the trace (no step markers)"


def _exposed_comm(ctx: Context) -> Measured:
    rows = _comm_rows(ctx)
    if rows is None:
        return Measured(None, "no GPU activity in the trace")
    table, unit = rows
    shares = [e / w for e, w in table.select(OverlapCol.COMM_EXPOSED, OverlapCol.WINDOW).iter_rows() if w]
    return Measured(max(shares, default=0.0), f"worst device, {unit}")


def _overlap(ctx: Context) -> Measured:
    rows = _comm_rows(ctx)
    if rows is None:
        return Measured(None, "no GPU activity in the trace")
    table, unit = rows
    hidden = [h / c for h, c in table.select(OverlapCol.COMM_HIDDEN, OverlapCol.COMM).iter_rows() if c]
    if not hidden:
        return Measured(None, "no communication kernels in the trace")
    return Measured(min(hidden), f"communication under compute, worst device, {unit}")


def _syncs_per_step(ctx: Context) -> Measured:
    """The count diagnose's nsys-sync-api states too (findings/sync_count.py), with its calls by name."""
    count = blocking_syncs(ctx)
    names = count.breakdown()
    return Measured(count.per_step, count.statistic + (f": {names}" if names else ""))


def _kernels_per_step(ctx: Context) -> Measured:
    table = ctx.steps().table.filter(pl.col(StepCol.STEADY))
    if table.height:
        return Measured(float(np.mean(table.get_column(StepCol.KERNEL_COUNT).to_numpy())),
                        f"mean of {table.height} steady steps")
    return Measured(None, "no steady steps (name the step annotation with --step NAME)")


def _high_findings(ctx: Context) -> Measured:
    from tracewhy.reports.diagnose import diagnose_in

    report = diagnose_in(ctx)  # on check's context: the analyses check measured are not redone
    high = [f.code for f in report.findings if f.severity is Severity.HIGH]
    return Measured(float(len(high)), ", ".join(high) or None)


def _peak_memory(ctx: Context) -> Measured:
    """The highest allocation peak over the GPUs (the host's when the trace has no GPU memory
    events), as ``memory`` reports it: the allocator's own Total Allocated."""
    from tracewhy.findings.memory import memory_result

    r = memory_result(ctx)
    if r is None or not r.devices:
        return Measured(None, "no [memory] events: profile with profile_memory=True")
    devices = [d for d in r.devices if d.device != "cpu"] or list(r.devices)
    top = max(devices, key=lambda d: d.peak_allocated_bytes)
    where = f" in {top.peak_step}" if top.peak_step else ""
    return Measured(float(top.peak_allocated_bytes),
                    f"{top.device}{where}: {top.peak_allocated_bytes:,} B allocated at its peak")


def _graph_breaks(ctx: Context) -> Measured:
    """torch.compile graph breaks per steady step (median), as the graph-breaks finding states them;
    without steady steps, those of every captured step."""
    from tracewhy.findings.compile import compile_result

    r = compile_result(ctx)
    if not r.has_compile:
        return Measured(0.0, "no torch.compile markers in the trace")
    if r.graph_breaks_per_step is None:
        return Measured(r.graph_breaks_measured, "no steady steps: breaks in every captured step")
    return Measured(r.graph_breaks_per_step, f"median of steady steps; regions per step: {r.regions_per_step or 0:g}")


def _recompiles(ctx: Context) -> Measured:
    """Recompiles (compile ids F/C with C > 0) first compiled in the captured steps."""
    from tracewhy.analyses.compile import RecompileCol
    from tracewhy.findings.compile import compile_result

    r = compile_result(ctx)
    if not r.has_compile:
        return Measured(0.0, "no torch.compile markers in the trace")
    where = ", ".join(f"{region} in {step}" for region, step in r.recompiles.select(
        RecompileCol.REGION, RecompileCol.STEP).iter_rows())
    return Measured(float(r.recompile_count),
                    f"{r.steady_recompiles} in steady steps" + (f": {where}" if where else ""))


def _throughput(ctx: Context) -> Measured:
    """Items per second at the median steady step time (``--items-per-step N --unit U``)."""
    rate = ctx.options.throughput
    if rate is None:
        return Measured(None, "give --items-per-step N (and --unit) to turn step times into throughput")
    t = from_step_stats(ctx.steps().stats, rate)
    if t is None:
        return Measured(None, "no steady steps (name the step annotation with --step NAME)")
    return Measured(gated_rate(t), describe(t))


#: What the figures count, for the partial-trace gate: steps come from the step annotation (or
#: op); GPU shares from device activity within them; syncs from the host calls that block.
_STEPS: Final = frozenset({Kind.ANNOTATION.value, Kind.CPU_OP.value, Kind.GPU_ANNOTATION.value})
_GPU: Final = _STEPS | {k.value for k in GPU_ACTIVITY_KINDS}
_SYNCS: Final = _STEPS | {Kind.RUNTIME.value, Kind.DRIVER.value, Kind.GPU_SYNC.value}
_KERNELS: Final = _STEPS | {Kind.KERNEL.value}
_NO_SLICES: Final = frozenset[str]()

METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("step-p50", ("max",), DURATION, "median steady step time", _step_quantile("p50_ns"), speed=True,
           counts=_STEPS),
    Metric("step-p90", ("max",), DURATION, "90th percentile steady step time", _step_quantile("p90_ns"),
           speed=True, counts=_STEPS),
    Metric("step-p99", ("max",), DURATION, "99th percentile steady step time", _step_quantile("p99_ns"),
           speed=True, counts=_STEPS),
    Metric("gpu-idle", ("max",), SHARE, "GPU idle share of the steady step (busiest device)", _gpu_idle,
           speed=True, counts=_GPU),
    Metric("exposed-comm", ("max",), SHARE, "communication with no compute under it, share of the step",
           _exposed_comm, speed=True, counts=_GPU),
    Metric("overlap", ("min",), SHARE, "share of communication time hidden under compute", _overlap, speed=True,
           counts=_GPU),
    Metric("syncs-per-step", ("max",), COUNT, f"blocking calls per steady step ({COUNTED})", _syncs_per_step,
           counts=_SYNCS),
    Metric("kernels-per-step", ("max",), COUNT, "kernels launched per steady step (fusion regressions)",
           _kernels_per_step, counts=_KERNELS),
    Metric("high-findings", ("max",), COUNT, "diagnose findings of high severity", _high_findings),
    Metric("peak-memory", ("max",), BYTES, "allocated memory at the peak, highest GPU (profile_memory traces)",
           _peak_memory, counts=_NO_SLICES),
    # Named as the finding whose number it gates: --max-graph-breaks.
    Metric(str(Code.GRAPH_BREAKS), ("max",), COUNT, "torch.compile graph breaks per steady step", _graph_breaks,
           counts=_STEPS),
    Metric("recompiles", ("max",), COUNT, "torch.compile recompiles in the captured steps", _recompiles,
           counts=_STEPS),
    Metric("throughput", ("min",), RATE, "items per second at the median steady step (needs --items-per-step)",
           _throughput, speed=True, counts=_STEPS),
)}


# --- limits ---------------------------------------------------------------------------------------

_DURATION_UNITS = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}
#: Sizes: binary (KiB, MiB, GiB, TiB) and decimal (kB, MB, GB, TB) units, any case.
_SIZE_UNITS = {"b": 1, **{f"{p}ib": 1 << (10 * i) for i, p in enumerate("kmgt", 1)},
               **{f"{p}b": 1000**i for i, p in enumerate("kmgt", 1)}}
_NUMBER = r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"


def parse_size(raw: str, what: str) -> float:
    """Bytes from a size with its unit ("40GiB", "512MB", "1000000B"); ValueError naming ``what``."""
    m = re.fullmatch(rf"({_NUMBER})\s*([a-z]+)", raw.strip(), re.IGNORECASE)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{what}: expected a size with its unit, like 40GiB, 512MB or 1000000B, got {raw!r}")
    return float(m.group(1)) * float(_SIZE_UNITS[m.group(2).lower()])


def parse_limit(key: str, text: object) -> Limit:
    """``key`` like "max-gpu-idle"; ``text`` like "20%", "0.2", "120ms", 3. Raises ValueError."""
    bound, _, name = key.partition("-")
    metric = METRICS.get(name)
    if bound not in ("max", "min") or metric is None:
        known = ", ".join(f"{b}-{m.name}" for m in METRICS.values() for b in m.bounds)
        raise ValueError(f"unknown check {key!r}; known: {known}")
    if bound not in metric.bounds:
        raise ValueError(f"{key}: {metric.name} takes only {' or '.join(metric.bounds)}")
    raw = str(text).strip()
    if re.fullmatch(rf"-\s*{_NUMBER}\s*(%|ns|us|µs|ms|s|[kmgt]?i?b)?", raw, re.IGNORECASE):
        raise ValueError(f"{key}: must be ≥ 0, got {raw!r}")
    if metric.unit == SHARE:
        m = re.fullmatch(rf"({_NUMBER})\s*(%?)", raw)
        if not m:
            raise ValueError(f"{key}: expected a percentage like 20% (or a fraction like 0.2), got {raw!r}")
        value = float(m.group(1)) / 100 if m.group(2) else float(m.group(1))
        if not m.group(2) and 1 < value <= 100:
            raise ValueError(f"{key}: {raw} is read as a fraction (a share lies between 0 and 1); write {raw}%")
        if not 0 <= value <= 1:
            raise ValueError(f"{key}: a share must lie between 0% and 100%, got {raw!r}")
    elif metric.unit == DURATION:
        m = re.fullmatch(rf"({_NUMBER})\s*(ns|us|µs|ms|s)", raw)
        if not m:
            raise ValueError(f"{key}: expected a duration with its unit, like 120ms, 1.5s or 800us, got {raw!r}")
        value = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    elif metric.unit == RATE:
        m = re.fullmatch(rf"({_NUMBER})\s*(/s|fps|(?:{'|'.join(UNITS)})/s)?", raw, re.IGNORECASE)
        if not m:
            raise ValueError(f"{key}: expected items per second, like 20/s, 20 FPS or 1200 tokens/s, got {raw!r}")
        value = float(m.group(1))
    elif metric.unit == BYTES:
        value = parse_size(raw, key)
    else:
        m = re.fullmatch(_NUMBER, raw)
        if not m:
            raise ValueError(f"{key}: expected a number, got {raw!r}")
        value = float(raw)
    return Limit(metric=name, bound=bound, value=value, text=raw)


def fmt_value(unit: str, value: float | None) -> str:
    if value is None:
        return "not measured"
    if unit == SHARE:
        return fmt_pct(value)
    if unit == DURATION:
        return fmt_ns(value)
    if unit == BYTES:
        return _fmt_size(value)
    if unit == RATE:
        return f"{fmt_rate(value)}/s"
    return f"{value:g}" if value == int(value) else f"{value:.2f}"


def _fmt_size(n: float) -> str:
    """Bytes in binary units to three decimals (40 GiB, 6.174 GiB), so a limit and a peak near it
    read apart; the measured note gives the exact bytes."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.3f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{n:.0f} B"


