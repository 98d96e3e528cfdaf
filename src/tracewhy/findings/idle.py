"""GPU idle findings: low utilization overall, and one finding per idle class that matters,
each with what the host was doing and the fix to try."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from tracewhy.analyses.gaps import GapClass, GapCol, class_col
from tracewhy.analyses.host_activity import Flag
from tracewhy.analyses.input import input_pipeline
from tracewhy.analyses.intervals import union
from tracewhy.analyses.launch import launch
from tracewhy.analyses.overlap import OverlapCol
from tracewhy.analyses.source_lines import SourceLine
from tracewhy.analyses.stats import mean_of
from tracewhy.analyses.steps import StepCol, WindowCol
from tracewhy.findings import source_line as sl
from tracewhy.findings import thresholds as th
from tracewhy.findings.applicability import device_allocation_advice, gpu_vendor, run_facts
from tracewhy.findings.basis import Basis, basis, busy_parts, busy_phrase
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.idle_host import before_trace_ns, host_reading
from tracewhy.findings.input_advice import loader_advice, loader_evidence
from tracewhy.findings.model import Finding, Severity
from tracewhy.findings.overlap import overlap_result
from tracewhy.findings.playbook import ncu_command, nsys_command, shell
from tracewhy.units import fmt_ns as ms
from tracewhy.units import fmt_pct as pct

#: The finding of each idle class (one per GapClass), which gpu-low-utilization sums up.
CLASS_FINDINGS = (Code.GPU_IDLE_INPUT, Code.GPU_IDLE_SYNC, Code.GPU_IDLE_LAUNCH, Code.GPU_IDLE_HOST,
                  Code.GPU_IDLE_ALLOCATOR, Code.GPU_IDLE_COMM_WAIT, Code.GPU_IDLE_GRAPH_LAUNCH,
                  Code.GPU_IDLE_DEPENDENCY, Code.GPU_IDLE_UNTRACED, Code.GPU_IDLE_SHORT)
#: The part of idle time in gaps shorter than the minimum gap (--min-gap), in breakdowns.
SHORT = "short"
#: The part of idle time before the device's first activity and after its last (without steps).
OUTSIDE = "outside"
#: The part of dependency idle that is the wait of the window's first launch on GPU work the
#: trace did not record (``gpu-work-before-trace``, the account's ``unrecorded``): no stream,
#: event or copy engine of the run to look at.
BEFORE_TRACE = "before_trace"
#: How a part of idle time reads in a statement, where its key alone would not say what it is.
PART_LABEL = {OUTSIDE: "before or after all GPU work", BEFORE_TRACE: "GPU work before the trace"}


def findings(ctx: Context) -> list[Finding]:
    b = basis(ctx)
    if b.device is None or b.window_ns <= 0:
        return _input_without_gpu(ctx)
    out: list[Finding] = []
    idle_share = b.share(b.idle_ns)
    before = before_trace_ns(ctx, b)
    class_ns = {**b.class_ns, GapClass.DEPENDENCY.value: b.class_ns[GapClass.DEPENDENCY.value] - before}
    # Idle in gaps too short to explain one by one is a part of its own, so the parts add up.
    idle_parts = {**class_ns, SHORT: b.short_ns, OUTSIDE: b.outside_ns, BEFORE_TRACE: before}
    breakdown = {c: round(v) for c, v in idle_parts.items() if v > 0}
    if b.active_share < th.LOW_UTILIZATION:
        parts = sorted(((v, c) for c, v in idle_parts.items() if v > 0), reverse=True)[:3]
        why = ", ".join(f"{PART_LABEL.get(c, c)} {pct(b.share(v))}" for v, c in parts)
        split = busy_parts(ctx)
        out.append(Finding(
            code=Code.GPU_LOW_UTILIZATION,
            # A summary: it gives back no time of its own, the idle classes it sums up do and
            # carry the severity (medium and high need recoverable time: findings/consolidate.py).
            severity=Severity.INFO,
            statement=f"GPU {b.device} is active {b.of_window(b.busy_ns)} "
                      f"({ms(b.busy_ns)} of {ms(b.window_ns)} {b.unit}; {busy_phrase(b, split)}); "
                      f"idle {ms(b.idle_ns)}: {why}.",
            next_step="See the gaps: tracewhy gaps TRACE --top 20 (largest idle intervals with the host activity in "
                      "each).",
            evidence={"device": b.device, "active_share": round(b.active_share, 4), "window_ns": round(b.window_ns),
                      "idle_ns": round(b.idle_ns), "idle_share": round(idle_share, 4), "idle_by_class_ns": breakdown,
                      "busy_by_kind_ns": split, "steps": b.steps},
            see=CLASS_FINDINGS, parts=CLASS_FINDINGS,
        ))
    if b.active_share >= th.SATURATED_UTILIZATION:
        out.append(_saturated(ctx, b))
    for cls, make in (
        (GapClass.INPUT, _input), (GapClass.SYNC, _sync), (GapClass.LAUNCH, _launch), (GapClass.HOST, _host),
        (GapClass.ALLOCATOR, _allocator), (GapClass.COMM, _comm), (GapClass.GRAPH, _graph),
        (GapClass.DEPENDENCY, _dependency), (GapClass.OTHER, _other),
    ):
        ns = class_ns[cls.value]
        if ns >= th.IDLE_CLASS_MIN_NS and b.share(ns) >= th.IDLE_CLASS_MIN_SHARE:
            f = make(ctx, b, ns)
            # The largest gaps of the class, for the Perfetto export and the report to draw.
            out.append(replace(f, evidence={**f.evidence, "time_ranges_ns": _ranges(ctx, cls)}))
    if b.short_ns >= th.IDLE_CLASS_MIN_NS and b.share(b.short_ns) >= th.IDLE_CLASS_MIN_SHARE:
        out.append(_short(ctx, b))
    return out


def _short(ctx: Context, b: Basis) -> Finding:
    """Idle in gaps too short to explain one by one: their number says what they are."""
    min_gap = ctx.gaps().min_gap_ns
    return Finding(
        code=Code.GPU_IDLE_SHORT,
        severity=Severity.MEDIUM,
        statement=f"GPU {b.device} idles {ms(b.short_ns)} {b.unit} ({b.of_window(b.short_ns)}) in "
                  f"{b.short_gaps:,.0f} gaps shorter than {ms(min_gap)} each: kernels too short to keep it fed, each "
                  "launched or waiting just as the one before ends.",
        next_step="Fewer, longer kernels: fuse them (torch.compile) or replay the sequence as a CUDA/HIP graph; "
                  "tracewhy kernels TRACE shows the short ones; tracewhy gaps TRACE --min-gap 0 lists every gap.",
        recoverable_ns_per_step=round(b.short_ns),
        evidence={"device": b.device, "short_idle_ns": round(b.short_ns), "short_gaps": round(b.short_gaps),
                  "min_gap_ns": min_gap, "steps": b.steps},
    )


def _saturated(ctx: Context, b: Basis) -> Finding:
    """The state users work towards: nothing on the host side to recover, so say where the time
    is (kernels, copies, or communication no compute hides) and, for kernels, which kernel
    profiler fits the GPU."""
    exposed = _exposed_comm_ns(ctx, b)
    comm = ""
    if b.share(exposed) >= th.IDLE_CLASS_MIN_SHARE:
        comm = f"; {ms(exposed)} of that ({b.of_window(exposed)}) is communication with no compute under it"
    split = busy_parts(ctx)
    copies = split.get("copies", 0) + split.get("memsets", 0) > split.get("kernels", 0)
    vendor, rule = gpu_vendor(ctx.trace)
    if copies:
        then = ("fewer or faster copies, not host-side changes (copy-bound says how fast they run)." if not comm else
                "hide that communication under compute first, then cut the copies.")
        next_step = ("See the copies beside compute: tracewhy overlap TRACE; tracewhy account TRACE lists them with "
                     "their bytes and bandwidth.")
    else:
        then = ("hide that communication under compute first, then make the kernels faster." if comm else
                "a faster step needs less GPU work, not host-side changes.")
        next_step = f"Find the kernels that take the time: tracewhy kernels TRACE --top 20; then {_profile(vendor)}."
    return Finding(
        code=Code.GPU_SATURATED,
        severity=Severity.INFO,
        statement=f"GPU {b.device} is busy {b.of_window(b.busy_ns)} ({ms(b.busy_ns)} of {ms(b.window_ns)} {b.unit}; "
                  f"{busy_phrase(b, split)}){comm}: it never waits on the host, so {then}",
        next_step=next_step,
        evidence={"device": b.device, "active_share": round(b.active_share, 4), "window_ns": round(b.window_ns),
                  "busy_ns": round(b.busy_ns), "idle_ns": round(b.idle_ns), "comm_exposed_ns": round(exposed),
                  "busy_by_kind_ns": split, "steps": b.steps, "vendor": vendor, "vendor_rule": rule},
        see=((Code.COMM_EXPOSED,) if comm else ()) + ((Code.COPY_BOUND,) if copies else ()),
    )


def _profile(vendor: str | None) -> str:
    """How to profile the top kernels with the kernel profiler of the GPU's vendor."""
    if vendor == "amd":
        return ("profile the top ones with ROCm Compute Profiler (rocprof-compute profile -n top -k NAME -- "
                "python train.py; tracewhy reads Nsight Compute reports only)")
    return ("profile the top ones with Nsight Compute (tracewhy capture ncu --kernel NAME -- python train.py "
            f"runs `{shell(ncu_command(['python', 'train.py'], 'NAME', name='top'))}` and reads top.ncu-rep "
            "with tracewhy roofline)")


def _exposed_comm_ns(ctx: Context, b: Basis) -> float:
    """Communication with no compute under it on the basis device, per step (or over the trace)."""
    r = overlap_result(ctx)
    rows = (r.steady if b.per_steps and r.steady.height else r.devices).filter(pl.col(OverlapCol.DEVICE) == b.device)
    return float(rows.get_column(OverlapCol.COMM_EXPOSED).sum()) if rows.height else 0.0


def _ranges(ctx: Context, cls: GapClass, n: int = 20) -> list[list[int]]:
    g = ctx.gaps().gaps.filter(pl.col(GapCol.GAP_CLASS) == cls.value).sort(GapCol.DUR, descending=True).head(n)
    return [[int(s), int(s + d)] for s, d in g.select(GapCol.START, GapCol.DUR).iter_rows()]


def _severity(b: Basis, ns: float) -> Severity:
    return Severity.HIGH if b.share(ns) >= th.HIGH_SEVERITY_SHARE else Severity.MEDIUM


def _top_gaps(ctx: Context, cls: GapClass, column: str, n: int = 3) -> list[str]:
    g = ctx.gaps().gaps.filter(pl.col(GapCol.GAP_CLASS) == cls.value)
    # Ties by name: group_by's order is arbitrary, and equal sums are common where steps repeat
    # (an inflated capture's copies of one step: the third name changed from run to run).
    top = (g.filter(pl.col(column).is_not_null()).group_by(column).agg(pl.col(class_col(cls)).sum())
           .sort([class_col(cls), column], descending=[True, False]).head(n))
    return [str(v) for v in top.get_column(column).to_list()]


def _input(ctx: Context, b: Basis, ns: float) -> Finding:
    ip = input_pipeline(ctx.steps(), ctx.host(), ctx.busy())
    steady = ip.per_step.filter(pl.col(StepCol.STEADY))
    loader = mean_of(steady.get_column("dataloader_ns"))
    window = mean_of(steady.get_column(WindowCol.WINDOW))
    line = sl.input_line(ctx)
    facts = run_facts(ctx)
    return Finding(
        code=Code.GPU_IDLE_INPUT, severity=_severity(b, ns),
        statement=f"The GPU waits on the input pipeline for {ms(ns)} {b.unit} ({b.of_window(ns)}): "
                  f"the host is inside DataLoader __next__ while the GPU has nothing to run"
                  + (f" (DataLoader takes {ms(float(loader))} per step)." if loader else ".") + _fetched_under(line),
        next_step=loader_advice(facts, loader or 0.0, window),
        recoverable_ns_per_step=round(ns),
        evidence={"idle_in_dataloader_ns": round(ns), "fetches": ip.fetches,
                  "dataloader_ns_per_step": None if loader is None else round(loader), **sl.evidence(line),
                  **loader_evidence(facts, loader or 0.0, window)},
    )


def _fetched_under(line: SourceLine | None) -> str:
    """The sentence naming the user line under which the DataLoader's fetches spend their time."""
    return sl.named(line, " Most of the fetch time is under ", ".")


def _sync_sites(calls: pl.DataFrame, n: int = 3) -> list[str]:
    """The ``n`` places (Python line, else op, else annotation) whose syncs blocked longest, ties
    by name (``_top_gaps``)."""
    where = (calls.with_columns(pl.coalesce("python", "op", "annotation").alias("site"))
             .group_by("site").agg(pl.len().alias("n"), pl.col("blocked_ns").sum())
             .sort(["blocked_ns", "site"], descending=[True, False], nulls_last=True).head(n))
    return [f"{r['site'] or 'outside any op'} ({r['n']}x)" for r in where.iter_rows(named=True)]


def _sync(ctx: Context, b: Basis, ns: float) -> Finding:
    sy = ctx.syncs()
    calls = sy.calls
    per_step = sy.per_step.filter(pl.col(StepCol.STEADY))
    n_per_step = mean_of(per_step.get_column("syncs")) or float(calls.height)
    sites = _sync_sites(calls)
    line = sl.sync_line(ctx)
    return Finding(
        code=Code.GPU_IDLE_SYNC, severity=_severity(b, ns),
        statement=f"Host synchronization drains the GPU: {ms(ns)} {b.unit} ({b.of_window(ns)}) of idle time follows "
                  f"or sits inside a blocking call ({n_per_step:.0f} {b.unit}; most from {', '.join(sites) or '-'}"
                  f"{sl.named(line, '; ')}).",
        next_step="Remove per-step host reads of device values (.item(), .cpu(), print(tensor), torch.nonzero, "
                  "bool(tensor)) at those sites"
                  + sl.named(line, " (", ")")
                  + ": keep metrics on the GPU and read them every N steps, or use non_blocking copies into pinned "
                    "memory.",
        recoverable_ns_per_step=round(ns),
        evidence={"idle_after_sync_ns": round(ns), "syncs_per_step": n_per_step, "sites": sites,
                  "scalar_reads": sy.scalar_reads.to_dicts(), **sl.evidence(line)},
    )


def _launch(ctx: Context, b: Basis, ns: float) -> Finding:
    la = launch(ctx.trace, ctx.steps(), ctx.busy())
    steady = la.per_step.filter(pl.col(StepCol.STEADY))
    dispatch = mean_of(steady.get_column("dispatch_ns"))
    gpu = mean_of(steady.get_column("gpu_busy_ns"))
    ratio = (dispatch / gpu) if dispatch and gpu else None
    return Finding(
        code=Code.GPU_IDLE_LAUNCH, severity=_severity(b, ns),
        statement=f"Kernel launch overhead leaves the GPU idle {ms(ns)} {b.unit} ({b.of_window(ns)}): "
                  f"{pct(la.short_kernel_share)} of {la.kernels} kernels run shorter than one launch call "
                  f"(median {ms(la.launch_call_p50_ns or 0)})"
                  + (f", and the host spends {ms(dispatch or 0)} per step in launch calls against {ms(gpu or 0)} of "
                     f"GPU work." if ratio else "."),
        next_step="Cut launches: torch.compile the model (fuses small ops), capture the step in a CUDA graph "
                  "(torch.compile(mode='reduce-overhead') or torch.cuda.graphs), or raise the batch size so each "
                  "kernel does more work.",
        recoverable_ns_per_step=round(ns),
        evidence={"idle_launch_ns": round(ns), "launches": la.launches, "short_kernels": la.short_kernels,
                  "kernels": la.kernels, "launch_call_p50_ns": la.launch_call_p50_ns,
                  "launch_to_start_p50_ns": la.delay_p50_ns, "launch_to_start_p90_ns": la.delay_p90_ns,
                  "dispatch_ns_per_step": dispatch, "gpu_busy_ns_per_step": gpu},
    )


def _host(ctx: Context, b: Basis, ns: float) -> Finding:
    ops = _top_gaps(ctx, GapClass.HOST, "host_op")
    py = _top_gaps(ctx, GapClass.HOST, "host_python")
    ann = _top_gaps(ctx, GapClass.HOST, "host_annotation")
    line = sl.host_line(ctx)
    read = host_reading(ctx, b, line)
    return Finding(
        code=Code.GPU_IDLE_HOST, severity=_severity(b, ns),
        statement=f"The GPU waits while the host computes: {ms(ns)} {b.unit} ({b.of_window(ns)}) of idle time with "
                  "the host in Python or CPU ops and no launch in flight "
                  f"(mostly {', '.join(py or ops or ann) or 'unnamed code'}{sl.named(line, '; ')}){read.clause}.",
        next_step=read.next_step,
        recoverable_ns_per_step=round(ns),
        evidence={"idle_host_ns": round(ns), "ops": ops, "python": py, "annotations": ann, **sl.evidence(line),
                  **read.evidence},
    )


def _allocator(ctx: Context, b: Basis, ns: float) -> Finding:
    return Finding(
        code=Code.GPU_IDLE_ALLOCATOR, severity=_severity(b, ns),
        statement=f"The GPU waits on the CUDA allocator: {ms(ns)} {b.unit} ({b.of_window(ns)}) of idle time with the "
                  "host inside cudaMalloc/cudaFree in steady state.",
        next_step=("Keep tensor shapes stable between steps and let the caching allocator reuse blocks; try "
                   "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; avoid torch.cuda.empty_cache() in the loop."
                   if run_facts(ctx).pytorch else device_allocation_advice(run_facts(ctx)) + "."),
        recoverable_ns_per_step=round(ns),
        evidence={"idle_allocator_ns": round(ns), "ops": _top_gaps(ctx, GapClass.ALLOCATOR, "host_op")},
    )


def _comm(ctx: Context, b: Basis, ns: float) -> Finding:
    return Finding(
        code=Code.GPU_IDLE_COMM_WAIT, severity=_severity(b, ns),
        statement=f"The GPU waits on a collective: {ms(ns)} {b.unit} ({b.of_window(ns)}) of idle time with the host "
                  f"inside {', '.join(_top_gaps(ctx, GapClass.COMM, 'host_op')) or 'communication'}.",
        next_step="Compare ranks to find who arrives late: tracewhy ranks DIR_WITH_ALL_RANK_TRACES.",
        recoverable_ns_per_step=round(ns),
        evidence={"idle_comm_ns": round(ns)},
    )


def _graph(ctx: Context, b: Basis, ns: float) -> Finding:
    return Finding(
        code=Code.GPU_IDLE_GRAPH_LAUNCH, severity=Severity.LOW,
        statement=f"{ms(ns)} {b.unit} ({b.of_window(ns)}) of GPU idle time sits in CUDA-graph launches.",
        next_step="Check the graph replay cadence; larger graphs (fewer replays per step) cut this.",
        recoverable_ns_per_step=round(ns), evidence={"idle_graph_ns": round(ns)},
    )


def _dependency(ctx: Context, b: Basis, ns: float) -> Finding:
    return Finding(
        code=Code.GPU_IDLE_DEPENDENCY, severity=_severity(b, ns),
        statement=f"Work was already queued but the GPU stayed idle {ms(ns)} {b.unit} ({b.of_window(ns)}): it waited "
                  "on a dependency (another stream, an event, or a copy engine), not on the host.",
        next_step="Look at cross-stream waits around these gaps in Perfetto (tracewhy export TRACE -o a.json.gz) "
                  f"or with Nsight Systems (tracewhy capture nsys -- python train.py runs "
                  f"`{shell(nsys_command(['python', 'train.py']))}`).",
        recoverable_ns_per_step=round(ns),
        evidence={"idle_dependency_ns": round(ns),
                  "next_activities": _top_gaps(ctx, GapClass.DEPENDENCY, "next_activity")},
    )


def _other(ctx: Context, b: Basis, ns: float) -> Finding:
    return Finding(
        code=Code.GPU_IDLE_UNTRACED, severity=Severity.LOW,
        statement=f"{ms(ns)} {b.unit} ({b.of_window(ns)}) of GPU idle time falls where the launching thread is in no "
                  "traced activity (untraced Python, a sleep, or another process).",
        next_step="Capture with with_stack=True to see the Python frames there, or py-spy the job.",
        recoverable_ns_per_step=round(ns), evidence={"idle_untraced_ns": round(ns)},
    )


def _input_over_the_trace(ctx: Context) -> list[Finding]:
    """No steps to divide by: the DataLoader's share of its thread's span over the whole trace
    (the union of its fetches, as input_pipeline takes it: a fetch inside a fetch is one wait)."""
    host = ctx.host()
    fetch = host.self_flag[Flag.DATALOADER]
    best: tuple[float, float, tuple[int, int]] | None = None
    for thread, (lo, hi) in host.threads.items():
        rows = np.flatnonzero(fetch[lo:hi]) + lo
        if rows.size == 0:
            continue
        starts, ends = union(host.ts[rows], host.end[rows])
        loader = float((ends - starts).sum())
        span = float(host.end[lo:hi].max() - host.ts[lo])
        if best is None or loader > best[0]:
            best = (loader, span, thread)
    if best is None or not best[1] or best[0] / best[1] < th.INPUT_MIN_SHARE:
        return []
    loader, span, thread = best
    share = loader / span
    line = sl.input_line(ctx)
    return [Finding(
        code=Code.INPUT_BOUND, severity=Severity.HIGH if share >= th.HIGH_SEVERITY_SHARE else Severity.MEDIUM,
        statement=f"Over the trace (no step markers), the training thread spends {ms(loader)} of {ms(span)} "
                  f"({pct(share)}) fetching batches in DataLoader __next__." + _fetched_under(line),
        next_step=loader_advice(run_facts(ctx), loader, span,
                                suffix="; mark iterations with prof.step() for per-step figures"),
        recoverable_ns_per_step=round(loader),
        evidence={"dataloader_ns": round(loader), "span_ns": round(span), "thread": list(thread), **sl.evidence(line),
                  **loader_evidence(run_facts(ctx), loader, span)},
    )]


def _input_without_gpu(ctx: Context) -> list[Finding]:
    """On a CPU-only trace the DataLoader's share of the step is what an input fix recovers: the
    loop runs on one thread, so every millisecond of loading is a millisecond of step."""
    steps_result = ctx.steps()
    if steps_result.table.height == 0:
        return _input_over_the_trace(ctx)
    ip = input_pipeline(steps_result, ctx.host(), {})
    steady = ip.per_step.filter(pl.col(StepCol.STEADY))
    if steady.height == 0:
        return []
    loader = mean_of(steady.get_column("dataloader_ns")) or 0.0
    window = mean_of(steady.get_column(WindowCol.WINDOW)) or 0.0
    share = loader / window if window else 0.0
    if share < th.INPUT_MIN_SHARE:
        return []
    line = sl.input_line(ctx)
    return [Finding(
        code=Code.INPUT_BOUND, severity=Severity.HIGH if share >= th.HIGH_SEVERITY_SHARE else Severity.MEDIUM,
        statement=f"The step spends {ms(loader)} of its {ms(window)} window ({pct(share)}; means over "
                  f"{steady.height} steady steps) fetching the next batch in DataLoader __next__ on the training "
                  "thread." + _fetched_under(line),
        next_step=loader_advice(run_facts(ctx), loader, window),
        recoverable_ns_per_step=round(loader),
        evidence={"mean_dataloader_ns_per_step": round(loader), "mean_window_ns": round(window),
                  "steady_steps": steady.height, "fetches": ip.fetches, **sl.evidence(line),
                  **loader_evidence(run_facts(ctx), loader, window)},
    )]
