"""Judging two runs of one job: faster, slower or within noise, whether they can be compared at
all, and which findings appeared or disappeared. ``diff`` prints this (``reports/diff.py``
measures both runs); ``check --baseline`` fails on it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl

from tracewhy.analyses.account_diff import ACCOUNT_DELTAS_SCHEMA, account_changes
from tracewhy.analyses.diff import Difference, DiffResult
from tracewhy.findings import thresholds as th
from tracewhy.findings.model import Finding
from tracewhy.rows import Rows
from tracewhy.units import fmt_ns

if TYPE_CHECKING:
    from tracewhy.analyses.account import AccountResult

FASTER = "faster"
SLOWER = "slower"
WITHIN_NOISE = "within noise"
NOT_MEASURED = "not measured"  # a side has no steady steps

#: Differences that make step times incomparable: other hardware, another parallel layout,
#: other units of work, or capture options whose overhead changes the timing itself.
_BREAKING = re.compile(r"^(devices|world_size|step_marker|format|capture\.(with_stack|profile_memory))$")
#: nsys settings that differ between any two sessions and say nothing about the capture.
_PER_SESSION = re.compile(r"SESSION|UUID|UTC|EPOCH|_NS$|^nsys:DERIVED_|RUN_DURATION|PID$")


@dataclass(frozen=True)
class Comparison(Rows, rows="diff.ops", key="name"):
    """``verdict`` is one of faster / slower / within noise / not measured; ``statement`` says it
    with the numbers. ``comparable`` is False when a difference in ``not_comparable_because``
    means the step times measure different things; ``caveats`` are differences worth knowing."""

    diff: DiffResult
    verdict: str
    statement: str
    relative_change: float | None  # Hodges-Lehmann shift / A's median step
    comparable: bool
    not_comparable_because: list[str]
    caveats: list[str]
    findings_compared: bool
    findings_appeared: list[Finding] = field(default_factory=list)
    findings_disappeared: list[Finding] = field(default_factory=list)
    #: Part by part, the step accounts' change (``account_diff.ACCOUNT_DELTAS_SCHEMA``; empty
    #: unless both runs were diagnosed with an account), and each account's mean step.
    account: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=ACCOUNT_DELTAS_SCHEMA))
    account_steps_ns: tuple[int, int] | None = None

    @property
    def compile_statement(self) -> str | None:
        """torch.compile beside the step verdict: "graph breaks per step 0 -> 2 · recompiles 0 -> 1";
        None when neither run has compile markers."""
        c = self.diff.compiled
        if c is None:
            return None
        return (f"graph breaks per step {c.a_graph_breaks_per_step:g} -> {c.b_graph_breaks_per_step:g} · "
                f"recompiles {c.a_recompiles} -> {c.b_recompiles} · "
                f"compiled regions per step {c.a_regions_per_step:g} -> {c.b_regions_per_step:g}")


def judge(d: DiffResult, findings_a: list[Finding] | None = None,
          findings_b: list[Finding] | None = None,
          accounts: tuple[AccountResult | None, AccountResult | None] = (None, None)) -> Comparison:
    verdict, statement, relative = _verdict(d)
    breaking: list[str] = []
    caveats: list[str] = []
    for diff_ in d.differences:
        if _PER_SESSION.search(diff_.what.removeprefix("capture.")):
            continue
        (breaking if _BREAKING.match(diff_.what) else caveats).append(_say(diff_))
    compared = findings_a is not None and findings_b is not None
    appeared: list[Finding] = []
    disappeared: list[Finding] = []
    if findings_a is not None and findings_b is not None:
        codes_a = {f.code for f in findings_a}
        codes_b = {f.code for f in findings_b}
        appeared = [f for f in findings_b if f.code not in codes_a]
        disappeared = [f for f in findings_a if f.code not in codes_b]
    return Comparison(
        diff=d, verdict=verdict, statement=statement, relative_change=relative,
        comparable=not breaking, not_comparable_because=breaking, caveats=caveats,
        findings_compared=compared, findings_appeared=appeared, findings_disappeared=disappeared,
        account=account_changes(*accounts),
        account_steps_ns=(accounts[0].mean_step_ns, accounts[1].mean_step_ns)
        if accounts[0] is not None and accounts[1] is not None else None,
    )


def _verdict_by_totals(d: DiffResult) -> tuple[str, str, float | None]:
    """Neither run has steps: compare what each capture holds in total, GPU kernel time (or, on
    CPU-only runs, CPU op self time), with the caveats that come with totals."""
    what, table = "GPU kernel time", d.kernels
    if table.height == 0 or not (table["a_ns_per_step"].sum() or table["b_ns_per_step"].sum()):
        what, table = "CPU op self time", d.ops
    a = float(table["a_ns_per_step"].sum()) if table.height else 0.0
    b = float(table["b_ns_per_step"].sum()) if table.height else 0.0
    caveat = (f"no step markers in either run: compared over the whole captures ({fmt_ns(d.a.span_ns)} vs "
              f"{fmt_ns(d.b.span_ns)}), not per step and with no confidence interval; the verdict holds only if "
              "both captured the same work (name a repeated block with --step NAME for per-step figures)")
    if a <= 0:
        return NOT_MEASURED, f"{caveat}; run A has no {what} to compare", None
    relative = (b - a) / a
    totals = f"{what} {fmt_ns(a)} -> {fmt_ns(b)} ({relative:+.1%})"
    if abs(relative) >= th.DIFF_TOTALS_MIN_CHANGE:
        verdict = SLOWER if relative > 0 else FASTER
        return verdict, f"B is {verdict}: {totals}; {caveat}", relative
    return (WITHIN_NOISE, f"within noise (under {th.DIFF_TOTALS_MIN_CHANGE:.0%} of A's total): {totals}; {caveat}",
            relative)


def _verdict(d: DiffResult) -> tuple[str, str, float | None]:
    s = d.steps
    if s is None:
        if not d.a_step_durations_ns and not d.b_step_durations_ns:
            return _verdict_by_totals(d)
        side = "A" if not d.a_step_durations_ns else "B"
        return NOT_MEASURED, f"run {side} has no steady steps to compare (use --step NAME)", None
    relative = s.hl_shift_ns / s.a_median_ns if s.a_median_ns > 0 else None
    counts = f"{s.a_count} vs {s.b_count} steady steps"
    medians = f"median step {fmt_ns(s.a_median_ns)} -> {fmt_ns(s.b_median_ns)}"
    shift = f"shift {_signed(s.hl_shift_ns)}" + (f" ({relative:+.1%})" if relative is not None else "")
    if s.ci_low_ns is None or s.ci_high_ns is None:
        return (
            WITHIN_NOISE,
            f"within noise: {counts} cannot give a {s.requested_confidence:.0%} interval; "
            f"{medians}, {shift}; capture more steps",
            relative,
        )
    interval = (f"{s.confidence:.1%} CI [{_signed(s.ci_low_ns)}, {_signed(s.ci_high_ns)}], "
                f"Mann-Whitney p = {s.p_value:.2g}, {counts}")
    excludes_zero = s.ci_low_ns > 0 or s.ci_high_ns < 0
    large_enough = relative is not None and abs(relative) >= th.DIFF_MIN_RELATIVE_CHANGE
    if excludes_zero and large_enough:
        verdict = SLOWER if s.hl_shift_ns > 0 else FASTER
        return verdict, f"B is {verdict}: {medians}, {shift}, {interval}", relative
    why = ("the interval includes zero" if not excludes_zero
           else f"the shift is under {th.DIFF_MIN_RELATIVE_CHANGE:.0%} of A's median step")
    return WITHIN_NOISE, f"within noise ({why}): {medians}, {shift}, {interval}", relative


def _signed(ns: float) -> str:
    return ("+" if ns >= 0 else "-") + fmt_ns(abs(ns))


def _say(d: Difference) -> str:
    return f"{d.what}: {d.a} (A) vs {d.b} (B)"
