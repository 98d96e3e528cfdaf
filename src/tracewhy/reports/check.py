"""``check``, the CI gate: every limit held against its metric (``reports/check_metrics.py``),
the thresholds from the options or from ``[tool.tracewhy.check]`` in a pyproject.toml (options
win), and, with a baseline, a failure when the step time regressed significantly
(``findings/compare.py`` judges it).

A trace timed block by block (``blocks-synchronized``, the finding ``blocks`` and ``diagnose``
make) is attribution, not throughput. Where the gate holds a speed figure (step time, GPU idle,
overlap, throughput, or a baseline's step times), ``check`` says so in a note line, marks those
figures ``attribution_only`` and keeps their verdicts: the per-block synchronizes only add time
(the GPU drains, blocks cannot overlap), so a pass holds without them, while a failure may be
the harness's, which the note says.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tracewhy.analyses.diff import DiffOptions
from tracewhy.analyses.throughput import ThroughputOptions, requested
from tracewhy.errors import UsageError
from tracewhy.findings import thresholds as th
from tracewhy.findings.blocks import blocks_result, synchronized_blocks
from tracewhy.findings.codes import Code
from tracewhy.findings.compare import SLOWER, Comparison
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.findings.model import Finding
from tracewhy.model.trace import Trace
from tracewhy.reports.check_metrics import METRICS, Limit, fmt_value, parse_limit
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource
from tracewhy.rows import Rows

if TYPE_CHECKING:
    from tracewhy.reports.several import SeveralReport

#: Keys of ``[tool.tracewhy.check]`` that are settings, not limits.
SETTINGS: Final[tuple[str, ...]] = ("baseline", "step", "warmup", "allow-unmeasured", "allow-partial",
                                    "items-per-step", "unit")


@dataclass(frozen=True)
class CheckResult:
    limit: Limit
    measured: float | None
    measured_text: str
    passed: bool
    note: str | None
    line: str  # the one line printed for it
    #: A speed figure measured on a trace timed block by block (``blocks-synchronized``).
    attribution_only: bool = False


@dataclass(frozen=True)
class CheckNote:
    """A finding that qualifies a trace's figures without failing the gate (``blocks-synchronized``:
    the trace was timed block by block)."""

    about: str  # "trace" or "baseline"
    path: str
    finding: Finding

    @property
    def line(self) -> str:
        about = " (baseline)" if self.about == "baseline" else ""
        return f"note {self.finding.code}{about}: {self.finding.statement}"


@dataclass(frozen=True)
class CheckReport(Rows, rows="results", key="limit.key"):
    results: list[CheckResult]
    baseline: Comparison | None
    baseline_passed: bool
    baseline_line: str | None
    #: Why a trace (this one or the baseline) lacks events; a gate must not pass on a part of
    #: a run unless told to (``--allow-partial``).
    partial: list[str] = field(default_factory=list)
    partial_passed: bool = True
    notes: list[CheckNote] = field(default_factory=list)

    @property
    def attribution_only(self) -> bool:
        """The trace checked was timed block by block: its speed figures are not throughput."""
        return any(n.about == "trace" and n.finding.code == Code.BLOCKS_SYNCHRONIZED for n in self.notes)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results) and self.baseline_passed and self.partial_passed

    @property
    def partial_line(self) -> str | None:
        if not self.partial:
            return None
        if self.partial_passed:
            return f"ok   partial-trace: allowed (--allow-partial): {'; '.join(self.partial)}"
        return (f"FAIL partial-trace: {'; '.join(self.partial)}; the figures cover only part of the run "
                "(--allow-partial checks it anyway)")

    @property
    def violations(self) -> list[str]:
        lines = [r.line for r in self.results if not r.passed]
        if not self.baseline_passed and self.baseline_line:
            lines.append(self.baseline_line)
        if not self.partial_passed and self.partial_line:
            lines.append(self.partial_line)
        return lines



# --- the gate -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckOptions:
    limits: tuple[Limit, ...] = ()
    step_marker: str | None = None
    warmup: int | None = None
    allow_unmeasured: bool = False  # a limit whose metric the trace cannot give passes instead of failing
    allow_partial: bool = False  # a trace that lacks events (cut, still open, tables skipped) may pass
    throughput: ThroughputOptions | None = None  # items per step, for --min-throughput


def check(trace: Trace, options: CheckOptions, baseline: Trace | None = None) -> CheckReport:
    ctx = Context(trace, DiagnoseOptions(step_marker=options.step_marker, warmup=options.warmup,
                                         throughput=options.throughput, fixes_together=False))
    # Asked only where a speed figure is gated (blocks over millions of NVTX ranges is seconds):
    # a count, a size or a compile figure means the same on a capture timed block by block.
    speed = baseline is not None or any(METRICS[limit.metric].speed for limit in options.limits)
    notes = [CheckNote("trace", trace.meta.path, f) for f in (_synchronized(ctx) if speed else None,) if f is not None]
    results = [_evaluate(ctx, limit, options.allow_unmeasured, attribution=bool(notes)) for limit in options.limits]
    comparison = None
    baseline_passed, baseline_line = True, None
    if baseline is not None:
        diff_options = DiffOptions(step_marker=options.step_marker, warmup=options.warmup,
                                   confidence=th.DIFF_CONFIDENCE)
        from tracewhy.reports.diff import compare  # (with a baseline only: it imports the diagnosis)

        comparison = compare(baseline, trace, diff_options, with_findings=False)
        notes += [CheckNote("baseline", baseline.meta.path, f)
                  for f in (_synchronized(Context(baseline, ctx.options)),) if f is not None]
        if comparison.verdict == SLOWER:
            baseline_passed = False
            baseline_line = f"FAIL baseline: step time regressed; {comparison.statement}"
        elif not comparison.comparable:
            baseline_passed = False
            baseline_line = ("FAIL baseline: not comparable with this trace ("
                             + "; ".join(comparison.not_comparable_because) + ")")
        else:
            baseline_line = f"ok   baseline: {comparison.statement}"
    partial = [f"{t.meta.path}: {why}" for t in (trace, baseline) if t is not None for why in t.meta.missing_events]
    partial += _dropped(trace, _counted(options.limits, baseline is not None))
    if baseline is not None:
        partial += _dropped(baseline, None)
    return CheckReport(results=results, baseline=comparison, baseline_passed=baseline_passed,
                       baseline_line=baseline_line, partial=partial,
                       partial_passed=options.allow_partial or not partial, notes=notes)


def _counted(limits: Sequence[Limit], with_baseline: bool) -> frozenset[str] | None:
    """The slice kinds the checked figures count (None: every kind; the baseline comparison
    reads the whole step account)."""
    kinds: set[str] = set()
    for limit in limits:
        counts = METRICS[limit.metric].counts
        if counts is None:
            return None
        kinds |= counts
    return None if with_baseline else frozenset(kinds)


def _dropped(trace: Trace, kinds: frozenset[str] | None) -> list[str]:
    """Why the checked figures miss events the reader left out of ``trace``, one line per kind
    they count (an unreadable start time drops a kernel from kernels-per-step as surely as a cut)."""
    return [f"{trace.meta.path}: the reader left out {n} {kind} events (start times it could not read)"
            for kind, n in sorted(trace.meta.dropped_events.items()) if n and (kinds is None or kind in kinds)]


def _synchronized(ctx: Context) -> Finding | None:
    """``blocks-synchronized``, as ``blocks`` and ``diagnose`` say it (none on a trace with no
    slices, which has no blocks)."""
    return synchronized_blocks(blocks_result(ctx)) if ctx.trace.slices.height else None


def _evaluate(ctx: Context, limit: Limit, allow_unmeasured: bool, attribution: bool = False) -> CheckResult:
    metric = METRICS[limit.metric]
    m = metric.measure(ctx)
    shown = fmt_value(metric.unit, m.value)
    bound_text = f"{limit.bound} {fmt_value(metric.unit, limit.value)}"
    if m.value is None:
        passed = allow_unmeasured
        line = f"{'ok  ' if passed else 'FAIL'} {limit.metric}: not measured ({m.note}); limit {bound_text}"
    else:
        passed = m.value <= limit.value if limit.bound == "max" else m.value >= limit.value
        op = (">" if limit.bound == "max" else "<") if not passed else ("<=" if limit.bound == "max" else ">=")
        flagged = attribution and metric.speed
        notes = [n for n in (m.note, f"attribution, not throughput: {Code.BLOCKS_SYNCHRONIZED}" if flagged else None)
                 if n]
        note = f" ({'; '.join(notes)})" if notes else ""
        line = f"{'ok  ' if passed else 'FAIL'} {limit.metric}: {shown} {op} {bound_text}{note}"
    return CheckResult(limit=limit, measured=m.value, measured_text=shown, passed=passed, note=m.note, line=line,
                       attribution_only=m.value is not None and attribution and metric.speed)



# --- the command: options and config --------------------------------------------------------------


@dataclass(frozen=True)
class CheckReportOptions:
    """What ``check`` was given: ``limits`` as typed (``{"max-gpu-idle": "20%"}``) and the
    settings, each None where not given (the config's value, else the default, applies)."""

    limits: Mapping[str, str] = field(default_factory=dict)
    #: The pyproject.toml holding [tool.tracewhy.check]; None: the nearest one above the working
    #: directory, unless ``find_config`` is False (the Python API reads no config unasked).
    config: str | None = None
    find_config: bool = True
    baseline: TraceSource | None = None
    step_marker: str | None = None
    warmup: int | None = None
    allow_unmeasured: bool | None = None
    allow_partial: bool | None = None
    items_per_step: float | None = None
    unit: str | None = None


def check_report(trace: TraceSource, options: CheckReportOptions, loader: Loader = PLAIN) -> CheckReport:
    """The gate on ``trace`` with the limits and settings of the options, then of the config."""
    gate, baseline = check_gate(options)
    if not baseline:
        return check(loader.trace(trace), gate, None)
    run, base = loader.traces([trace, baseline])
    return check(run, gate, base)


def check_several(sources: Sequence[TraceSource], options: CheckReportOptions,
                  loader: Loader = PLAIN) -> SeveralReport[CheckReport]:
    """The gate on every trace ``sources`` stand for (a directory: the traces in it), each
    against the one baseline; ranks of one job are told apart (``reports/several.py``)."""
    from tracewhy.reports.several import SeveralOptions, read_several  # (several traces only)

    gate, baseline = check_gate(options)
    base = loader.trace(baseline) if baseline else None
    return read_several(sources, SeveralOptions(gate.step_marker, gate.warmup), lambda t: check(t, gate, base),
                        loader, compare_runs=False)


def check_gate(options: CheckReportOptions) -> tuple[CheckOptions, TraceSource | None]:
    """The gate the options and the config set, and the baseline trace's path (None: none)."""
    config, base_dir = load_config(options.config) if options.config or options.find_config else ({}, Path.cwd())
    settings = {k: config.pop(k) for k in SETTINGS if k in config}
    limits: list[Limit] = []
    try:
        for key, text in {**config, **options.limits}.items():
            limits.append(parse_limit(key, text))
    except ValueError as e:
        raise UsageError(str(e)) from None
    baseline = options.baseline or (str(base_dir / settings["baseline"]) if "baseline" in settings else None)
    if not limits and baseline is None:
        raise UsageError("nothing to check: give thresholds (e.g. --max-gpu-idle 20%), --baseline TRACE, "
                         "or [tool.tracewhy.check] in pyproject.toml")
    warmup = options.warmup if options.warmup is not None else settings.get("warmup")
    gate = CheckOptions(
        limits=tuple(limits),
        step_marker=options.step_marker or settings.get("step"),
        warmup=int(warmup) if warmup is not None else None,
        allow_unmeasured=bool(options.allow_unmeasured if options.allow_unmeasured is not None
                              else settings.get("allow-unmeasured", False)),
        allow_partial=bool(options.allow_partial if options.allow_partial is not None
                           else settings.get("allow-partial", False)),
        throughput=_throughput(options, settings, limits),
    )
    return gate, baseline


def _throughput(options: CheckReportOptions, settings: dict[str, Any], limits: list[Limit]) -> ThroughputOptions | None:
    """--items-per-step/--unit, else ``items-per-step``/``unit`` in the config; a throughput limit needs them."""
    items, unit = options.items_per_step, options.unit
    if items is None and "items-per-step" in settings:
        try:
            items = float(settings["items-per-step"])
        except (TypeError, ValueError):
            raise UsageError(f"items-per-step in the config must be a number, got {settings['items-per-step']!r}") \
                from None
        unit = unit or settings.get("unit")
    rate = requested(items, unit)
    if rate is None and any(limit.metric == "throughput" for limit in limits):
        raise UsageError("--min-throughput needs --items-per-step N (and --unit frames|tokens|samples|images): "
                         "the items one step handles")
    return rate


def load_config(explicit: str | None) -> tuple[dict[str, Any], Path]:
    """The [tool.tracewhy.check] table and the directory relative paths in it start from."""
    if explicit is not None:
        path = Path(explicit)
        table = _check_table(path)
        if table is None:
            raise UsageError(f"{path}: no [tool.tracewhy.check] table")
        return table, path.resolve().parent
    for folder in (Path.cwd(), *Path.cwd().parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return _check_table(candidate) or {}, folder  # the nearest pyproject.toml decides
    return {}, Path.cwd()


def _check_table(path: Path) -> dict[str, Any] | None:
    # tomllib from Python 3.11 on, the tomli backport before (imported by name so that mypy,
    # set to 3.10, does not need the backport installed on 3.11).
    toml = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
    try:
        data = toml.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror or e})") from None
    except ValueError as e:  # TOMLDecodeError is a ValueError
        raise UsageError(f"{path}: not valid TOML ({e})") from None
    table = data.get("tool", {}).get("tracewhy", {}).get("check")
    if table is not None and not isinstance(table, dict):
        raise UsageError(f"{path}: [tool.tracewhy.check] must be a table")
    return dict(table) if table is not None else None
