"""The six ``nsys analyze`` rules as findings, with NVIDIA's default thresholds. They apply to any
input that records CUDA API calls (Kineto traces too), not only to Nsight Systems exports.

Where tracewhy's own findings already say the same thing with more context (pageable copies,
synchronize drains, GPU gaps) these stay low severity and carry nsys's exact criteria, so that
a user comparing with ``nsys analyze`` finds each of its rules here.
"""

from __future__ import annotations

import polars as pl

from tracewhy.analyses import nsys_rules as rules
from tracewhy.analyses.stats import max_of, sum_of
from tracewhy.findings.applicability import pinned_copy_advice, run_facts
from tracewhy.findings.codes import Code
from tracewhy.findings.consolidate import severity_for_share
from tracewhy.findings.context import Context
from tracewhy.findings.idle import CLASS_FINDINGS
from tracewhy.findings.model import Finding, Severity
from tracewhy.findings.sync_count import COUNTED, blocking_syncs
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, LAUNCH_KINDS, Col, Kind
from tracewhy.units import fmt_bytes
from tracewhy.units import fmt_ns as ms

_TOP = 5


def findings(ctx: Context) -> list[Finding]:
    t = ctx.trace
    if t.count(*LAUNCH_KINDS) == 0 or t.of_kind(*GPU_ACTIVITY_KINDS).height == 0:
        return []
    out: list[Finding] = []
    facts = run_facts(ctx)
    memcpy = rules.copies_with_api(t, Kind.MEMCPY)  # (two rules filter the same copies)
    pageable = rules.pageable_async_memcpy(t, copies=memcpy).table
    if pageable.height:
        out.append(Finding(
            code=Code.NSYS_ASYNC_MEMCPY_PAGEABLE, severity=Severity.LOW,
            statement=f"{pageable.height} asynchronous copies use pageable memory "
                      f"({fmt_bytes(int(sum_of(pageable['bytes'])))}, {ms(sum_of(pageable['dur_ns']))}): they run "
                      "synchronously (nsys rule cuda_memcpy_async).",
            next_step=pinned_copy_advice(facts) + ", so the copies overlap.",
            evidence={"rule": "cuda_memcpy_async", "count": pageable.height, "longest": _rows(pageable)},
        ))
    sync_copy = rules.sync_memcpy(t, copies=memcpy).table
    if sync_copy.height:
        out.append(Finding(
            code=Code.NSYS_SYNC_MEMCPY, severity=Severity.LOW,
            statement=f"{sync_copy.height} synchronous memcpy operations ({ms(sum_of(sync_copy['dur_ns']))} on the "
                      "GPU) block the host (nsys rule cuda_memcpy_sync).",
            next_step=("Use cudaMemcpyAsync / tensor.to(device, non_blocking=True) from pinned memory." if facts.pytorch
                       else "Use cudaMemcpyAsync on a stream, from pinned host memory."),
            evidence={"rule": "cuda_memcpy_sync", "count": sync_copy.height, "longest": _rows(sync_copy)},
        ))
    sync_memset = rules.sync_memset(t).table
    if sync_memset.height:
        out.append(Finding(
            code=Code.NSYS_SYNC_MEMSET, severity=Severity.LOW,
            statement=f"{sync_memset.height} synchronous memset operations block the host "
                      "(nsys rule cuda_memset_sync).",
            next_step="Use cudaMemsetAsync (torch.zeros on the device is already asynchronous).",
            evidence={"rule": "cuda_memset_sync", "count": sync_memset.height, "longest": _rows(sync_memset)},
        ))
    sync_api = rules.sync_api_calls(t).table
    if sync_api.height:
        # Ties in count by name: the statement must read the same on every run.
        names = sync_api.group_by("api").len().sort(["len", "api"], descending=[True, False])
        # Severity by the share of the capture the most blocked thread spent blocked (358.8 ms of a
        # 1.211 s run is not low); the time is the host's, so it is not recoverable GPU time.
        per_thread = sync_api.group_by(Col.PID, Col.TID).agg(pl.col(Col.DUR).sum())
        blocked_share = min(1.0, max_of(per_thread.get_column(Col.DUR)) / max(t.span_ns, 1))
        # nsys's rule counts device and stream synchronize over the capture; check and this
        # statement's first figure count every blocking call per step (findings/sync_count.py).
        count = blocking_syncs(ctx)
        breakdown = count.breakdown()
        # Without step markers the count is the whole trace's, and is said so, not "per step".
        if count.steps:
            counted = f"{count.per_step:.3g} blocking calls per step ({count.statistic}"
            counted += f": {breakdown}" if breakdown else ""
        else:
            counted = f"{count.per_step:.3g} blocking calls over the trace (no step markers"
            counted += f"; {breakdown}" if breakdown else ""
        out.append(Finding(
            code=Code.NSYS_SYNC_API, severity=severity_for_share(blocked_share),
            statement=counted + "; as check --max-syncs-per-step counts). "
                      f"Over the whole trace, nsys rule cuda_api_sync (device and stream synchronize only) finds "
                      f"{sync_api.height}, blocking the host for {ms(sum_of(sync_api['dur_ns']))} ("
                      + ", ".join(f"{a} x{n}" for a, n in names.iter_rows()) + ").",
            next_step=f"Keep at most one synchronize per {'step' if count.steps else 'iteration'}; tracewhy gaps "
                      "TRACE --class sync shows the ones that drain the GPU.",
            evidence={"rule": "cuda_api_sync", "count": sync_api.height, "longest": _rows(sync_api),
                      "share_of_trace": round(blocked_share, 4), "blocking_calls_per_step": count.per_step,
                      "blocking_calls_statistic": count.statistic, "blocking_calls_counted": COUNTED},
            see=(Code.GPU_IDLE_SYNC, Code.SCALAR_READ_PER_STEP),
        ))
    busy = rules.gpu_busy_intervals(t)  # (two rules read the same busy time)
    big_gaps = rules.gpu_gaps(t, busy=busy).table
    if big_gaps.height:
        out.append(Finding(
            code=Code.NSYS_GPU_GAPS, severity=Severity.MEDIUM,
            statement=f"{big_gaps.height} GPU idle stretches longer than {ms(rules.GPU_GAP_NS)} "
                      f"(longest {ms(int(big_gaps['dur_ns'].max()))}; nsys rule gpu_gaps).",  # type: ignore[arg-type]
            next_step="Find what the host did in them: tracewhy gaps TRACE --min-gap 500000000.",
            evidence={"rule": "gpu_gaps", "count": big_gaps.height, "longest": _rows(big_gaps)},
        ))
    low = rules.gpu_low_utilization(t, busy=busy).table
    if low.height:
        out.append(Finding(
            code=Code.NSYS_GPU_LOW_UTILIZATION, severity=Severity.LOW,
            statement=f"{int(sum_of(low['chunks']))} of {rules.UTIL_CHUNKS} equal chunks of the GPU's active span use "
                      f"it under {rules.LOW_UTIL_PCT:.0f}% (nsys rule gpu_time_util).",
            next_step="Find what the host did in those stretches: tracewhy gaps TRACE --top 20.",
            evidence={"rule": "gpu_time_util", "runs": _rows(low)},
            see=CLASS_FINDINGS,
        ))
    return out


def _rows(frame: pl.DataFrame) -> list[dict[str, object]]:
    return frame.head(_TOP).to_dicts()
