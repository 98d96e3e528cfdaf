"""Exposed communication (no compute beside it on the GPU) as a share of the step, with the
collectives responsible, and, where the step account is known, how much of the step's critical
path it holds: exposed time that runs while the host holds the step is not on that path, and
hiding it under compute saves nothing of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import polars as pl

from tracewhy.analyses.overlap import OverlapCol, OverlapOptions, OverlapResult, overlap
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity

if TYPE_CHECKING:  # (the step account and the replays: imported where diagnose asks, see _on_path)
    from tracewhy.analyses.account import AccountResult
    from tracewhy.analyses.what_if_comm import CommOnPath

#: Collectives named in a statement; the evidence keeps them all.
_NAMED: int = 3
#: Parts named as taking communication's place on the path, or as holding the step beside it.
_NAMED_PARTS: int = 2


def overlap_result(ctx: Context) -> OverlapResult:
    """The overlap analysis of this diagnosis, computed once."""
    return ctx.cached("overlap", lambda: overlap(
        ctx.trace, OverlapOptions(ctx.options.step_marker, ctx.options.warmup), steps_result=ctx.steps()
    ))


class OnPath(msgspec.Struct, frozen=True):
    """What the step account and the replay say of the exposed communication: its time on the
    critical path of the replayed steps (``on_path``), the step time hiding it saves there
    (``saved_ns``), its time left on the path then (``kept_ns``: the host's time issuing
    collectives, and collectives outside backward, whose results the work after them reads), the
    parts that take its place on the path (ns per step each gains), and the largest avoidable
    parts that hold the step besides communication (ns per step)."""

    on_path: CommOnPath
    saved_ns: int
    kept_ns: int
    takeovers: list[tuple[str, int]]
    holders: list[tuple[str, int]]


def findings(ctx: Context) -> list[Finding]:
    found = exposed_comm_findings(overlap_result(ctx))
    account = ctx.account()
    if not found or account is None:
        return found
    return exposed_comm_findings(overlap_result(ctx), _on_path(ctx, account))


def _on_path(ctx: Context, account: AccountResult) -> OnPath | None:
    """Communication on the replayed steps' critical paths, and the replay of hiding it: the fix
    the step account's communication parts predict with (``what_if.fix_for_part``), replayed as
    the diagnosis replays it, against the same steps unedited. (Its imports are the step
    account's and the replays': the overlap command and check's overlap metrics, which read
    ``overlap_result`` alone, import none of them.)"""
    from tracewhy.analyses.account import AccountCol
    from tracewhy.analyses.account_names import PartKind
    from tracewhy.analyses.what_if import fix_for_part
    from tracewhy.analyses.what_if_comm import comm_on_path

    rows = account.parts.select(AccountCol.PART, AccountCol.KIND, AccountCol.ESSENTIAL).rows()
    edits = {repr(f): f for part, kind, essential in rows if kind == PartKind.COMMUNICATION
             for f in [fix_for_part(part, kind, essential)] if f is not None}
    windows = ctx.what_if_windows()
    if not edits or not windows:
        return None
    before, after = ctx.predict(()), ctx.predict(tuple(edits.values()))
    avoidable = {part for part, kind, essential in rows
                 if not essential and kind not in (PartKind.COMMUNICATION, PartKind.UNEXPLAINED)}
    other = {part for part, kind, _ in rows if kind != PartKind.COMMUNICATION}
    grown = sorted(((ns - before.parts.get(part, 0), part) for part, ns in after.parts.items() if part in other),
                   reverse=True)
    held = sorted(((ns, part) for part, ns in before.parts.items() if part in avoidable), reverse=True)
    comm = {part for part, kind, _ in rows if kind == PartKind.COMMUNICATION}
    return OnPath(on_path=comm_on_path(ctx.step_model(), [w.path for w in windows]), saved_ns=after.saved_ns,
                  kept_ns=sum(ns for part, ns in after.parts.items() if part in comm),
                  takeovers=[(part, ns) for ns, part in grown[:_NAMED_PARTS] if ns >= th.EXPOSED_COMM_MIN_NS],
                  holders=[(part, ns) for ns, part in held[:_NAMED_PARTS]])


def exposed_comm_findings(r: OverlapResult, on_path: OnPath | None = None) -> list[Finding]:
    """One finding per device whose exposed communication passes the thresholds; ``on_path``
    (where the step account is known): the statement also says how much of the step's critical
    path communication holds, what hiding it saves, what takes its place, and what holds the
    step while the rest runs."""
    out: list[Finding] = []
    per_step = r.steady.height > 0
    for dev in r.devices.iter_rows(named=True):
        device = dev[OverlapCol.DEVICE]
        if per_step:
            rows = r.steady.filter(pl.col(OverlapCol.DEVICE) == device)
            if rows.height == 0:
                continue
            s = rows.row(0, named=True)
            window, exposed, comm = s[OverlapCol.WINDOW], s[OverlapCol.COMM_EXPOSED], s[OverlapCol.COMM]
            unit = "ms/step"
        else:
            window, exposed, comm = dev[OverlapCol.SPAN], dev[OverlapCol.COMM_EXPOSED], dev[OverlapCol.COMM]
            unit = "ms over the trace (no step markers)"
        if not comm or not window:
            continue
        share = exposed / window
        if share < th.EXPOSED_COMM_MIN_SHARE or exposed < th.EXPOSED_COMM_MIN_NS:
            continue
        colls = r.collectives.filter((pl.col(OverlapCol.DEVICE) == device) & (pl.col(OverlapCol.EXPOSED) > 0))
        named = ", ".join(
            f"{c[OverlapCol.COLLECTIVE]} {c[OverlapCol.EXPOSED_PER_STEP] / 1e6:.2f} ms ({c[OverlapCol.COUNT]} calls)"
            for c in colls.head(_NAMED).iter_rows(named=True)
        )
        same_stream = _comm_on_compute_streams(r, device)
        why = (" Communication runs on the same stream as compute, so it cannot overlap at all."
               if same_stream else "")
        hidden_share = 1 - exposed / comm
        out.append(Finding(
            code=Code.COMM_EXPOSED,
            # Exposed time the replay says hiding cannot take off the step is worth reading, not acting on.
            severity=(Severity.LOW if on_path is not None and per_step and on_path.saved_ns < th.EXPOSED_COMM_MIN_NS
                      else Severity.HIGH if share >= th.EXPOSED_COMM_HIGH_SHARE else Severity.MEDIUM),
            statement=(
                f"communication runs with no compute beside it for {exposed / 1e6:.2f} {unit} on GPU {device} "
                f"({100 * share:.1f}% of the {window / 1e6:.2f} ms window; only {100 * hidden_share:.0f}% of "
                f"the {comm / 1e6:.2f} ms of communication runs under compute): {named or 'unnamed kernels'}.{why}"
                + _on_path_sentence(exposed if per_step else None, on_path)
            ),
            next_step=_next_step(on_path if per_step else None),
            recoverable_ns_per_step=int(exposed),
            evidence={
                "device": device, "window_ns": window, "comm_ns": comm, "comm_exposed_ns": exposed,
                "exposed_share": round(share, 4), "comm_on_compute_stream": same_stream,
                **({"comm_on_critical_path_ns": on_path.on_path.total_ns,
                    "comm_kernels_on_critical_path_ns": on_path.on_path.kernels_ns}
                   if on_path is not None and per_step else {}),
                "steps": r.steady_steps if per_step else 0,
                "collectives": colls.select(OverlapCol.COLLECTIVE, OverlapCol.COUNT, OverlapCol.EXPOSED,
                                            OverlapCol.EXPOSED_PER_STEP).to_dicts(),
            },
        ))
    return out


def _on_path_sentence(exposed_per_step: int | None, known: OnPath | None) -> str:
    """Communication's time on the replayed steps' critical paths, what hiding it saves and what
    takes its place there, and, when its kernels on the path are less than what is exposed, what
    holds the step while the rest runs."""
    if known is None or exposed_per_step is None or known.on_path.steps == 0:
        return ""
    c = known.on_path
    out = (f" On the step's critical path communication holds {c.total_ns / 1e6:.2f} ms per step "
           f"(collective kernels {c.kernels_ns / 1e6:.2f} ms, host time in the collective calls and waits on them "
           f"{c.calls_ns / 1e6:.2f} ms); hidden under compute it saves {max(known.saved_ns, 0) / 1e6:.2f} ms per step")
    then = []
    if known.kept_ns >= th.EXPOSED_COMM_MIN_NS:
        then.append(f"communication still holds {known.kept_ns / 1e6:.2f} ms of the path (the host's time issuing "
                    "collectives, and collectives outside backward, whose results the work after them reads)")
    if known.takeovers:
        then.append("the work that ran beside it takes its place: " + ", ".join(
            f"{part} +{ns / 1e6:.2f} ms" for part, ns in known.takeovers))
    if then:
        out += ": " + "; ".join(then)
    out += "."
    if c.kernels_ns < exposed_per_step and known.holders:
        out += " The rest of the exposed time runs beside the work that holds the step: " + ", ".join(
            f"{part} {ns / 1e6:.2f} ms" for part, ns in known.holders) + " per step."
    return out


def _next_step(known: OnPath | None) -> str:
    overlap_it = ("Overlap it with compute: launch collectives on their own stream and early (DDP: smaller "
                  "bucket_cap_mb so all-reduce starts during backward; FSDP: forward/backward prefetch), and keep "
                  "syncs out of the step. Per-step numbers: tracewhy overlap TRACE")
    if known is None or known.saved_ns >= th.EXPOSED_COMM_MIN_NS or not known.holders:
        return overlap_it
    return (f"Start with what holds the step ({known.holders[0][0]}): overlapping communication shortens this step "
            f"only once that work no longer hides it. Then: {overlap_it[0].lower()}{overlap_it[1:]}")


def _comm_on_compute_streams(r: OverlapResult, device: int) -> bool:
    """Every stream with communication also runs compute (one in-order queue for both)."""
    s = r.streams.filter((pl.col(OverlapCol.DEVICE) == device) & (pl.col(OverlapCol.COMMUNICATION_UNION) > 0))
    return s.height > 0 and bool((s.get_column(OverlapCol.COMPUTE_UNION) > 0).all())
