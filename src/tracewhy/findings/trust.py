"""Trust checks: how far the other numbers in this trace can be trusted. Shown first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracewhy.analyses.steps import MARKED, PROFILER_STEP
from tracewhy.findings import thresholds as th
from tracewhy.findings.applicability import run_facts
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.graph_replay import graph_replay_finding
from tracewhy.findings.model import Finding, Severity
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, HOST_KINDS, Kind
from tracewhy.model.trace import NSYS_FORMAT, Trace
from tracewhy.units import fmt_bytes

if TYPE_CHECKING:
    from tracewhy.analyses.account_memory import AccountMemory

#: The torch.profiler activity that records each backend's device work.
_PROFILER_ACTIVITY = {"CUDA": "ProfilerActivity.CUDA", "ROCm": "ProfilerActivity.CUDA", "XPU": "ProfilerActivity.XPU",
                      "MTIA": "ProfilerActivity.MTIA", "HPU": "ProfilerActivity.HPU",
                      "PrivateUse1": "ProfilerActivity.PrivateUse1"}


def empty_trace(trace: Trace) -> Finding | None:
    """A trace with no slices at all: nothing to measure, so every other rule would only say what
    cannot be seen (``diagnose`` runs none of them)."""
    if trace.slices.height:
        return None
    return Finding(
        code=Code.EMPTY_TRACE, severity=Severity.TRUST,
        statement="The trace holds no slices (no ops, kernels or annotations): there is nothing to analyze.",
        next_step="Check that the profiler reached an active step: with torch.profiler.schedule(wait=1, "
                  "warmup=1, active=5), call prof.step() once per iteration, at least wait + warmup + active "
                  "times, and export from on_trace_ready.",
        evidence={"events": trace.meta.event_counts},
    )


def findings(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    t = ctx.trace
    m = t.meta
    c = m.capture
    heavy = [name for name in ("with_stack", "profile_memory", "with_flops", "with_modules") if getattr(c, name)]
    if heavy:
        out.append(Finding(
            code=Code.CAPTURE_HEAVY_OPTIONS, severity=Severity.TRUST,
            statement=f"Captured with {', '.join(heavy)}: the profiler's own work inflates CPU-side durations, so "
                      "use this trace to attribute time, not to measure step time.",
            next_step="Measure throughput from a second capture without them: torch.profiler.profile(activities=..., "
                      "schedule=torch.profiler.schedule(wait=1, warmup=1, active=5)) and no with_stack/profile_memory.",
            evidence={"options": heavy, "source": c.source},
        ))
    n_gpu = t.of_kind(*GPU_ACTIVITY_KINDS).height
    n_host = t.count(*HOST_KINDS)
    if n_gpu == 0:
        out.append(_no_gpu_activity(ctx, n_host))
    elif t.count(Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON) == 0:
        out.append(Finding(
            code=Code.GPU_ONLY_TRACE, severity=Severity.TRUST,
            statement="The trace has GPU activity but no CPU ops: idle gaps cannot be explained by host activity.",
            next_step="Capture with ProfilerActivity.CPU as well as CUDA.",
            evidence={"gpu_activities": n_gpu},
        ))
    steps_result = ctx.steps()
    if steps_result.table.height == 0:
        out.append(Finding(
            code=Code.NO_STEP_MARKERS, severity=Severity.TRUST,
            statement=f"No step markers ({steps_result.marker}): numbers cover the whole trace, warm-up included, "
                      "and cannot be given per step.",
            next_step="Call prof.step() once per iteration under a torch.profiler.schedule, or name a repeated "
                      "annotation: tracewhy diagnose TRACE --step NAME.",
            evidence={"marker": steps_result.marker},
        ))
    elif ctx.options.step_marker is None and steps_result.marker != PROFILER_STEP:
        why = steps_result.note.split(";")[0] if steps_result.note else "see tracewhy steps"
        what = (f"the loop's iterations, found from the trace's structure ({why.removeprefix('no step markers: ')})"
                if steps_result.source != MARKED else
                f"the repeated {steps_result.marker!r} ranges, chosen from the trace's structure ({why})")
        out.append(Finding(
            code=Code.STEP_MARKER_INFERRED, severity=Severity.TRUST,
            statement=f"No ProfilerStep markers: steps are {what}.",
            next_step="If that is not one iteration, name the right one: tracewhy diagnose TRACE --step NAME; or call "
                      "prof.step() once per iteration.",
            evidence={"marker": steps_result.marker, "steps": steps_result.table.height},
        ))
    recorded = steps_result.table.height
    if recorded and steps_result.stats is None and steps_result.warmup >= recorded:
        out.append(Finding(
            code=Code.FEW_STEADY_STEPS, severity=Severity.TRUST,
            statement=f"All {recorded} steps were taken as warm-up ({steps_result.warmup} warm-up steps): no steady "
                      "step is left, so nothing can be given per step.",
            next_step=f"Exclude fewer steps: --warmup {max(recorded - 3, 0)} leaves 3 steady ones (the "
                      "default excludes at most the first), or capture more active steps.",
            evidence={"steps": steps_result.table.height, "warmup": steps_result.warmup},
        ))
    elif steps_result.table.height and (steps_result.stats is None or steps_result.stats.count < th.MIN_STEADY_STEPS):
        count = 0 if steps_result.stats is None else steps_result.stats.count
        out.append(Finding(
            code=Code.FEW_STEADY_STEPS, severity=Severity.TRUST,
            statement=f"Only {count} steady step(s) after {steps_result.warmup} warm-up: per-step figures rest on too "
                      "few samples to separate a real effect from noise.",
            next_step="Capture more active steps: torch.profiler.schedule(wait=1, warmup=1, active=5) or more.",
            evidence={"steps": steps_result.table.height, "warmup": steps_result.warmup},
        ))
    replay = graph_replay_finding(ctx)
    if replay is not None:
        out.append(replay)
    if m.ts_step_ns:
        out.append(Finding(
            code=Code.QUANTISED_TIMES, severity=Severity.TRUST,
            statement=f"Start times are epoch-based microseconds with fractions: a float64 holds them only to "
                      f"{m.ts_step_ns} ns, so gaps and overlaps shorter than that are not resolved (durations "
                      "are exact).",
            next_step="Nothing to change in the run: newer Kineto writes times relative to baseTimeNanoseconds, "
                      "which keeps every nanosecond.",
            evidence={"step_ns": m.ts_step_ns},
        ))
    if m.missing_events:
        out.append(Finding(
            code=Code.INCOMPLETE_TRACE, severity=Severity.TRUST,
            statement="The trace is incomplete: " + "; ".join(m.warnings[:3]),
            next_step="Let the profiler finish (exit the profile context / call prof.stop()) before the job ends; "
                      "read the figures as covering only the events the file holds.",
            evidence={"warnings": list(m.warnings)},
        ))
    elif m.warnings:
        # A complete file whose reader had to skip or reinterpret something (an odd clock, a
        # wrongly typed field): worth knowing, but not a sign that events are missing.
        out.append(Finding(
            code=Code.READER_WARNINGS, severity=Severity.TRUST,
            statement="The reader had to skip or reinterpret part of the file: " + "; ".join(m.warnings[:3]),
            next_step="Read the figures with these in mind; tracewhy info TRACE lists every warning.",
            evidence={"warnings": list(m.warnings)},
        ))
    short = ctx.account_memory()
    if short is not None:
        out.append(_account_skipped(short, m.format))
    # A run timed block by block (blocks-synchronized) is said by findings/blocks.py, from the
    # blocks measurement that the block attribution reads too.
    return out


def _account_skipped(short: AccountMemory, source_format: str) -> Finding:
    """The step account was left out for want of memory (``Context.account_memory``): what it
    needed, what was there, and the two ways to get it: more free memory, or a shorter capture
    (told for the profiler that wrote this one)."""
    shorter = ("capture fewer iterations: nsys profile --capture-range=cudaProfilerApi with "
               "torch.cuda.profiler.start()/stop() around a few of them" if source_format == NSYS_FORMAT else
               "capture fewer active steps: torch.profiler.schedule(wait=1, warmup=1, active=3)")
    return Finding(
        code=Code.ACCOUNT_SKIPPED, severity=Severity.TRUST,
        statement=f"The step account, the critical path and the predicted step times were left out: with them this "
                  f"diagnosis would need about {fmt_bytes(short.with_account_bytes)} more memory "
                  f"({fmt_bytes(short.need_bytes)} of it for the account of {short.slices:,} host and GPU slices), "
                  f"and {fmt_bytes(short.available_bytes)} was available. Findings are ranked by the time each rule "
                  "measures, with no predicted savings.",
        next_step=f"Diagnose it where {fmt_bytes(short.short_bytes)} more memory is free, or {shorter}.",
        evidence={"graph_slices": short.slices, "need_bytes": short.need_bytes,
                  "with_account_bytes": short.with_account_bytes, "available_bytes": short.available_bytes},
    )


def _no_gpu_activity(ctx: Context, n_host: int) -> Finding:
    """A trace without device activity: a CPU-only run (no device properties, no device runtime
    calls either) gets no GPU advice at all; a run that had a device but whose capture left its
    activity out is told which profiler activity records it."""
    facts = run_facts(ctx)
    accelerator = ctx.trace.meta.accelerator
    evidence = {"host_slices": n_host, "accelerator": accelerator, "device_properties": facts.device_properties,
                "device_runtime_calls": facts.device_runtime_calls, "cpu_only": facts.cpu_only}
    if facts.cpu_only:
        return Finding(
            code=Code.CPU_ONLY_TRACE, severity=Severity.TRUST,
            statement="CPU-only capture: no device activity, no device properties and no device runtime calls, so "
                      "the run used no GPU; the findings are host-side only and give no GPU advice.",
            next_step="Nothing to change in the capture for a CPU run; read the host-side findings.",
            evidence=evidence,
        )
    # The backend's own activity: an XPU trace of xpu_runtime calls alone lacked ProfilerActivity.XPU.
    backend = accelerator if accelerator in _PROFILER_ACTIVITY else "CUDA"
    had = "device properties" if facts.device_properties else "device runtime calls"
    return Finding(
        code=Code.CPU_ONLY_TRACE, severity=Severity.TRUST,
        statement=f"The trace has no GPU activity although it has {had}: only host-side findings are possible; "
                  "GPU idle time, launch overhead and overlap cannot be measured.",
        next_step=f"Capture with {_PROFILER_ACTIVITY[backend]} in activities (and a {backend} build of torch) "
                  "to see the device.",
        evidence=evidence,
    )
