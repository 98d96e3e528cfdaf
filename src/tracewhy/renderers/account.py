"""``account`` output: where the step goes, as the JSON payload (the lines ``diagnose`` opens
with, every part, each analysed step's parts and the items behind each part) and the terminal
tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final, TypedDict

import polars as pl

from tracewhy.analyses.account import (
    ACCOUNT_EVIDENCE_SCHEMA,
    ACCOUNT_PARTS_SCHEMA,
    ACCOUNT_PER_STEP_SCHEMA,
    ACCOUNT_WINDOWS_SCHEMA,
    AccountCol,
)
from tracewhy.analyses.account_names import PartName
from tracewhy.renderers.layout import Layout, label, name, number, step
from tracewhy.units import fmt_bytes, fmt_ns, fmt_pct, printable

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tracewhy.analyses.account import AccountResult
    from tracewhy.analyses.account_classes import PARTS_BY_CLASS_SCHEMA
    from tracewhy.findings.where_step_goes import AccountLine
    from tracewhy.renderers.json_schema import rows
    from tracewhy.renderers.mfu import MfuJson
    from tracewhy.renderers.step_classes import InferenceJson
    from tracewhy.reports.account import AccountReport


class AccountLineJson(TypedDict):
    """One line of where the step goes: a part of the step account, or (kind ``rest``) the parts
    not listed, summed."""

    part: str
    #: The part's kind (kernels, copies, communication, host, sync, ...), or ``rest``.
    kind: str
    #: Mean per analysed step (over the trace's window without steps).
    ns_per_step: int
    #: Of the mean step.
    share: float
    #: Work the step must do (compute kernels, device-side copies); false: time it could lose.
    essential: bool
    #: The part's top items with their time (copies: bytes and bandwidth).
    evidence: str


class AccountPayload(TypedDict):
    """``account``: where the step goes. Each analysed step's critical path split into named
    parts that add up to the step; ``parts`` are means over the analysed steps."""

    trace: str
    #: What the windows are: "steps", "iterations" (DataLoader fetches or optimizer steps) or "whole_trace".
    source: str
    #: The step marker or the iteration's anchor.
    marker: str
    #: The mean analysed step.
    mean_step_ns: int
    steps_found: int
    steps_steady: int
    steps_analysed: int
    #: The share of the mean step the account names (everything but ``unexplained``).
    named_share: float
    #: What the windows rest on, when worth saying (no steps, several processes, steps left out).
    note: str | None
    #: The lines ``diagnose`` opens with: the largest parts to 80% of the step, the rest summed.
    lines: list[AccountLineJson]
    parts: Annotated[pl.DataFrame, rows(ACCOUNT_PARTS_SCHEMA, "every part, largest first; they add up to the step")]
    windows: Annotated[pl.DataFrame, rows(ACCOUNT_WINDOWS_SCHEMA, "the analysed steps")]
    per_step: Annotated[pl.DataFrame, rows(ACCOUNT_PER_STEP_SCHEMA, "each analysed step's parts")]
    evidence: Annotated[pl.DataFrame, rows(ACCOUNT_EVIDENCE_SCHEMA, "per part, the items behind it")]
    #: Each step's and region's model FLOPs utilization; null when it was not measured.
    mfu: MfuJson | None


class AccountInferencePayload(AccountPayload, total=False):
    """``account`` of an inference trace (steps classed prefill, decode or mixed): the same, with
    the steps by class and the parts per class (means over the analysed steps of each class)."""

    inference: InferenceJson
    parts_by_class: Annotated[pl.DataFrame, rows(PARTS_BY_CLASS_SCHEMA, "per class, its parts, largest first")]


class ReportAccountStep(TypedDict):
    """One analysed step of the report's account: its window and its parts (ns each)."""

    step: int
    number: int | None
    steady: bool
    window_ns: int
    parts: dict[str, int]


class ReportAccount(TypedDict):
    """The report's "Where the step goes" section: the lines ``diagnose`` opens with, every part
    (its kind colours it), and one stacked bar per analysed step."""

    source: str
    marker: str
    mean_step_ns: int
    note: str | None
    lines: list[AccountLineJson]
    parts: Annotated[pl.DataFrame, rows(ACCOUNT_PARTS_SCHEMA, "every part, largest first")]
    steps: list[ReportAccountStep]


def account_report_payload(a: AccountResult, lines: list[AccountLine]) -> ReportAccount:
    """The report's section: each analysed step's parts as a stacked bar, the parts and the lines."""
    by_step: dict[int, dict[str, int]] = {}
    for step_, part, ns in a.per_step.select(AccountCol.STEP, AccountCol.PART, AccountCol.NS).iter_rows():
        by_step.setdefault(step_, {})[part] = by_step.get(step_, {}).get(part, 0) + ns
    steps = [{"step": s, "number": n, "steady": bool(st), "window_ns": w, "parts": by_step.get(s, {})}
             for s, n, st, w in a.windows.select(AccountCol.STEP, AccountCol.NUMBER, AccountCol.STEADY,
                                                 AccountCol.WINDOW).iter_rows()]
    return {"source": a.source, "marker": a.marker, "mean_step_ns": a.mean_step_ns, "note": a.note,
            "lines": [account_line_json(x) for x in lines], "parts": a.parts,
            "steps": steps}  # type: ignore[typeddict-item]


def account_line_json(a: AccountLine) -> AccountLineJson:
    return {"part": a.part, "kind": a.kind, "ns_per_step": a.ns_per_step, "share": round(a.share, 4),
            "essential": a.essential, "evidence": a.evidence}


def account_payload(r: AccountReport) -> AccountInferencePayload:
    from tracewhy.renderers.mfu import mfu_json

    a = r.account
    doc: AccountInferencePayload = {
        "trace": r.path, "source": a.source, "marker": a.marker, "mean_step_ns": a.mean_step_ns,
        "steps_found": a.steps_found, "steps_steady": a.steps_steady, "steps_analysed": a.steps_analysed,
        "named_share": round(a.named_share, 4), "note": a.note, "lines": [account_line_json(x) for x in r.lines],
        "parts": a.parts, "windows": a.windows, "per_step": a.per_step, "evidence": a.evidence,
        "mfu": mfu_json(r.mfu) if r.mfu is not None else None,
    }
    if r.classes is not None and r.parts_by_class is not None:
        from tracewhy.renderers.step_classes import inference_json

        doc["inference"] = inference_json(r.classes, r.decode)
        doc["parts_by_class"] = r.parts_by_class
    return doc


PARTS: Final = Layout((name("part"), label("kind"), number("per step"), number("share"), label("essential"),
                       name("evidence")), drop=("evidence", "kind"))
PER_STEP: Final = Layout((step("step"), number("window"), name("largest part"), number("its time"),
                          number("share")), drop=())
EVIDENCE: Final = Layout((name("part"), name("item"), number("per step"), number("count"), number("bytes"),
                          number("GB/s")), drop=("bytes", "GB/s", "count"))
#: Items per part in the evidence table (``--json`` has all the account keeps).
EVIDENCE_ITEMS: Final = 3


def render_account(r: AccountReport, top: int) -> RenderableType:
    """The parts (the ``top`` largest), each analysed step's largest part, and the items behind
    the parts listed."""
    from rich.console import Group
    from rich.text import Text

    from tracewhy.renderers.mfu import mfu_line

    a = r.account
    if a.parts.height == 0:
        note = printable(a.note or "nothing to account for")
        return Group(Text(printable(r.path), style="bold"), Text(f"note: {note}", style="yellow"))
    over = ("the whole trace" if a.source == "whole_trace" else
            f"mean of {a.steps_analysed} analysed of {a.steps_steady} steady {a.source} ({a.marker})")
    out: list[RenderableType] = [Text(f"{printable(r.path)}\n", style="bold"),
                                 Text(f"Where the step goes ({over}, {fmt_ns(a.mean_step_ns)}; "
                                      f"{fmt_pct(a.named_share)} named):")]
    for line in r.lines:
        what = "" if line.kind == "rest" else ("essential" if line.essential else "avoidable"
                                                if line.part != PartName.UNRECORDED_GPU else "unrecorded")
        out.append(Text(f"  {fmt_pct(line.share):>6}  {fmt_ns(line.ns_per_step):>11}  {printable(line.part)}  {what}"))
    mfu = mfu_line(r.mfu) if r.mfu is not None else None
    if mfu:
        out.append(Text(mfu))
    parts = PARTS.table("parts, largest first")
    columns = (AccountCol.PART, AccountCol.KIND, AccountCol.NS_PER_STEP, AccountCol.SHARE, AccountCol.ESSENTIAL)
    for part, kind, ns, share, essential in a.parts.head(top).select(*columns).iter_rows():
        parts.add_row(part, kind, fmt_ns(ns), fmt_pct(share), "yes" if essential else "no",
                      _evidence_line(r, part))
    out.append(parts)
    if a.windows.height > 1:
        out.append(_per_step(r, top))
    listed = a.parts.head(top).get_column(AccountCol.PART).to_list()
    ev = EVIDENCE.table("the items behind each part (per step)")
    for part in listed:
        items = a.evidence.filter(pl.col(AccountCol.PART) == part).sort(AccountCol.NS_PER_STEP, descending=True)
        for item, ns, count, moved, rate in items.head(EVIDENCE_ITEMS).select(
                AccountCol.ITEM, AccountCol.NS_PER_STEP, AccountCol.COUNT_PER_STEP, AccountCol.BYTES_PER_STEP,
                AccountCol.GB_PER_S).iter_rows():
            ev.add_row(part, item, fmt_ns(ns), f"{count:,.1f}" if count is not None else None,
                       fmt_bytes(moved) if moved is not None else None, f"{rate:.1f}" if rate is not None else None)
    out.append(ev)
    if r.classes is not None and r.parts_by_class is not None:
        from tracewhy.renderers.step_classes import render_classes, render_parts_by_class

        out += [render_classes(r.classes, r.decode), render_parts_by_class(r.parts_by_class)]
    if a.note:
        out.append(Text(f"note: {printable(a.note)}", style="yellow"))
    return Group(*out)


def _evidence_line(r: AccountReport, part: str) -> str:
    from tracewhy.findings.where_step_goes import part_evidence

    return part_evidence(r.account, part)


def _per_step(r: AccountReport, top: int) -> RenderableType:
    """Each analysed step: its window and its largest part."""
    a = r.account
    t = PER_STEP.table("each analysed step's largest part")
    largest = a.per_step.sort(AccountCol.NS, descending=True).group_by(AccountCol.STEP, maintain_order=True).first()
    joined = a.windows.join(largest, on=AccountCol.STEP, how="left").sort(AccountCol.STEP)
    for number_, window, part, ns in joined.head(top).select(
            AccountCol.NUMBER, AccountCol.WINDOW, AccountCol.PART, AccountCol.NS).iter_rows():
        t.add_row(f"{a.marker}#{number_}", fmt_ns(window), part, fmt_ns(ns) if ns is not None else None,
                  fmt_pct(ns / window) if ns is not None and window else None)
    return t
