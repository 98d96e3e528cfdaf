"""``diff``: the terminal and JSON forms of a run comparison, from a finished DiffReport."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final, TypedDict

import polars as pl

from tracewhy.analyses.account_diff import ACCOUNT_DELTAS_SCHEMA, AccountDeltaCol
from tracewhy.analyses.diff import DELTAS_SCHEMA, OP_DELTAS_SCHEMA, Difference, MemoryChange, RunSummary
from tracewhy.analyses.shift import Shift
from tracewhy.findings.compare import FASTER, SLOWER, Comparison
from tracewhy.findings.model import Finding
from tracewhy.renderers import View
from tracewhy.renderers.layout import FitTable, Layout, label, name, number
from tracewhy.units import fmt_bytes, fmt_ns

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rich.console import RenderableType

    from tracewhy.renderers.json_schema import rows
    from tracewhy.renderers.throughput import ThroughputChangeJson
    from tracewhy.reports.diff import DiffReport


class MemoryChangeJson(TypedDict):
    """One device's allocation peak in each run (null: no memory events for it in that run), and
    its ledger at the peak; ``ledger_change`` is B - A per category (empty when a run lacks the device)."""

    device: str
    a_peak_allocated_bytes: int | None
    b_peak_allocated_bytes: int | None
    peak_change_bytes: int | None
    a_peak_reserved_bytes: int | None
    b_peak_reserved_bytes: int | None
    a_ledger: dict[str, int]
    b_ledger: dict[str, int]
    ledger_change: dict[str, int]
    ledger_source: str


class CompileChangeJson(TypedDict):
    """torch.compile in each run (0 for a run without compile markers), and the sentence."""

    a_graph_breaks_per_step: float
    b_graph_breaks_per_step: float
    a_recompiles: int
    b_recompiles: int
    a_regions_per_step: float
    b_regions_per_step: float
    statement: str | None


class FindingsChange(TypedDict):
    """Finding codes in B and not A (appeared) and in A and not B (disappeared)."""

    #: Whether both runs were diagnosed.
    compared: bool
    appeared: list[Finding]
    disappeared: list[Finding]


class DiffPayload(TypedDict):
    """``diff``: run B against baseline A: faster, slower or within noise, and what changed."""

    #: "faster", "slower", "within noise" or "not measured".
    verdict: str
    statement: str
    #: The Hodges-Lehmann shift over A's median step.
    relative_change: float | None
    comparable: bool
    not_comparable_because: list[str]
    caveats: list[str]
    a: RunSummary
    b: RunSummary
    #: B's steady step times against A's; null when either run has no steady steps.
    steps: Shift | None
    a_step_durations_ns: list[int]
    b_step_durations_ns: list[int]
    differences: list[Difference]
    #: Each run's step account's mean step (null unless both runs have an account).
    a_account_step_ns: int | None
    b_account_step_ns: int | None
    account: Annotated[pl.DataFrame, rows(ACCOUNT_DELTAS_SCHEMA, "per part of the step accounts: ns per analysed step "
                                                                 "in each run and B - A, largest change first")]
    ops: Annotated[pl.DataFrame, rows(OP_DELTAS_SCHEMA, "per operator: CPU self and GPU time per steady step, "
                                                        "largest change first")]
    annotations: Annotated[pl.DataFrame, rows(DELTAS_SCHEMA, "per annotated block, largest change first")]
    kernels: Annotated[pl.DataFrame, rows(DELTAS_SCHEMA, "per kernel name, largest change first")]
    memory: list[MemoryChangeJson]
    compile: CompileChangeJson | None
    findings: FindingsChange


class DiffThroughputPayload(DiffPayload):
    """``diff --items-per-step N``: with A's and B's throughput and the change."""

    throughput: ThroughputChangeJson


_STYLE = {SLOWER: "bold red", FASTER: "bold green"}


def diff_output(r: DiffReport, top: int) -> tuple[Mapping[str, Any], View]:
    """The payload and the view of ``diff``: the comparison, and the throughput change after the
    verdict when it was asked for."""
    from tracewhy.renderers.throughput import with_throughput_change

    c = r.comparison
    payload: Mapping[str, Any]
    payload, view = comparison_payload(c), lambda: render_comparison(c, top)
    if r.rate is not None:
        payload, view = with_throughput_change(payload, view, r.rate, r.throughput_a, r.throughput_b,
                                               after=c.statement)
    return payload, view


def comparison_payload(c: Comparison) -> DiffPayload:
    """The ``--json`` document of ``diff`` (all rows; the terminal shows the top ones)."""
    d = c.diff
    return {
        "verdict": c.verdict,
        "statement": c.statement,
        "relative_change": c.relative_change,
        "comparable": c.comparable,
        "not_comparable_because": c.not_comparable_because,
        "caveats": c.caveats,
        "a": d.a,
        "b": d.b,
        "steps": d.steps,
        "a_step_durations_ns": d.a_step_durations_ns,
        "b_step_durations_ns": d.b_step_durations_ns,
        "differences": d.differences,
        "a_account_step_ns": c.account_steps_ns[0] if c.account_steps_ns else None,
        "b_account_step_ns": c.account_steps_ns[1] if c.account_steps_ns else None,
        "account": c.account,
        "ops": d.ops,
        "annotations": d.annotations,
        "kernels": d.kernels,
        "memory": [_memory_payload(m) for m in d.memory],
        "compile": None if d.compiled is None else _compile_change(c),
        "findings": {
            "compared": c.findings_compared,
            "appeared": c.findings_appeared,
            "disappeared": c.findings_disappeared,
        },
    }


def render_comparison(c: Comparison, top: int) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    d = c.diff
    parts: list[RenderableType] = [
        Text(f"A: {d.a.path}\nB: {d.b.path}"),
        Text(c.statement, style=_STYLE.get(c.verdict, "bold")),
    ]
    if c.compile_statement is not None:
        parts.append(Text(f"torch.compile: {c.compile_statement}", style="bold"))
    if not c.comparable:
        parts.append(Text("not comparable: " + "; ".join(c.not_comparable_because), style="yellow"))
    for caveat in c.caveats:
        parts.append(Text(f"note: {caveat}", style="dim"))
    if c.account.height and c.account_steps_ns is not None:
        parts += [Text(_account_sentence(c.account, *c.account_steps_ns)), _account_table(c.account, top)]
    for title, table, gpu in (("operators (CPU self time)", d.ops, True),
                              ("annotated blocks", d.annotations, False),
                              ("kernels", d.kernels, False)):
        if table.height:
            has_gpu = gpu and bool(table.select(pl.col("a_gpu_ns_per_step").abs().sum()
                                                + pl.col("b_gpu_ns_per_step").abs().sum()).item())
            parts.append(_delta_table(title, table, top, has_gpu))
    if d.memory:
        parts.append(_memory_table(d.memory))
    if c.findings_compared:
        for label, found in (("appeared", c.findings_appeared), ("disappeared", c.findings_disappeared)):
            for f in found:
                parts.append(Text(f"finding {label}: [{f.code}] {f.statement}"))
        if not (c.findings_appeared or c.findings_disappeared):
            parts.append(Text("findings: the same codes in both runs"))
    return Group(*parts)


def _compile_change(c: Comparison) -> CompileChangeJson:
    k = c.diff.compiled
    assert k is not None
    return {"a_graph_breaks_per_step": k.a_graph_breaks_per_step, "b_graph_breaks_per_step": k.b_graph_breaks_per_step,
            "a_recompiles": k.a_recompiles, "b_recompiles": k.b_recompiles, "a_regions_per_step": k.a_regions_per_step,
            "b_regions_per_step": k.b_regions_per_step, "statement": c.compile_statement}


def _memory_payload(m: MemoryChange) -> MemoryChangeJson:
    return {"device": m.device, "a_peak_allocated_bytes": m.a_peak_allocated_bytes,
            "b_peak_allocated_bytes": m.b_peak_allocated_bytes, "peak_change_bytes": m.peak_change_bytes,
            "a_peak_reserved_bytes": m.a_peak_reserved_bytes, "b_peak_reserved_bytes": m.b_peak_reserved_bytes,
            "a_ledger": m.a_ledger, "b_ledger": m.b_ledger, "ledger_change": m.ledger_change,
            "ledger_source": m.ledger_source}


#: ``diff``: memory at the peak, per device and ledger category, in A and B.
MEMORY_CHANGE_TABLE: Final = Layout((label("device"), label("what"), number("A"), number("B"), number("B - A")))


def _memory_table(changes: list[MemoryChange]) -> FitTable:
    """Per device: the allocation peak, then each ledger category at it that either run holds."""
    t = MEMORY_CHANGE_TABLE.table(f"memory at the allocation peak (ledger {changes[0].ledger_source})")
    for m in changes:
        t.add_row(m.device, "peak allocated", fmt_bytes(m.a_peak_allocated_bytes),
                  fmt_bytes(m.b_peak_allocated_bytes), _signed_bytes(m.peak_change_bytes))
        change = m.ledger_change
        rows = [(k, m.a_ledger.get(k), m.b_ledger.get(k)) for k in {*m.a_ledger, *m.b_ledger}]
        for category, a, b in sorted(rows, key=lambda r: (-abs(change.get(r[0], 0)), -(r[1] or 0) - (r[2] or 0))):
            if a or b:
                t.add_row("", f"  {category}", fmt_bytes(a), fmt_bytes(b), _signed_bytes(change.get(category)))
    return t


def _signed_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    return ("+" if n > 0 else "-" if n < 0 else "") + fmt_bytes(abs(n))


#: ``diff``: ops, blocks or kernels per steady step in A and B; the changes stay, the call counts
#: and then the times they are the difference of leave a narrow terminal first.
DELTA_TABLE: Final = Layout(
    (name("name"), number("calls A"), number("calls B"), number("A"), number("B"), number("B - A"),
     number("GPU A"), number("GPU B"), number("GPU B - A")),
    drop=("calls A", "calls B", "GPU A", "GPU B", "A", "B"))
ACCOUNT_TABLE: Final = Layout((name("part"), label("kind"), number("A"), number("B"), number("B - A")),
                              drop=("kind", "A", "B"))


def _account_sentence(changes: pl.DataFrame, a_ns: int, b_ns: int) -> str:
    """The parts that carry the change, largest first: up to three, each after the first only
    when it moved a tenth of the mean step's change or more."""
    total = b_ns - a_ns
    named: list[str] = []
    for row in changes.head(3).iter_rows(named=True):
        delta = row[AccountDeltaCol.DELTA]
        if named and abs(delta) < 0.1 * abs(total):
            break
        named.append(f"{row[AccountDeltaCol.PART]} {fmt_ns(row[AccountDeltaCol.A])} -> "
                     f"{fmt_ns(row[AccountDeltaCol.B])} ({_signed(delta)})")
    return (f"Where the step changed (step account, mean analysed step {fmt_ns(a_ns)} -> {fmt_ns(b_ns)}, "
            f"{_signed(total)}): " + ", ".join(named) + ".")


def _account_table(changes: pl.DataFrame, top: int) -> FitTable:
    t = ACCOUNT_TABLE.table("step account: per analysed step, largest change first")
    for row in changes.head(top).iter_rows(named=True):
        t.add_row(row[AccountDeltaCol.PART], row[AccountDeltaCol.KIND], fmt_ns(row[AccountDeltaCol.A]),
                  fmt_ns(row[AccountDeltaCol.B]), _signed(row[AccountDeltaCol.DELTA]))
    return t


def _delta_table(title: str, table: pl.DataFrame, top: int, gpu: bool) -> FitTable:
    t = DELTA_TABLE.table(f"{title}: per steady step, largest change first",
                          omit=() if gpu else ("GPU A", "GPU B", "GPU B - A"))
    for row in table.head(top).iter_rows(named=True):
        cells = [row["name"], f"{row['a_calls_per_step']:g}", f"{row['b_calls_per_step']:g}",
                 fmt_ns(row["a_ns_per_step"]), fmt_ns(row["b_ns_per_step"]), _signed(row["delta_ns_per_step"])]
        if gpu:
            cells += [fmt_ns(row["a_gpu_ns_per_step"]), fmt_ns(row["b_gpu_ns_per_step"]),
                      _signed(row["delta_gpu_ns_per_step"])]
        t.add_row(*cells)
    return t


def _signed(ns: float) -> str:
    return ("+" if ns > 0 else "-" if ns < 0 else "") + fmt_ns(abs(ns))
