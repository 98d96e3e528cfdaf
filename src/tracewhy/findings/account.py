"""Findings read off the step account (``analyses.account``): a step bound by host-device copies
(``copy-bound``, with their bytes, bandwidth against the link's peak and host memory kind), and
the words that name a part and its evidence, which the other findings and ``diagnose`` share."""

from __future__ import annotations

from typing import Final

import msgspec
import polars as pl

from tracewhy.analyses.account import AccountCol, AccountResult
from tracewhy.analyses.account_names import PartKind
from tracewhy.analyses.iterations import WindowSource
from tracewhy.analyses.peaks import COMMON_HOST_LINKS, host_link
from tracewhy.findings import thresholds as th
from tracewhy.findings.applicability import RunFacts, pinned_copy_advice, run_facts
from tracewhy.findings.basis import basis, busy_parts, busy_phrase
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.essential_work import essential_work
from tracewhy.findings.model import Finding, Severity
from tracewhy.model.schema import DeviceCol
from tracewhy.units import fmt_bytes, fmt_pct
from tracewhy.units import fmt_ns as ms

#: Host-device directions: a copy the host takes part in (DtoD and memsets stay on the device).
HOST_DIRECTIONS: Final = ("HtoD", "DtoH")


class CopyPart(msgspec.Struct, frozen=True):
    """One part of host-device copies on the path, with what its copies moved."""

    part: str
    direction: str
    memory: str  # "pinned", "pageable", or "" where the trace does not say
    ns_per_step: int
    share: float
    bytes_per_step: int
    copies_per_step: float
    bytes_per_s: float | None  # over the copies' own durations


def copy_parts(account: AccountResult) -> list[CopyPart]:
    """The account's host-device copy parts (``copies: HtoD pinned`` ...), largest first."""
    out = []
    rows = account.parts.filter((pl.col(AccountCol.KIND) == PartKind.COPIES) & ~pl.col(AccountCol.ESSENTIAL))
    for part, ns, share in rows.select(AccountCol.PART, AccountCol.NS_PER_STEP, AccountCol.SHARE).iter_rows():
        words = str(part).removeprefix("copies: ").split(" ")
        if words[0] not in HOST_DIRECTIONS:
            continue
        ev = account.evidence.filter(pl.col(AccountCol.PART) == part)
        moved = int(ev.get_column(AccountCol.BYTES_PER_STEP).fill_null(0).sum())
        # Each item's bytes over its bandwidth is its copies' time: the part's bandwidth is the
        # bytes over that time summed, not a mean of the items' rates.
        timed = ev.filter(pl.col(AccountCol.GB_PER_S) > 0)
        busy = float((timed.get_column(AccountCol.BYTES_PER_STEP) / timed.get_column(AccountCol.GB_PER_S)).sum()) \
            if timed.height else 0.0
        out.append(CopyPart(part=str(part), direction=words[0], memory=words[1] if len(words) > 1 else "",
                            ns_per_step=int(ns), share=float(share), bytes_per_step=moved,
                            copies_per_step=float(ev.get_column(AccountCol.COUNT_PER_STEP).sum()),
                            bytes_per_s=moved / busy * 1e9 if busy > 0 else None))
    return out


def findings(ctx: Context) -> list[Finding]:
    account = ctx.account()
    if account is None:
        return []
    return [f for f in (_copy_bound(ctx, account), _gpu_work_before_trace(account), essential_work(ctx, account))
            if f is not None]


def _gpu_work_before_trace(account: AccountResult) -> Finding | None:
    """A launch delay on the path the trace cannot explain (its own part, ``idle: GPU work before
    the trace``): said as a limit of the capture, with both explanations, never as host advice."""
    u = account.unrecorded
    if u is None:
        return None
    gpu_window = u.window_end_ns - u.first_gpu_ns
    return Finding(
        code=Code.GPU_WORK_BEFORE_TRACE, severity=Severity.TRUST,
        statement=f"The window begins with GPU work the trace did not record: `{u.call}` was issued "
                  f"{ms(u.first_gpu_ns - u.launch_ns)} before GPU {u.device}'s first recorded work and waited "
                  f"{ms(u.waited_ns)} to start. Either the GPU was still running work "
                  "queued before the capture began (an inference server runs ahead of the GPU), or the host and GPU "
                  "clocks are offset; it is not launch overhead and no host-side change removes it. GPU-side figures "
                  f"run from the GPU's first recorded work ({ms(gpu_window)} to the window's end).",
        next_step="Start the capture after torch.cuda.synchronize() (or after a schedule's warm-up step) so that "
                  "the window holds the GPU work the first launch waits for.",
        part=None,
        evidence={"device": u.device, "call": u.call, "launch_ns": u.launch_ns, "waited_ns": u.waited_ns,
                  "first_gpu_ns": u.first_gpu_ns, "gpu_window_ns": gpu_window},
    )


def _copy_bound(ctx: Context, account: AccountResult) -> Finding | None:
    """Host-device copies on the path from COPY_BOUND_MIN_SHARE of the step: what they move, how
    fast against the link's one-way peak, from which host memory, and what a fix can change."""
    parts = copy_parts(account)
    total = sum(p.ns_per_step for p in parts)
    share = total / account.mean_step_ns
    if not parts or share < th.COPY_BOUND_MIN_SHARE:
        return None
    b = basis(ctx)
    device = _device_name(ctx, b.device)
    link = host_link(device)
    unit = "over the trace" if account.source == WindowSource.WHOLE_TRACE else "per step"
    lines = []
    # Copies under COPY_LINE_MIN_SHARE of the copy time are left out of the sentence (the evidence has them).
    for p in [p for p in parts if p.ns_per_step >= th.COPY_LINE_MIN_SHARE * total] or parts[:1]:
        rate = ""
        if p.bytes_per_s is not None:
            rate = f" at {p.bytes_per_s / 1e9:.1f} GB/s"
            rate += (f" ({fmt_pct(p.bytes_per_s / link.bytes_per_s)} of {link.name}'s {link.bytes_per_s / 1e9:.0f} "
                     "GB/s one way)" if link is not None else "")
        memory = f" from {p.memory} memory" if p.direction == "HtoD" and p.memory else \
            f" to {p.memory} memory" if p.memory else ""
        lines.append(f"{p.direction}{memory} {ms(p.ns_per_step)}, {fmt_bytes(p.bytes_per_step)} in "
                     f"{p.copies_per_step:,.0f} copies{rate}")
    largest = account.parts.row(0, named=True)
    lead = "The step is copy-bound: host-device copies take" if largest[AccountCol.PART] == parts[0].part else \
        "Host-device copies take"
    split = busy_parts(ctx)
    busy = f" GPU {b.device} is busy {b.of_window(b.busy_ns)}: {busy_phrase(b, split)}." if split else ""
    peak = "" if link is not None else _unknown_link(device, parts[0].bytes_per_s)
    return Finding(
        code=Code.COPY_BOUND, severity=Severity.HIGH,
        statement=f"{lead} {fmt_pct(share)} of its critical path ({ms(total)} {unit}): {'; '.join(lines)}."
                  f"{busy}{peak}",
        next_step=_copy_advice(parts, total, link.bytes_per_s if link is not None else None, unit, run_facts(ctx)),
        part=parts[0].part,
        evidence={"part_ns_per_step": total, "share": round(share, 4), "device": b.device, "device_name": device,
                  "link": link.name if link is not None else None,
                  "link_bytes_per_s": link.bytes_per_s if link is not None else None,
                  "busy_by_kind_ns": split,
                  "copies": [{"part": p.part, "direction": p.direction, "memory": p.memory,
                              "ns_per_step": p.ns_per_step, "bytes_per_step": p.bytes_per_step,
                              "copies_per_step": round(p.copies_per_step, 2), "bytes_per_s": p.bytes_per_s}
                             for p in parts]},
    )


def _unknown_link(device: str | None, bytes_per_s: float | None) -> str:
    """With no link known for the device, the largest copy's rate set beside the common host links'
    one-way peaks, so that the reader can place it on the link the machine has."""
    known = " The trace names no GPU" if not device else f" No host link is known for {device}"
    if bytes_per_s is None:
        return f"{known}, so the copies' bandwidth is not compared with a link's peak."
    beside = " and ".join(f"{fmt_pct(bytes_per_s / link.bytes_per_s)} of {link.name}'s "
                          f"{link.bytes_per_s / 1e9:.0f} GB/s" for link in COMMON_HOST_LINKS)
    return f"{known}: {bytes_per_s / 1e9:.1f} GB/s is {beside} one way."


def _copy_advice(parts: list[CopyPart], total: int, peak: float | None, unit: str, facts: RunFacts) -> str:
    """What to change, from what the copies are: pageable memory first (when most of the copy
    time is); pinned copies near the link's peak can only move fewer bytes; below it, they are
    too small or wait on each other."""
    pageable = sum(p.ns_per_step for p in parts if p.memory == "pageable")
    if pageable * 2 >= total:
        return (pinned_copy_advice(facts) + ", so the copies run at the link's speed and beside compute; then "
                "move fewer bytes per step.")
    top = parts[0]
    size = top.bytes_per_step / top.copies_per_step if top.copies_per_step else 0.0
    fast = top.bytes_per_s is not None and peak is not None and top.bytes_per_s >= th.COPY_NEAR_LINK_PEAK * peak
    what = (f"{top.copies_per_step:,.0f} {top.direction} copies of {fmt_bytes(round(size))} each {unit}" if size
            else f"the {top.direction} copies")
    if fast:
        return (f"The copies already use {top.memory or 'their'} memory near the link's peak, so only fewer bytes "
                f"help: keep what {what} bring on the GPU across steps (weights, constant inputs), or copy in a "
                "smaller dtype; tracewhy account TRACE lists them.")
    return (f"Move fewer bytes ({what}): keep on the GPU what is copied again every step, copy in a smaller dtype, or "
            "batch small copies into one; copy on a side stream with non_blocking=True to run them beside compute. "
            "tracewhy account TRACE lists them.")


def _device_name(ctx: Context, device: int | None) -> str | None:
    d = ctx.trace.devices
    if device is None or d.height == 0:
        return None
    rows = d.filter(pl.col(DeviceCol.DEVICE) == device).get_column(DeviceCol.NAME).drop_nulls()
    return str(rows[0]) if rows.len() else None
