"""Memory findings: what the peak consists of and what lowers it, reserved far above allocated,
allocated growing over the steady steps, and the allocator going back to the driver in steady state;
across ranks, a rank whose peak stands out; between two runs, a peak that grew.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import polars as pl

from tracewhy.analyses.memory import ChurnCol, DeviceMemory, MemoryResult, analyze_memory
from tracewhy.analyses.memory_growth import SiteCol
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.units import fmt_bytes, fmt_pct

if TYPE_CHECKING:  # (a snapshot's analysis is imported by the command that reads one)
    from tracewhy.analyses.memory_compare import MemoryGrowth, MemoryRanks
    from tracewhy.analyses.memory_snapshot import SnapshotDevice, SnapshotResult

#: What lowers each ledger category at the peak, for the memory-peak finding.
REMEDIES: Final = {
    "activations": "activation checkpointing (torch.utils.checkpoint) or a smaller micro-batch",
    "temporaries": "fusing the ops that make them (torch.compile) or a smaller micro-batch",
    "optimizer_state": "sharding the optimizer state (ZeroRedundancyOptimizer, FSDP) or 8-bit optimizer states",
    "gradients": "zero_grad(set_to_none=True) and gradient sharding (FSDP), or accumulation in lower precision",
    "parameters": "parameter sharding (FSDP) or lower-precision weights",
    "comm_buckets": "a smaller DDP bucket_cap_mb or FSDP's limit_all_gathers",
    "kv_cache": "a paged or quantized KV cache, or a shorter maximum context",
    "inputs": "smaller batches on the device, or moving inputs later",
}
#: What lowers a peak reached inside the optimizer step, whatever the ledger's largest part there:
#: parameters, gradients and the optimizer's state are all live at once.
OPTIMIZER_PEAK_REMEDY: Final = ("sharding the optimizer state (ZeroRedundancyOptimizer, FSDP), 8-bit or fused "
                                "optimizer states (bitsandbytes' 8-bit Adam; fused=True instead of foreach's "
                                "temporaries), or freeing each gradient once applied (the optimizer step in "
                                "post-accumulate-grad hooks)")
#: What lowers a snapshot's peak by the phase its allocation's stack was in (the optimizer's is
#: OPTIMIZER_PEAK_REMEDY): forward holds activations, backward gradients and autograd's buffers.
SNAPSHOT_REMEDIES: Final = {
    "forward": "The peak is in forward, where activations build up: lower it by activation checkpointing "
               "(torch.utils.checkpoint) or a smaller micro-batch",
    "backward": "The peak is in backward, where gradients join the activations still held: lower it by "
                "zero_grad(set_to_none=True), gradient sharding (FSDP) or activation checkpointing",
}
SNAPSHOT_REMEDY: Final = "Lower the largest holder at the peak (what its frames allocate)"
#: A rank whose peak is this far above the ranks' median peak stands out: every rank runs the
#: same batch, so the highest rank's peak is what caps the batch size or model all ranks can take.
RANK_IMBALANCE_SHARE: Final = 0.05
#: A growth from A to B of this share of A's peak or more is medium; a smaller one (beyond the
#: noise still) is told as info.
GREW_MEDIUM_SHARE: Final = 0.05
#: Ops that grow a tensor by copying it whole into a larger one.
_CONCATENATING: Final = ("aten::cat", "aten::stack", "aten::hstack", "aten::vstack", "aten::concat",
                         "aten::concatenate", "aten::pad", "aten::resize_")


def memory_result(ctx: Context) -> MemoryResult | None:
    """The trace's memory analysis, once per diagnosis and on its host index and steps; None
    without ``[memory]`` events (a capture without profile_memory). The host contexts are the
    step account's, or found by the memory analysis where the account is left out for want of
    memory (``Context.account_memory``)."""
    if ctx.trace.memory.height == 0:
        return None
    return ctx.cached("memory", lambda: analyze_memory(
        ctx.trace, host=ctx.host(), steps_result=ctx.steps(), tree=ctx.host_tree(), marked=ctx.compile_marked(),
        contexts=ctx.step_model().rules.ctx if ctx.account_memory() is None else None))


def findings(ctx: Context) -> list[Finding]:
    """The rule ``diagnose`` runs: the memory findings when the trace has memory events."""
    r = memory_result(ctx)
    return memory_findings(r) if r is not None else []


def ledger_parts(ledger: dict[str, int]) -> list[tuple[str, int]]:
    """The ledger's non-empty categories, largest first (ties in the ledger's own order)."""
    return sorted(((k, v) for k, v in ledger.items() if v > 0), key=lambda kv: -kv[1])


def memory_findings(result: MemoryResult) -> list[Finding]:
    """Findings over a trace's ``[memory]`` events; GPUs only when the trace has any."""
    devices = [d for d in result.devices if d.device != "cpu"] or list(result.devices)
    out: list[Finding] = []
    for d in devices:
        out += _peak(d, result.ledger_source)
        if d.reserved_at_peak_bytes is not None:
            out += _fragmentation(d.device, d.peak_allocated_bytes, d.reserved_at_peak_bytes, "at the allocation peak")
        out += _growth(d)
        out += _churn(d)
    return out


def snapshot_findings(result: SnapshotResult) -> list[Finding]:
    """Findings over an allocator snapshot: fragmentation at the end, and OOMs."""
    out: list[Finding] = []
    for d in result.devices:
        out += _fragmentation(f"cuda:{d.device}", d.final_allocated_bytes, d.final_reserved_bytes,
                              "when the snapshot was taken", expandable=bool(result.allocator_settings.get(
                                  "expandable_segments")), largest_free=d.largest_free_block_bytes)
        out += _snapshot_peak(d)
    return out


def _peak(d: DeviceMemory, source: str) -> list[Finding]:
    ledger = dict(ledger_parts(d.ledger))
    if not d.peak_allocated_bytes:
        return []
    parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in ledger.items())
    where = " ".join(x for x in (f"in {d.peak_step}" if d.peak_step else "",
                                 f"in the {d.peak_phase} phase" if d.peak_phase else "",
                                 f"during {d.peak_op}" if d.peak_op else "",
                                 f"at {d.peak_frame}" if d.peak_frame else "") if x)
    return [Finding(
        code=Code.MEMORY_PEAK, severity=Severity.INFO,
        statement=f"{d.device} peaks at {fmt_bytes(d.peak_allocated_bytes)} allocated "
                  f"({fmt_bytes(d.reserved_at_peak_bytes)} reserved) {where}; "
                  f"{'(allocated counted from the trace start) ' if d.allocated_source == 'running_sum' else ''}"
                  f"live then ({source}): {parts or 'nothing'}.",
        next_step=_peak_advice(d, ledger),
        evidence={"device": d.device, "peak_allocated_bytes": d.peak_allocated_bytes,
                  "reserved_at_peak_bytes": d.reserved_at_peak_bytes, "peak_ts_ns": d.peak_ts_ns,
                  "peak_step": d.peak_step, "peak_phase": d.peak_phase, "peak_op": d.peak_op,
                  "peak_frame": d.peak_frame, "ledger": d.ledger, "ledger_source": source},
    )]


def _peak_advice(d: DeviceMemory, ledger: dict[str, int]) -> str:
    """The phase at the peak decides: the optimizer step gets optimizer-state advice, forward and
    backward the remedy of the largest live part (checkpointing only for activations); a peak too
    small to matter gets none."""
    if d.peak_allocated_bytes < th.MEMORY_PEAK_ADVICE_MIN_BYTES:
        return (f"The peak is small ({fmt_bytes(d.peak_allocated_bytes)}, under "
                f"{fmt_bytes(th.MEMORY_PEAK_ADVICE_MIN_BYTES)}): lowering it frees nothing a larger batch or "
                "model could use; nothing to change for memory's sake.")
    if d.peak_phase == "optimizer":
        return ("The peak is inside the optimizer step, where parameters, gradients and optimizer state are "
                f"live together: lower it by {OPTIMIZER_PEAK_REMEDY}.")
    largest = max((k for k in ledger if k in REMEDIES), key=lambda k: ledger[k], default=None)
    if largest is None:
        return "Record a snapshot (torch.cuda.memory._record_memory_history, _dump_snapshot) to see what is live."
    return f"The largest part is {largest}: lower it by {REMEDIES[largest]}."


def _fragmentation(device: str, allocated: int, reserved: int, when: str, *, expandable: bool = False,
                   largest_free: int | None = None) -> list[Finding]:
    slack = reserved - allocated
    if reserved <= 0 or slack < th.MEMORY_FRAGMENTATION_MIN_BYTES \
            or slack / reserved < th.MEMORY_FRAGMENTATION_SHARE:
        return []
    tail = f"; the largest free block is {fmt_bytes(largest_free)}" if largest_free is not None else ""
    return [Finding(
        code=Code.MEMORY_FRAGMENTATION, severity=Severity.MEDIUM,
        statement=f"{device} holds {fmt_bytes(slack)} reserved but unallocated {when} "
                  f"({fmt_pct(slack / reserved)} of {fmt_bytes(reserved)} reserved){tail}.",
        next_step="Already on expandable segments: look for many differently sized, long-lived blocks." if expandable
        else "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so segments grow in place instead of splitting.",
        evidence={"device": device, "allocated_bytes": allocated, "reserved_bytes": reserved, "slack_bytes": slack,
                  "largest_free_block_bytes": largest_free},
    )]


def _growth(d: DeviceMemory) -> list[Finding]:
    """A leak: allocated at the end of every steady step above the step before's. A rise in some
    steps only (a buffer allocated lazily and kept, an optimizer's first state) is no leak."""
    g = d.growth
    if not g.rises_every_step or g.steady_steps < th.MEMORY_GROWTH_MIN_STEPS or not d.peak_allocated_bytes:
        return []
    steady = d.steps.filter(pl.col(ChurnCol.STEADY) & pl.col(ChurnCol.ALLOCATED_AT_END).is_not_null())
    ends = steady.get_column(ChurnCol.ALLOCATED_AT_END)
    per_step = (int(ends[-1]) - int(ends[0])) / (steady.height - 1)
    sites = g.sites.head(3).rows(named=True)
    kept = "; ".join(f"{s[SiteCol.OP]}{f' at {s[SiteCol.FRAME]}' if s[SiteCol.FRAME] else ''} "
                     f"{fmt_bytes(int(s[SiteCol.BYTES_PER_STEP]))}" for s in sites)
    high = per_step / d.peak_allocated_bytes >= th.MEMORY_GROWTH_SHARE_PER_STEP
    return [Finding(
        code=Code.MEMORY_GROWTH, severity=Severity.HIGH if high else Severity.MEDIUM,
        statement=f"{d.device}: allocated memory rises in every one of {steady.height} steady steps, "
                  f"{fmt_bytes(int(per_step))} a step ({fmt_bytes(int(ends[0]))} to {fmt_bytes(int(ends[-1]))}, "
                  f"{fmt_pct(per_step / d.peak_allocated_bytes)} of the peak a step): a leak"
                  f"{f'. Kept each step by: {kept}' if kept else ''}.",
        next_step=_growth_fix(sites),
        evidence={"device": d.device, "growth_bytes_per_step": per_step, "steady_steps": steady.height,
                  "allocated_at_end_bytes": ends.to_list(), "sites": sites},
    )]


def _growth_fix(sites: list[dict[str, object]]) -> str:
    """The fix for what the sites do: a tensor grown by concatenation is preallocated and written in
    place; a tensor kept per step is dropped or kept as a number."""
    fixes = []
    for s in sites:
        where = f" ({s[SiteCol.FRAME]})" if s[SiteCol.FRAME] else ""
        if s[SiteCol.OP] in _CONCATENATING:
            fixes.append(f"preallocate the buffer that {s[SiteCol.OP]} grows{where} once (torch.empty at its final "
                         "size) and write each step's rows into it in place (buffer[i:j].copy_(rows))")
        else:
            fixes.append(f"stop keeping {s[SiteCol.OP]}'s result across steps{where}: keep a number (.item()) "
                         "or a detached CPU copy, or clear the container each step")
    if not fixes:
        return ("Look for tensors kept across steps (a loss appended without .item()/.detach(), growing caches); "
                "torch.cuda.memory._record_memory_history and _dump_snapshot show who holds them.")
    text = "; ".join(fixes)
    return text[0].upper() + text[1:] + "."


def _churn(d: DeviceMemory) -> list[Finding]:
    steady = d.steps.filter(pl.col(ChurnCol.STEADY))
    if steady.height == 0:
        return []
    changes = int(steady.get_column(ChurnCol.RESERVE_CHANGES).sum())
    per_step = changes / steady.height
    if per_step < th.ALLOCATOR_CHURN_RESERVE_CHANGES_PER_STEP:
        return []
    allocs = int(steady.get_column(ChurnCol.ALLOCATIONS).sum()) / steady.height
    return [Finding(
        code=Code.ALLOCATOR_CHURN, severity=Severity.MEDIUM,
        statement=f"{d.device}: reserved memory changes {per_step:.1f} times per steady step (cudaMalloc/cudaFree "
                  f"by the caching allocator) among {allocs:.0f} allocations per step.",
        next_step="Keep shapes stable between steps, avoid torch.cuda.empty_cache() in the loop, and try "
                  "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
        evidence={"device": d.device, "reserve_changes_per_step": per_step, "allocations_per_step": allocs},
    )]


def _snapshot_peak(d: SnapshotDevice) -> list[Finding]:
    if not d.peak_allocated_bytes:
        return []
    top = d.live_at_peak.head(3).rows()
    parts = "; ".join(f"{frame} {fmt_bytes(int(nbytes))} in {blocks} blocks" for frame, blocks, nbytes, _ in top)
    ooms = d.ooms.height
    viewer = "open the snapshot in https://pytorch.org/memory_viz for the full stacks."
    small = d.peak_allocated_bytes < th.MEMORY_PEAK_ADVICE_MIN_BYTES and not ooms
    return [Finding(
        code=Code.MEMORY_PEAK, severity=Severity.HIGH if ooms else Severity.INFO,
        statement=f"cuda:{d.device} peaks at {fmt_bytes(d.peak_allocated_bytes)} allocated in the recorded window "
                  f"({fmt_bytes(d.peak_requested_bytes)} requested)"
                  f"{f' and ran out of memory {ooms} times' if ooms else ''}; "
                  f"largest live at the peak: {parts or 'none'}.",
        next_step=f"The peak is small (under {fmt_bytes(th.MEMORY_PEAK_ADVICE_MIN_BYTES)}): nothing to lower; {viewer}"
        if small else f"The peak is inside the optimizer step: lower it by {OPTIMIZER_PEAK_REMEDY}; {viewer}"
        if d.peak_phase == "optimizer" else f"{SNAPSHOT_REMEDIES.get(d.peak_phase or '', SNAPSHOT_REMEDY)}; {viewer}",
        evidence={"device": d.device, "peak_allocated_bytes": d.peak_allocated_bytes,
                  "peak_requested_bytes": d.peak_requested_bytes, "ooms": ooms},
    )]


def _site(op: str | None, frame: str | None, size_class: int | None) -> str:
    parts = [x for x in (op, f"at {frame}" if frame else None,
                         f"({fmt_bytes(size_class)} class)" if size_class else None) if x]
    return " ".join(parts) or "(no site)"


def memory_ranks_findings(r: MemoryRanks) -> list[Finding]:
    """A rank whose peak is RANK_IMBALANCE_SHARE above the median, and the sites behind it: those
    whose bytes at the peak differ most between ranks."""
    from tracewhy.analyses.memory_compare import RankMemCol, RankSiteCol

    if not r.median_peak_bytes or r.max_peak_bytes - r.median_peak_bytes < RANK_IMBALANCE_SHARE * r.median_peak_bytes:
        return []
    excess = r.max_peak_bytes - r.median_peak_bytes
    low = r.ranks.row(int(r.ranks.get_column(RankMemCol.PEAK_ALLOCATED).arg_min() or 0), named=True)
    below = r.max_peak_bytes - int(low[RankMemCol.PEAK_ALLOCATED])
    sites = r.sites.filter(pl.col(RankSiteCol.SPREAD) > 0).head(3).rows(named=True)
    differ = "; ".join(f"{_site(s[RankSiteCol.OP], s[RankSiteCol.FRAME], s[RankSiteCol.SIZE_CLASS])} "
                       f"{fmt_bytes(s[RankSiteCol.MAX_BYTES])} on rank {s[RankSiteCol.MAX_RANK]}, "
                       f"{fmt_bytes(s[RankSiteCol.MIN_BYTES])} on rank {s[RankSiteCol.MIN_RANK]}" for s in sites)
    return [Finding(
        code=Code.MEMORY_RANK_IMBALANCE, severity=Severity.MEDIUM,
        statement=f"rank {r.max_rank} peaks at {fmt_bytes(r.max_peak_bytes)} allocated, {fmt_bytes(int(excess))} "
                  f"({fmt_pct(excess / r.median_peak_bytes)}) above the ranks' median "
                  f"{fmt_bytes(int(r.median_peak_bytes))} and {fmt_bytes(below)} above the lowest, "
                  f"rank {low[RankMemCol.RANK]}"
                  f"{f'; the sites that differ most: {differ}' if differ else ''}.",
        next_step=f"Every rank's batch must fit under rank {r.max_rank}'s peak: find why it alone holds more "
                  "(a rank-dependent buffer, uneven shards, one rank's logging or checkpoint copies) and even it out.",
        evidence={"max_rank": r.max_rank, "max_peak_bytes": r.max_peak_bytes,
                  "median_peak_bytes": r.median_peak_bytes, "min_rank": low[RankMemCol.RANK],
                  "min_peak_bytes": low[RankMemCol.PEAK_ALLOCATED], "sites": sites},
    )]


def memory_growth_findings(g: MemoryGrowth) -> list[Finding]:
    """B's peak above A's by more than the noise, with the sites that grew most beyond it, and the
    slack (reserved, not allocated, at the peak) where it grew beyond the noise too; the slack alone
    where only it grew: the allocator holds more cached or fragmented memory for the same tensors."""
    from tracewhy.analyses.memory_compare import GrowthCol, MemoryMeasureCol

    measures = {str(m[MemoryMeasureCol.MEASURE]): m for m in g.measures.rows(named=True)}
    slack = measures["slack_at_peak"]
    slack_grew = bool(slack[MemoryMeasureCol.BEYOND_NOISE]) and (slack[MemoryMeasureCol.GROWTH] or 0) > 0
    growth = g.peak_growth_bytes
    grew_allocated = growth > g.noise_bytes and g.a.peak_allocated_bytes > 0
    if not grew_allocated and not slack_grew:
        return []
    slack_text = ("the slack at the peak (reserved, not allocated) grew by "
                  f"{fmt_bytes(slack[MemoryMeasureCol.GROWTH])} "
                  f"({fmt_bytes(slack[MemoryMeasureCol.A_BYTES])} to {fmt_bytes(slack[MemoryMeasureCol.B_BYTES])})")
    evidence = {"a_peak_bytes": g.a.peak_allocated_bytes, "b_peak_bytes": g.b.peak_allocated_bytes,
                "noise_bytes": g.noise_bytes, "a_slack_bytes": slack[MemoryMeasureCol.A_BYTES],
                "b_slack_bytes": slack[MemoryMeasureCol.B_BYTES]}
    if not grew_allocated:
        return [Finding(
            code=Code.MEMORY_GREW, severity=Severity.INFO,
            statement=f"{g.b.device}: allocated at the peak did not grow beyond the noise ({fmt_bytes(growth)}, noise "
                      f"{fmt_bytes(g.noise_bytes)}) but {slack_text}: cached free blocks and fragmentation.",
            next_step="Try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in B, and look for sizes that vary "
                      "from step to step.",
            evidence=evidence,
        )]
    share = growth / g.a.peak_allocated_bytes
    sites = g.sites.filter(pl.col(GrowthCol.BEYOND_NOISE) & (pl.col(GrowthCol.GROWTH) > 0)).head(3).rows(named=True)
    grew = "; ".join(f"{_site(s[GrowthCol.OP], s[GrowthCol.FRAME], s[GrowthCol.SIZE_CLASS])} "
                     f"+{fmt_bytes(s[GrowthCol.GROWTH])}" for s in sites)
    return [Finding(
        code=Code.MEMORY_GREW, severity=Severity.MEDIUM if share >= GREW_MEDIUM_SHARE else Severity.INFO,
        statement=f"{g.b.device}: the peak grew by {fmt_bytes(growth)} from A to B "
                  f"({fmt_bytes(g.a.peak_allocated_bytes)} to {fmt_bytes(g.b.peak_allocated_bytes)}, "
                  f"+{fmt_pct(share)}; noise {fmt_bytes(g.noise_bytes)})"
                  f"{f'; grown most at the peak: {grew}' if grew else ''}{f'; {slack_text}' if slack_grew else ''}.",
        next_step="Look at what B keeps live at its peak from the sites named (tracewhy memory B --json lists them "
                  "all); a buffer held across steps, a larger batch or a cache are the usual causes.",
        evidence={**evidence, "sites": sites},
    )]
