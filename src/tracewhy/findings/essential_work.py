"""``essential-work`` (emitted with the other account findings): a step whose largest part is
kernels the step must run, said with the kernel families' shares and, where the trace's op shapes
allow (``analyses.roofline_ops``), at what fraction of the device's roof those ops run (memory
bandwidth or compute, whichever bounds each); where they do not, why, in one clause, and the
kernel profiler that measures it instead.
"""

from __future__ import annotations

from typing import Any, Final

import polars as pl

from tracewhy.analyses.account import AccountCol, AccountResult
from tracewhy.analyses.account_names import PartKind, PartName
from tracewhy.analyses.graph_replay import graph_launch_rows
from tracewhy.analyses.roofline_ops import OpRoofCol, OpRooflineMeasures, measure_op_roofline
from tracewhy.findings import thresholds as th
from tracewhy.findings.applicability import gpu_vendor
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.findings.where_step_goes import GPU_PART_KINDS
from tracewhy.units import fmt_ns as ms
from tracewhy.units import fmt_pct

#: Kernel families the statement names (the evidence has all of them).
_NAMED_FAMILIES: Final = 3


def essential_work(ctx: Context, account: AccountResult) -> Finding | None:
    """The finding when the account's largest part (the unrecorded wait and ``unexplained``
    aside) is kernels; None otherwise."""
    parts = account.parts.filter((pl.col(AccountCol.KIND) != PartKind.UNEXPLAINED)
                                 & (pl.col(AccountCol.PART) != PartName.UNRECORDED_GPU))
    if parts.height == 0 or parts.row(0, named=True)[AccountCol.KIND] != PartKind.KERNELS:
        return None
    kernels = parts.filter(pl.col(AccountCol.KIND) == PartKind.KERNELS)
    whole, of = account.mean_step_ns, "of the step"
    if account.unrecorded is not None:
        gpu = parts.filter(pl.col(AccountCol.KIND).is_in(GPU_PART_KINDS))
        whole = int(gpu.get_column(AccountCol.NS_PER_STEP).sum())
        of = f"of the GPU's {ms(whole)} on the path (from its first recorded work)"
    families = [(str(p).removeprefix("kernels: "), int(ns)) for p, ns in
                kernels.select(AccountCol.PART, AccountCol.NS_PER_STEP).iter_rows()]
    total = sum(ns for _, ns in families)
    named = ", ".join(f"{f} {fmt_pct(ns / max(whole, 1))}" for f, ns in families[:_NAMED_FAMILIES])
    clause, next_step, roof = _efficiency(ctx)
    return Finding(
        code=Code.ESSENTIAL_WORK, severity=Severity.INFO,
        statement=f"{fmt_pct(min(total / max(whole, 1), 1.0))} {of} is kernels the step must run: {named}; "
                  f"{clause}.",
        next_step=next_step,
        part=None,
        evidence={"kernel_ns": total, "whole_ns": whole,
                  "families": [{"family": f, "ns_per_step": ns, "share": round(ns / max(whole, 1), 4)}
                               for f, ns in families], **roof},
    )


def _efficiency(ctx: Context) -> tuple[str, str, dict[str, Any]]:
    """The efficiency clause, the next step, and the evidence behind them."""
    m: OpRooflineMeasures = ctx.cached("op-roofline", lambda: measure_op_roofline(ctx.trace))
    placed = m.instances.filter(pl.col(OpRoofCol.ROOF_NS).is_not_null() & (pl.col(OpRoofCol.GPU_NS) > 0))
    vendor, _ = gpu_vendor(ctx.trace)
    profiler = ("profile the top kernels with ROCm Compute Profiler (rocprof-compute profile -n top -k NAME -- python "
                "run.py; tracewhy roofline reads Nsight Compute reports only)" if vendor == "amd" else
                "profile the top kernels with Nsight Compute and read the report with tracewhy roofline "
                "(tracewhy capture ncu --kernel NAME -- python run.py)")
    if m.peaks is None or m.covered_ns < th.ESSENTIAL_ROOF_MIN_COVER * m.gpu_time_ns or placed.height == 0:
        why = _why_not(ctx, m)
        return (f"their efficiency cannot be computed from this trace: {why}", f"To see how far from peak they run, "
                f"{profiler}.", {"roof_fraction": None, "roof_reason": why})
    gpu = int(placed.get_column(OpRoofCol.GPU_NS).sum())
    roof = float(placed.get_column(OpRoofCol.ROOF_NS).sum())
    memory = float(placed.get_column(OpRoofCol.MEMORY_NS).sum())
    compute = float(placed.get_column(OpRoofCol.COMPUTE_NS).sum())
    bound = "memory bandwidth" if memory >= compute else "compute"
    peak = (f"{m.peaks.dram_bytes_per_s / 1e12:.2f} TB/s" if bound == "memory bandwidth" else "its compute peaks")
    by_category = {str(c): round(float(r) / int(g), 4) for c, r, g in placed.group_by("category").agg(
        pl.col(OpRoofCol.ROOF_NS).sum(), pl.col(OpRoofCol.GPU_NS).sum()).sort("category").iter_rows()}
    gemm = f" (GEMMs {fmt_pct(by_category['gemm'])})" if "gemm" in by_category else ""
    clause = (f"the ops with modelled shapes ({fmt_pct(m.covered_ns / max(m.gpu_time_ns, 1))} of GPU time) run at "
              f"{fmt_pct(roof / gpu)} of {m.peaks.name}'s roof{gemm}, most of it bound by {bound} ({peak})")
    return clause, f"tracewhy roofline TRACE lists the ops furthest below their roof; then {profiler}.", {
        "roof_fraction": round(roof / gpu, 4), "roof_reason": None, "bound": bound,
        "covered_ns": m.covered_ns, "gpu_time_ns": m.gpu_time_ns, "roof_fraction_by_category": by_category,
        "device_name": m.device_name}


def _why_not(ctx: Context, m: OpRooflineMeasures) -> str:
    """Why the ops' roof fraction is not given, in one clause."""
    replayed = graph_launch_rows(ctx.trace).size > 0
    covered = fmt_pct(m.covered_ns / max(m.gpu_time_ns, 1))
    if replayed and m.covered_ns < th.ESSENTIAL_ROOF_MIN_COVER * m.gpu_time_ns:
        return (f"its kernels were replayed from a CUDA/HIP graph whose capture the trace does not hold, so no op "
                f"with shapes is known for them (ops with shapes cover {covered} of GPU time)")
    if not m.has_input_shapes:
        return "it was captured without record_shapes=True, so no op has shapes"
    if m.peaks is None:
        return f"no peaks are known for {m.device_name or 'a GPU the trace does not name'}"
    return f"ops with shapes tracewhy models cover only {covered} of GPU time"
