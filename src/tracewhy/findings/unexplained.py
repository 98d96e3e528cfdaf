"""``unexplained-part``: a part of the step account that is not essential work, takes a large
share of the step, and that no rule explains. It is reported with what the account knows of it
(its top items), so that no large avoidable part of the step is left out of the diagnosis."""

from __future__ import annotations

from typing import Any, Final

import polars as pl

from tracewhy.analyses.account import AccountCol, AccountResult
from tracewhy.analyses.account_names import PartKind, PartName
from tracewhy.analyses.iterations import WindowSource
from tracewhy.findings.applicability import RunFacts, run_facts
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.findings.source_line import has_stacks
from tracewhy.units import fmt_ns as ms
from tracewhy.units import fmt_pct

#: Items of the part named in the statement (the evidence has the account's top items).
_NAMED_ITEMS: Final = 2

#: Untraced time's items (account_parts: what the thread had open), in words.
_UNTRACED_WHERE: Final = {"nothing open": "with no op or range open", "nothing but the step open":
                          "with only the step's own range open"}

#: What to try first, by the part's kind (the part's own name says where).
_ADVICE: Final = {
    PartKind.HOST: "Move this host work out of the step, make it cheaper, or run it beside the GPU work (a side "
                   "thread, a DataLoader worker); tracewhy lines TRACE shows its source lines.",
    PartKind.SYNC: "Remove the wait or move it out of the loop: tracewhy gaps TRACE shows what the host waited for.",
    PartKind.COPIES: "Copy from pinned memory with non_blocking=True so the copy runs beside compute, or move fewer "
                     "bytes: tracewhy account TRACE lists them.",
    PartKind.COMMUNICATION: "Hide the communication under compute (bucketed, overlapped collectives): tracewhy "
                            "overlap TRACE.",
    PartKind.LAUNCH: "Fewer, larger launches: CUDA graphs or torch.compile(mode='reduce-overhead').",
    PartKind.GPU_GAP: "Fewer, larger launches: CUDA graphs or torch.compile(mode='reduce-overhead').",
}
_DEFAULT_ADVICE: Final = "See what the part is made of: tracewhy account TRACE."


def unexplained_part(ctx: Context, account: AccountResult, row: dict[str, Any]) -> Finding:
    """The finding for one ``parts`` row of the account that no rule's finding claimed."""
    part, kind = str(row[AccountCol.PART]), str(row[AccountCol.KIND])
    ns, share = int(row[AccountCol.NS_PER_STEP]), float(row[AccountCol.SHARE])
    items = account.evidence.filter(pl.col(AccountCol.PART) == part).sort(AccountCol.NS_PER_STEP, descending=True)
    unit = "of the trace's window" if account.source == WindowSource.WHOLE_TRACE else "of the step"
    named = [(item, t) for item, t in items.select(AccountCol.ITEM, AccountCol.NS_PER_STEP).head(
        _NAMED_ITEMS).iter_rows() if item and item not in (part, part.removeprefix("host: "))]
    where = f", most of it {_where(named)}" if named else ""
    what = _describe(part, kind)
    per = "over the trace" if account.source == WindowSource.WHOLE_TRACE else "per step"
    return Finding(
        code=Code.UNEXPLAINED_PART, severity=Severity.MEDIUM,
        statement=f"{fmt_pct(share)} {unit} is {what} ({ms(ns)} {per} on the critical path){where}, and no "
                  "other finding explains it.",
        next_step=_advice(kind, str(items.row(0)[1]) if items.height else "", run_facts(ctx), has_stacks(ctx)),
        part=part,
        evidence={"part": part, "kind": kind, "part_ns_per_step": ns, "share": round(share, 4),
                  "items": [{"item": i, "ns_per_step": t} for i, t in
                            items.select(AccountCol.ITEM, AccountCol.NS_PER_STEP).iter_rows()]},
    )


def _where(named: list[tuple[str, int]]) -> str:
    """'in `a` 1 ms, `b` 2 ms'; untraced time's items say what was open instead ('with no op or
    range open 5 ms')."""
    said: list[str] = []
    for item, t in named:
        words = _UNTRACED_WHERE.get(item)
        if words is None:
            words = f"`{item}`" if said and said[-1].startswith(("in `", "`")) else f"in `{item}`"
        said.append(f"{words} {ms(t)}")
    return ", ".join(said)


def _advice(kind: str, top_item: str, facts: RunFacts, stacks: bool) -> str:
    """What to try first; launch time held by one copy call is that copy's wait, not many launches
    (TraceLens' MI300X decode step: one hipMemcpyAsync holds the host for 7.8 ms). Host work on a
    CPU-only run has no GPU work to hide under, and only a PyTorch program has DataLoader workers.
    Untraced time is looked into with the trace's Python frames where it has them (``lines``),
    else with a capture that records them."""
    if kind == PartKind.IDLE:
        return ("Find what the thread did while nothing was recorded (untraced Python, a sleep, an input wait): "
                + ("tracewhy lines TRACE shows the source lines that ran there." if stacks else
                   "this trace has no Python frames, so capture again with with_stack=True (then tracewhy lines "
                   "TRACE), or py-spy the job."))
    if kind == PartKind.HOST and (facts.cpu_only or not facts.pytorch):
        beside = "beside the step's compute" if facts.cpu_only else "beside the GPU work"
        worker = ", a DataLoader worker" if facts.pytorch else ""
        return (f"Move this host work out of the step, make it cheaper, or run it {beside} (a side thread{worker}); "
                "tracewhy lines TRACE shows its source lines.")
    if kind == PartKind.LAUNCH and "Memcpy" in top_item:
        return (f"The launch time is mostly `{top_item}` calls, a copy the host waits in: copy from pinned memory "
                "with non_blocking=True, or move the copy out of the step; tracewhy gaps TRACE shows what it "
                "waited for.")
    return _ADVICE.get(kind, _DEFAULT_ADVICE)


def _describe(part: str, kind: str) -> str:
    """The part in words: 'host Python in `prep.py:52 tokenize`', 'launch overhead'."""
    if part.startswith("host: "):
        return f"host work in `{part.removeprefix('host: ')}`"
    if part == PartName.UNTRACED:
        return "host time with nothing recorded (untraced Python)"
    if kind == PartKind.HOST:
        return f"host work in `{part}`"
    return f"`{part}`"
