"""Where the step goes: the step account's largest parts as ``diagnose`` and ``account`` open
with them (enough to cover ACCOUNT_COVER_SHARE of the step, at most ACCOUNT_MAX_LINES, the rest
summed), each with its one line of evidence; and the words for a step whose largest parts are
essential work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

from tracewhy.analyses.account import AccountCol, AccountResult
from tracewhy.analyses.account_names import PartKind, PartName
from tracewhy.findings import thresholds as th
from tracewhy.units import fmt_bytes, fmt_pct, printable
from tracewhy.units import fmt_ns as ms

#: The ``kind`` of the line that sums the parts not listed.
REST_KIND: Final = "rest"
#: The kinds of part that are GPU time on the path.
GPU_PART_KINDS: Final = (PartKind.KERNELS, PartKind.COPIES, PartKind.COMMUNICATION)
#: Items of a part its evidence line names.
_EVIDENCE_ITEMS: Final = 2
#: Characters of an item's name in an evidence line (kernel names run to hundreds).
_ITEM_CHARS: Final = 60


@dataclass(frozen=True)
class AccountLine:
    """One line of where the step goes: a part, or (kind ``rest``) the parts not listed summed."""

    part: str
    kind: str
    ns_per_step: int
    share: float
    essential: bool
    evidence: str


def account_lines(account: AccountResult) -> list[AccountLine]:
    """The largest parts until they cover ACCOUNT_COVER_SHARE of the step (at most
    ACCOUNT_MAX_LINES lines, the last of them the rest summed when parts are left)."""
    rows = [(str(part), str(kind), int(ns), float(share), bool(essential)) for part, kind, ns, share, essential in
            account.parts.select(AccountCol.PART, AccountCol.KIND, AccountCol.NS_PER_STEP, AccountCol.SHARE,
                                 AccountCol.ESSENTIAL).iter_rows()]
    room = th.ACCOUNT_MAX_LINES if len(rows) <= th.ACCOUNT_MAX_LINES else th.ACCOUNT_MAX_LINES - 1
    shown = 0
    covered = 0.0
    while shown < min(room, len(rows)) and covered < th.ACCOUNT_COVER_SHARE:
        covered += rows[shown][3]
        shown += 1
    out = [AccountLine(part, kind, ns, share, essential, part_evidence(account, part))
           for part, kind, ns, share, essential in rows[:shown]]
    rest = rows[shown:]
    if rest:
        largest = ", ".join(r[0] for r in rest[:3])
        out.append(AccountLine(part=f"{len(rest)} more parts", kind=REST_KIND, ns_per_step=sum(r[2] for r in rest),
                               share=sum(r[3] for r in rest), essential=all(r[4] for r in rest),
                               evidence=f"largest: {largest}"))
    return out


def part_evidence(account: AccountResult, part: str) -> str:
    """One line: the part's top items with their time, and for copies their bytes and bandwidth."""
    items = account.evidence.filter(pl.col(AccountCol.PART) == part).sort(AccountCol.NS_PER_STEP, descending=True)
    if items.height == 0:
        return ""
    said = []
    for item, ns, count, moved, rate in items.select(
            AccountCol.ITEM, AccountCol.NS_PER_STEP, AccountCol.COUNT_PER_STEP, AccountCol.BYTES_PER_STEP,
            AccountCol.GB_PER_S).head(_EVIDENCE_ITEMS).iter_rows():
        name = printable(str(item))
        name = name if len(name) <= _ITEM_CHARS else name[:_ITEM_CHARS - 1] + "…"
        text = f"{name} {ms(ns)}"
        if count:  # per step: a slice open over several steps (a frame running at start) is under 1
            text += f" ({count:,.0f}x" if count >= 0.5 else f" ({count:.2g}x"
            text += f", {fmt_bytes(moved)} at {rate:.1f} GB/s)" if moved and rate else ")"
        said.append(text)
    more = items.height - len(said)
    return "; ".join(said) + (f"; {more} more" if more > 0 else "")


def essential_summary(account: AccountResult) -> str | None:
    """'82% of the step is essential work: kernels: gemm 44%, kernels: attention 4.1% ...' when
    the step's largest parts are essential and no avoidable part reaches UNEXPLAINED_PART_MIN_SHARE
    (None otherwise: the step is not healthy by the account). When the window begins with GPU
    work the trace did not record, the shares are of the GPU's time on the path instead: the
    unrecorded wait is no part of the step's work."""
    parts = account.parts.filter((pl.col(AccountCol.KIND) != PartKind.UNEXPLAINED)
                                 & (pl.col(AccountCol.PART) != PartName.UNRECORDED_GPU))
    if parts.height == 0 or not bool(parts.row(0, named=True)[AccountCol.ESSENTIAL]):
        return None
    if account.avoidable_parts().filter(pl.col(AccountCol.SHARE) >= th.UNEXPLAINED_PART_MIN_SHARE).height:
        return None
    essential = parts.filter(pl.col(AccountCol.ESSENTIAL))
    whole, of = account.mean_step_ns, "of the step"
    if account.unrecorded is not None:
        gpu = parts.filter(pl.col(AccountCol.KIND).is_in(GPU_PART_KINDS))
        whole = int(gpu.get_column(AccountCol.NS_PER_STEP).sum())
        of = f"of the GPU's {ms(whole)} on the path (from its first recorded work)"
    total = int(essential.get_column(AccountCol.NS_PER_STEP).sum())
    named = ", ".join(f"{p} {fmt_pct(ns / max(whole, 1))}" for p, ns in essential.select(
        AccountCol.PART, AccountCol.NS_PER_STEP).head(3).iter_rows())
    return f"{fmt_pct(min(total / max(whole, 1), 1.0))} {of} is essential work ({named})"


def avoidable_over_line(account: AccountResult) -> bool:
    """Some avoidable part takes UNEXPLAINED_PART_MIN_SHARE of the step or more."""
    return bool(account.avoidable_parts().filter(pl.col(AccountCol.SHARE) >= th.UNEXPLAINED_PART_MIN_SHARE).height)
