"""Is communication on the critical path: exposed communication as a share of the step, with the
collectives responsible."""

from __future__ import annotations

import polars as pl

from tracewhy.analyses.overlap import OverlapCol, OverlapOptions, OverlapResult, overlap
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity

#: Collectives named in a statement; the evidence keeps them all.
_NAMED: int = 3


def overlap_result(ctx: Context) -> OverlapResult:
    """The overlap analysis of this diagnosis, computed once."""
    return ctx.cached("overlap", lambda: overlap(
        ctx.trace, OverlapOptions(ctx.options.step_marker, ctx.options.warmup), steps_result=ctx.steps()
    ))


def findings(ctx: Context) -> list[Finding]:
    return exposed_comm_findings(overlap_result(ctx))


def exposed_comm_findings(r: OverlapResult) -> list[Finding]:
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
            severity=Severity.HIGH if share >= th.EXPOSED_COMM_HIGH_SHARE else Severity.MEDIUM,
            statement=(
                f"comm is on the critical path for {exposed / 1e6:.2f} {unit} on GPU {device} "
                f"({100 * share:.1f}% of the {window / 1e6:.2f} ms window; only {100 * hidden_share:.0f}% of "
                f"the {comm / 1e6:.2f} ms of communication runs under compute): {named or 'unnamed kernels'}.{why}"
            ),
            next_step=(
                "Overlap it with compute: launch collectives on their own stream and early (DDP: smaller "
                "bucket_cap_mb so all-reduce starts during backward; FSDP: forward/backward prefetch), and keep "
                "syncs out of the step. Per-step numbers: tracewhy overlap TRACE"
            ),
            recoverable_ns_per_step=int(exposed),
            evidence={
                "device": device, "window_ns": window, "comm_ns": comm, "comm_exposed_ns": exposed,
                "exposed_share": round(share, 4), "comm_on_compute_stream": same_stream,
                "steps": r.steady_steps if per_step else 0,
                "collectives": colls.select(OverlapCol.COLLECTIVE, OverlapCol.COUNT, OverlapCol.EXPOSED,
                                            OverlapCol.EXPOSED_PER_STEP).to_dicts(),
            },
        ))
    return out


def _comm_on_compute_streams(r: OverlapResult, device: int) -> bool:
    """Every stream with communication also runs compute (one in-order queue for both)."""
    s = r.streams.filter((pl.col(OverlapCol.DEVICE) == device) & (pl.col(OverlapCol.COMMUNICATION_UNION) > 0))
    return s.height > 0 and bool((s.get_column(OverlapCol.COMPUTE_UNION) > 0).all())
