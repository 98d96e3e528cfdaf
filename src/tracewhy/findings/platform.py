"""What the TensorBoard profiler plugin used to recommend, with today's names: mixed precision
for tensor-core-eligible kernels, DistributedDataParallel instead of DataParallel, NCCL
instead of gloo on GPUs, and memory near the device's limit."""

from __future__ import annotations

import re

import polars as pl

from tracewhy.analyses.api_names import holding_any
from tracewhy.analyses.memory import MemoryResult
from tracewhy.analyses.name_codes import decide
from tracewhy.analyses.tensor_cores import CANDIDATE, TensorCoresResult, tensor_cores
from tracewhy.findings import thresholds as th
from tracewhy.findings.applicability import RunFacts, gpu_vendor, run_facts
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.memory import ledger_parts, memory_result
from tracewhy.findings.model import Finding, Severity
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col, DeviceCol, MemEventCol
from tracewhy.model.trace import Trace
from tracewhy.units import fmt_bytes
from tracewhy.units import fmt_pct as pct

_DATA_PARALLEL = re.compile(r"^(Broadcast|ReduceAddCoalesced|Gather|Scatter)(Backward)?$|DataParallel\.forward$")
#: What every name _DATA_PARALLEL matches holds: the names are searched only where a column test
#: finds one (an nsys export's 16.6 k distinct names: a search each took 7-10 ms).
_DATA_PARALLEL_LITERALS = ("Broadcast", "ReduceAddCoalesced", "Gather", "Scatter", "DataParallel.forward")


def findings(ctx: Context) -> list[Finding]:
    t = ctx.trace
    if t.of_kind(*GPU_ACTIVITY_KINDS).height == 0:
        return []
    out: list[Finding] = []
    facts = run_facts(ctx)
    k = ctx.kernels()
    tc = tensor_cores(t, gpu_vendor(t)[0])
    without = tc.table.filter(pl.col("verdict") == CANDIDATE)
    share = int(without.get_column("total_ns").sum()) / max(k.total_time_ns, 1)
    # Tensor cores are NVIDIA's (and AMD's matrix cores): no such advice for MTIA, Gaudi or XPU.
    if share >= th.TENSOR_CORE_ELIGIBLE_SHARE and facts.cuda_like:
        top = without.row(0, named=True)
        out.append(Finding(
            code=Code.TENSOR_CORES_UNUSED, severity=Severity.MEDIUM,
            statement=f"{pct(share)} of kernel time is GEMM/convolution kernels that do not run on tensor cores "
                      f"(e.g. {top['name'][:80]}: {top['reason']}).",
            next_step=_tensor_core_advice(tc, top["cc"], facts),
            evidence={"share": round(share, 4), "framework": tc.framework, "framework_rule": tc.framework_rule,
                      "kernels": without.head(5).select("name", "cc", "precision", "precision_rule", "reason",
                                                        "total_ns").to_dicts(),
                      "excluded": tc.table.filter(pl.col("verdict") == "excluded").head(5).select(
                          "name", "reason", "total_ns").to_dicts(),
                      "compute_capability": facts.evidence()["compute_capability"],
                      "compute_capability_rule": facts.compute_capability_rule},
        ))
    devices = t.of_kind(*GPU_ACTIVITY_KINDS).get_column(Col.DEVICE).n_unique()
    dp = _data_parallel_ops(t) if devices > 1 else []
    if dp:
        out.append(Finding(
            code=Code.DATA_PARALLEL_NOT_DDP, severity=Severity.HIGH,
            statement=f"One process drives {devices} GPUs through torch.nn.DataParallel ({', '.join(sorted(dp)[:3])}): "
                      "a single Python thread scatters, replicates and gathers every step.",
            next_step="Use DistributedDataParallel with one process per GPU (torchrun --nproc_per_node=N train.py).",
            evidence={"ops": sorted(dp), "devices": devices},
        ))
    backend = t.meta.distributed.get("backend")
    # NCCL is the answer only where it runs: several ranks on NVIDIA/AMD GPUs (not MTIA or
    # Gaudi, which bring their own collectives, and not a world of one).
    if isinstance(backend, str) and "gloo" in backend and "nccl" not in backend and facts.nccl_fits:
        out.append(Finding(
            code=Code.SLOW_COMM_BACKEND, severity=Severity.HIGH,
            statement="Collectives run on gloo although the job uses GPUs: gloo copies through host memory.",
            next_step="init_process_group(backend='nccl') for GPU tensors (keep gloo only for CPU-side groups).",
            evidence={"backend": backend, "world_size": facts.world_size, "vendor": facts.vendor},
        ))
    out += _memory(ctx)
    return out


def _data_parallel_ops(t: Trace) -> list[str]:
    """The trace's distinct names of torch.nn.DataParallel's ops."""
    names = [n for n in t.slices.get_column(Col.NAME).unique().to_list() if n is not None]
    found = decide(names, lambda n: _DATA_PARALLEL.search(n) is not None, holding_any(_DATA_PARALLEL_LITERALS), False)
    return [n for n, hit in zip(names, found, strict=True) if hit]


def _tensor_core_advice(tc: TensorCoresResult, cc: str | None, facts: RunFacts) -> str:
    """The change that puts these GEMMs on tensor cores, for the framework that launched them
    and the precisions the device's tensor cores take (TF32 and BF16 from sm_80 on; before
    that FP16 only): the kernel's own device first, else the run's lowest capability."""
    if cc is None and facts.compute_capability is not None:
        cc = "{}.{}".format(*facts.compute_capability)
    fp16_only = cc is not None and tuple(int(x) for x in cc.split(".")) < (8, 0)
    gpu = f" (sm_{cc.replace('.', '')} has FP16 tensor cores only: no TF32 or BF16)" if cc and fp16_only else ""
    if tc.framework == "torch":
        if fp16_only:
            return ("Enable mixed precision in float16: with torch.autocast('cuda', dtype=torch.float16): ... and "
                    f"torch.amp.GradScaler('cuda') for training{gpu}.")
        return ("Enable mixed precision: with torch.autocast('cuda', dtype=torch.bfloat16): ... (or float16 "
                "with GradScaler), or at least torch.backends.cuda.matmul.allow_tf32 = True.")
    if tc.framework == "jax":
        if fp16_only:
            return f"Compute the matrix products in float16 (x.astype(jnp.float16)){gpu}."
        return ("Compute the matrix products in bfloat16 (x.astype(jnp.bfloat16)), or let float32 ones use TF32: "
                "jax.default_matmul_precision('tensorfloat32').")
    lib = "CuPy arrays" if tc.framework == "cupy" else "inputs"
    if fp16_only:
        return f"Compute the matrix products in FP16 ({lib} of float16, or cublasGemmEx with CUDA_R_16F){gpu}."
    return (f"Compute the matrix products in BF16/FP16 ({lib} of that type), or let FP32 ones use TF32: "
            "cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH).")


def _memory(ctx: Context) -> list[Finding]:
    t = ctx.trace
    mem = t.memory.filter(pl.col(MemEventCol.DEVICE_TYPE) == 1)  # c10::DeviceType CUDA
    if mem.height == 0 or t.devices.height == 0:
        return []
    peak = mem.group_by(MemEventCol.DEVICE_ID).agg(pl.col(MemEventCol.TOTAL_RESERVED).max().alias("reserved"))
    analysis = memory_result(ctx)
    out = []
    for device, reserved in peak.iter_rows():
        total = t.devices.filter(pl.col(DeviceCol.DEVICE) == device).get_column(DeviceCol.TOTAL_MEM)
        if total.len() == 0 or not total[0] or reserved is None:
            continue
        share = reserved / total[0]
        if share >= th.MEMORY_NEAR_LIMIT:
            ledger, source, fills = _ledger_at_peak(analysis, f"cuda:{device}")
            out.append(Finding(
                code=Code.MEMORY_NEAR_LIMIT, severity=Severity.MEDIUM,
                statement=f"GPU {device} reserved {fmt_bytes(reserved)} of {fmt_bytes(total[0])} ({pct(share)})"
                          f"{fills}: no headroom for a larger batch, and fragmentation can trigger out-of-memory "
                          "errors.",
                next_step="Look at the allocation timeline (torch.cuda.memory._record_memory_history + "
                          "_dump_snapshot); activation checkpointing or a smaller micro-batch frees room.",
                evidence={"device": device, "reserved_bytes": reserved, "total_bytes": total[0], "ledger": ledger,
                          "ledger_source": source},
            ))
    return out


def _ledger_at_peak(analysis: MemoryResult | None, device: str) -> tuple[dict[str, int] | None, str | None, str]:
    """The device's ledger at its allocation peak, where it came from, and the words that name
    its two largest parts ("" when the analysis has no such device)."""
    d = next((x for x in analysis.devices if x.device == device), None) if analysis is not None else None
    if analysis is None or d is None:
        return None, None, ""
    top = ledger_parts(d.ledger)[:2]
    words = " and ".join(f"{k} ({fmt_bytes(v)})" for k, v in top)
    return d.ledger, analysis.ledger_source, f"; at the allocation peak mostly {words}" if top else ""
