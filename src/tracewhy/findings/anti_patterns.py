"""Known training-loop mistakes (``analyses/anti_patterns.py`` measures them), each stated with
its user line when the trace has stacks and priced by the step account's prediction: the
optimizer's step replayed multi-tensor (``MultiTensorOptimizer``) or with its gradients set to
None (``SetGradsToNone``), the same replays ``explain`` makes the finding's recoverable time
from and ``bench/calibrate.py`` measures, so the statement, the ranking and the calibration
give one number; a tensor made on the host and copied is priced by the step replayed without
the copy (``BuildOnDevice``). A convolution bias cancelled by batch norm is stated without a
price (its time is inside the convolution's and the optimizer's own ops), and so are unaligned
half-precision GEMMs (their kernel time is the bound, not a prediction).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

import numpy as np

from tracewhy.analyses.anti_patterns import (
    AntiPatternsResult,
    ConvBias,
    HostBuiltCopy,
    OptimizerBlock,
    UnalignedGemm,
    anti_patterns,
)
from tracewhy.analyses.what_if import Prediction
from tracewhy.analyses.what_if_edits import Fix, MultiTensorOptimizer, RemoveRecompute
from tracewhy.analyses.what_if_host_edits import FIRST_TOUCH_PER_ZEROING, BuildOnDevice, SetGradsToNone
from tracewhy.findings import source_line as sl
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.model.schema import GPU_ACTIVITY_KINDS
from tracewhy.units import fmt_ns as ms
from tracewhy.units import fmt_pct

#: The findings that predict with a fix of their own (``own_fixes``), not their part's.
OWN_FIX_CODES: Final = frozenset({Code.OPTIMIZER_SINGLE_TENSOR, Code.ZERO_GRAD_NOT_NONE, Code.TENSOR_BUILT_ON_HOST,
                                  Code.ACTIVATION_RECOMPUTE, Code.TENSOR_GROWN_BY_CONCAT, Code.PER_SAMPLE_LOOP,
                                  Code.REDUCE_EVERY_MICROBATCH, Code.AUTOGRAD_IN_INFERENCE})
#: Of those, the ones ``own_fixes`` gives no fix: they name their part and are never priced, so
#: never graded by a saving (the time autograd's recording takes is inside each op, and the trace
#: has no op run without it).
UNPRICED_CODES: Final = frozenset({Code.AUTOGRAD_IN_INFERENCE})


def own_fixes(ctx: Context, code: Code) -> tuple[Fix, ...]:
    """The fix a finding of ``code`` predicts with (``explain`` replays the same one for its
    recoverable time); () for a code not in OWN_FIX_CODES."""
    if code == Code.OPTIMIZER_SINGLE_TENSOR:
        return (MultiTensorOptimizer(),)
    if code == Code.ZERO_GRAD_NOT_NONE:
        return (SetGradsToNone(),)
    if code == Code.ACTIVATION_RECOMPUTE:
        return (RemoveRecompute(),)
    if code == Code.REDUCE_EVERY_MICROBATCH:
        from tracewhy.analyses.backward_passes import ReduceOnce

        return (ReduceOnce(),)
    if code == Code.TENSOR_GROWN_BY_CONCAT:
        from tracewhy.findings.tensor_growth import fix  # it prices with priced() from here

        return fix(ctx)
    if code == Code.PER_SAMPLE_LOOP:
        from tracewhy.findings import sample_loops

        return sample_loops.fix(ctx)
    if code == Code.TENSOR_BUILT_ON_HOST:
        ops = tuple(sorted(i for h in anti_patterns_result(ctx).host_built for i in h.copy_ids))
        return (BuildOnDevice(ops),) if ops else ()
    return ()


def settled(f: Finding) -> Finding:
    """``f`` after ``explain`` priced it: a saving under ANTI_PATTERN_MIN_SHARE of the step is
    said as negligible, with nothing recoverable and severity info (the pattern is still named);
    one the replay makes no shorter gets the same, its statement having said so."""
    measured = int(f.evidence.get("measured_step_ns") or 0)
    if f.predicted_step_ns is None or measured <= 0:
        return f
    if f.recoverable_ns_per_step >= th.ANTI_PATTERN_MIN_SHARE * measured:
        return f
    if f.predicted_step_ns >= measured:  # the statement says the step is no shorter
        return replace(f, severity=Severity.INFO, recoverable_ns_per_step=0)
    return replace(f, severity=Severity.INFO, recoverable_ns_per_step=0,
                   statement=f"{f.statement} Under {fmt_pct(th.ANTI_PATTERN_MIN_SHARE)} of the step, that is "
                             "negligible here.")


def anti_patterns_result(ctx: Context) -> AntiPatternsResult:
    return ctx.cached("anti_patterns", lambda: anti_patterns(ctx.trace, ctx.host_tree()))


def findings(ctx: Context) -> list[Finding]:
    r = anti_patterns_result(ctx)
    steps = max(ctx.steps().table.height, 1)
    out: list[Finding] = []
    for block in r.optimizer:
        if block.is_step and not block.multi_tensor and block.repeated_per_call >= th.OPTIMIZER_LOOP_MIN_REPEATS:
            out.append(_single_tensor(ctx, block))
        if not block.is_step and block.zeroed_per_call > 0:
            out.append(_zero_grad(ctx, block))
    out += [_conv_bias(ctx, c, steps) for c in r.conv_bias]
    built = [h for h in r.host_built if len(h.copy_ids) >= steps]  # every step
    if built:
        out.append(_host_built(ctx, built, steps))
    if r.unaligned_gemms:
        out.append(_unaligned(ctx, list(r.unaligned_gemms), steps))
    return out


def _single_tensor(ctx: Context, block: OptimizerBlock) -> Finding:
    top = ", ".join(f"{name} {n:g}" for name, n in block.per_call[:4])
    line = sl.line_above(ctx, f"anti:{block.name}", lambda: np.asarray(block.ids, dtype=np.int64))
    ops = len(block.ops) / block.calls
    p, saving = priced(ctx, Code.OPTIMIZER_SINGLE_TENSOR, "with a multi-tensor optimizer")
    return Finding(
        code=Code.OPTIMIZER_SINGLE_TENSOR, severity=priced_severity(p),
        statement=f"{block.name} updates one parameter at a time{sl.named(line, ' (', ')')}: {ops:,.0f} ops per "
                  f"call, the most repeated {top} times per call, and no op in it takes a tensor list "
                  f"(a multi-tensor update would).{saving}",
        next_step="Construct the optimizer with foreach=True (one op per tensor list, any device) or fused=True "
                  "(one kernel for all parameters; CUDA and, for Adam/AdamW/SGD, CPU)"
                  + sl.named(line, " at ", "") + ".",
        evidence={"block": block.name, "calls": block.calls, "ops_per_call": ops,
                  "repeated_per_call": block.repeated_per_call,
                  "per_call": [{"op": name, "calls": n} for name, n in block.per_call[:8]], **prediction_evidence(p),
                  **sl.evidence(line)},
    )


def _zero_grad(ctx: Context, block: OptimizerBlock) -> Finding:
    line = sl.line_above(ctx, f"anti:{block.name}", lambda: np.asarray(block.ids, dtype=np.int64))
    p, saving = priced(ctx, Code.ZERO_GRAD_NOT_NONE, "with the gradients set to None")
    cpu_only = ctx.trace.of_kind(*GPU_ACTIVITY_KINDS).height == 0
    kept = None
    allocator = ""
    if p is not None and p.changed and cpu_only:
        kept, saving = _kept_in_process(ctx, p, saving)
        allocator = ("; on a CPU run, keep the freed gradients in the process so that they come back without page "
                     f"faults: {ALLOCATOR_ENV}, or jemalloc or tcmalloc through LD_PRELOAD")
    return Finding(
        code=Code.ZERO_GRAD_NOT_NONE, severity=priced_severity(p),
        statement=f"{block.name} zeroes {block.zeroed_per_call:,.0f} gradients per call{sl.named(line, ' (', ')')} "
                  f"instead of setting them to None: zero_grad(set_to_none=False).{saving}",
        next_step="Call zero_grad() (set_to_none=True, the default since PyTorch 2.0)" + sl.named(line, " at ", "")
                  + "; code that reads .grad between steps must then accept None" + allocator + ".",
        evidence={"block": block.name, "calls": block.calls, "zeroed_per_call": block.zeroed_per_call,
                  "cpu_only": cpu_only, **prediction_evidence(p), **sl.evidence(line),
                  **({"predicted_step_ns_without_faults": kept.predicted_ns} if kept is not None else {})},
    )


#: glibc's malloc settings that keep freed memory in the process: a fixed mmap threshold (32 MiB,
#: its largest on 64-bit) keeps large blocks on the heap instead of mapping and unmapping them,
#: and a trim threshold above the gradients keeps free() from handing the heap's top back. Both:
#: with either alone the calibration program (scripts/gen_traces/calibration.py, zero_grad_none)
#: still faulted pages every step (docs/account.md, Calibration).
ALLOCATOR_ENV: Final = "MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456"


def _kept_in_process(ctx: Context, p: Prediction, saving: str) -> tuple[Prediction, str]:
    """On a CPU-only trace the replay charges the gradients' pages faulted in again
    (``SetGradsToNone``); whether they are depends on glibc's heap, which the trace does not
    show. The same replay with no fault says what the fix saves when the memory stays."""
    kept = ctx.predict((SetGradsToNone(first_touch_per_zeroing=0.0),))
    return kept, saving + (
        " That replay assumes what a CPU run may or may not do: that the freed gradients come back on fresh pages, "
        f"each 4 KiB page a fault the kernel zeroes, priced at {FIRST_TOUCH_PER_ZEROING:g}x a warm zero_() of "
        "the same bytes (bench/first_touch.py measures a machine). Whether they do depends on glibc's heap: "
        "in one process the first run of the calibration program faulted every gradient page each step and the "
        f"later runs none. With the memory kept in the process the step is predicted at {ms(kept.predicted_ns)}"
        f" ({ms(p.measured_ns - kept.predicted_ns)} saved: the zeroing and the accumulation into old gradients). "
        "On a GPU the caching allocator keeps the freed blocks.")


def _conv_bias(ctx: Context, c: ConvBias, steps: int) -> Finding:
    line = sl.line_above(ctx, f"anti:{c.conv}:{c.channels}", lambda: np.asarray(c.conv_ids, dtype=np.int64))
    return Finding(
        code=Code.CONV_BIAS_BEFORE_BATCH_NORM, severity=Severity.LOW,
        statement=f"{c.conv} with a bias of {c.channels} channels feeds {c.norm}{sl.named(line, ' (', ')')}, "
                  f"{c.calls / steps:g} per step: batch norm subtracts each channel's mean, which cancels the "
                  "bias, so its add, its gradient and its update are wasted. Their time is inside the "
                  "convolution's and the optimizer's ops, so the trace does not price it apart.",
        next_step="Construct that convolution with bias=False" + sl.named(line, " (", ")") + ".",
        evidence={"conv": c.conv, "norm": c.norm, "channels": c.channels, "calls": c.calls,
                  "calls_per_step": c.calls / steps, **sl.evidence(line)},
    )


def _host_built(ctx: Context, built: list[HostBuiltCopy], steps: int) -> Finding:
    line = sl.line_above(ctx, "anti:host_built", lambda: np.asarray([i for h in built for i in h.factory_ids],
                                                                    dtype=np.int64))
    what = "; ".join(f"{h.factory} then {h.copy_op}" + (f" of a {list(h.shape)} tensor" if h.shape else "")
                     + f" {len(h.copy_ids) / steps:g} per step" for h in built)
    p, saving = priced(ctx, Code.TENSOR_BUILT_ON_HOST, "with those tensors made on the device")
    return Finding(
        code=Code.TENSOR_BUILT_ON_HOST, severity=priced_severity(p),
        statement=f"Tensors are made on the host and copied to the device every step{sl.named(line, ' (', ')')}: "
                  f"{what}; the copy op launches an HtoD copy of what the creation op just made.{saving}",
        next_step="Create them on the device (torch.randn(..., device='cuda'), torch.zeros(..., device=x.device)), "
                  "or make constant ones once outside the loop" + sl.named(line, " (", ")") + ".",
        evidence={"copies": [{"factory": h.factory, "copy_op": h.copy_op,
                              "shape": list(h.shape) if h.shape else None, "calls": len(h.copy_ids),
                              "bytes": h.bytes} for h in built],
                  "calls": sum(len(h.copy_ids) for h in built), **prediction_evidence(p), **sl.evidence(line)},
    )


def _unaligned(ctx: Context, gemms: list[UnalignedGemm], steps: int) -> Finding:
    """Their kernels' time per step is the most aligning them could save; no replay says how
    much less an aligned GEMM takes, so nothing is claimed."""
    line = sl.line_above(ctx, "anti:gemms", lambda: np.asarray([i for g in gemms for i in g.ids], dtype=np.int64))
    kernel_ns = sum(g.kernel_ns for g in gemms) / steps
    step_ns = ctx.measured_step_ns() if ctx.account() is not None else 0
    share = f" ({fmt_pct(kernel_ns / step_ns)} of the step)" if step_ns else ""
    shown = "; ".join(f"{g.op} {g.dtype.removeprefix('c10::')} M={g.m} K={g.k} N={g.n} x{len(g.ids) / steps:g} "
                      f"({ms(g.kernel_ns / steps)})" for g in gemms[:3])
    more = f"; {len(gemms) - 3} more shapes" if len(gemms) > 3 else ""
    minor = step_ns > 0 and kernel_ns < th.ANTI_PATTERN_MIN_SHARE * step_ns
    return Finding(
        code=Code.GEMM_DIMS_UNALIGNED, severity=Severity.INFO if minor else Severity.LOW,
        statement=f"Half-precision GEMMs with K or N not a multiple of 8{sl.named(line, ' (', ')')}: {shown}{more}. "
                  "Tensor-core kernels read 16-byte rows, so cuBLAS falls back to slower kernels for them (on GPUs "
                  f"before Ampere, to no tensor cores at all). Their kernels take {ms(kernel_ns)} per step{share}, "
                  "the most aligning them can save; the trace does not say how much less aligned ones would take.",
        next_step="Pad the dimension to a multiple of 8: a vocabulary or hidden size in the weights (HF "
                  "resize_token_embeddings(..., pad_to_multiple_of=8)), a sequence length in the inputs "
                  "(tokenizer pad_to_multiple_of=8), the batch size where it is K (weight gradients).",
        evidence={"gemms": [{"op": g.op, "dtype": g.dtype, "m": g.m, "k": g.k, "n": g.n, "calls": len(g.ids),
                             "kernel_ns": g.kernel_ns} for g in gemms],
                  "calls": sum(len(g.ids) for g in gemms), "kernel_ns_per_step": kernel_ns, **sl.evidence(line)},
    )


def priced(ctx: Context, code: Code, with_fix: str) -> tuple[Prediction | None, str]:
    """The step replayed with the finding's fix (``own_fixes``), and the sentence that says it
    ("" without an account): every finding in OWN_FIX_CODES prices itself so."""
    if ctx.account() is None:
        return None, ""
    p = ctx.predict(own_fixes(ctx, code))
    if not p.changed:
        return p, ""
    if p.saved_ns > 0:
        return p, (f" Replayed {with_fix}, the step is predicted at {ms(p.predicted_ns)} against "
                   f"{ms(p.measured_ns)}: {ms(p.saved_ns)} ({fmt_pct(p.saved_ns / max(p.measured_ns, 1))}) "
                   "saved per step.")
    return p, f" Replayed {with_fix}, the step is no shorter ({ms(p.predicted_ns)} against {ms(p.measured_ns)})."


def priced_severity(p: Prediction | None) -> Severity:
    if p is not None and p.saved_ns >= th.ANTI_PATTERN_MEDIUM_SHARE * max(p.measured_ns, 1):
        return Severity.MEDIUM
    return Severity.LOW if p is None or p.saved_ns >= th.ANTI_PATTERN_MIN_SHARE * max(p.measured_ns, 1) \
        else Severity.INFO


def prediction_evidence(p: Prediction | None) -> dict[str, object]:
    if p is None:
        return {}
    return {"predicted_step_ns": p.predicted_ns, "measured_step_ns": p.measured_ns, "saved_ns": p.saved_ns}
