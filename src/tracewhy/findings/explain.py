"""Each finding joined to the part of the step account it explains, with the step time predicted
with its fix: the part's edit of the step's dependency graph replayed (``analyses.what_if``),
never the part subtracted from the step. Avoidable parts no rule explains become findings of
their own (``unexplained-part``), and the fixes that save most are predicted together.

Which part a finding speaks of is decided by the part's kind (data loading, sync, launch
overhead, communication, ...) and, where a finding names what it is about (the scalar reads it
counted), by those names in the part.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

import msgspec

from tracewhy.analyses import api_names
from tracewhy.analyses.account import AccountCol
from tracewhy.analyses.account_names import PartKind, PartName, avoidable
from tracewhy.analyses.what_if import fix_for_part
from tracewhy.analyses.what_if_edits import Fix
from tracewhy.findings import thresholds as th
from tracewhy.findings.account import HOST_DIRECTIONS
from tracewhy.findings.anti_patterns import OWN_FIX_CODES, own_fixes, settled
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding
from tracewhy.findings.unexplained import Shared, unexplained_part
from tracewhy.units import fmt_ns as ms

Row = dict[str, Any]


@dataclass(frozen=True)
class FixesTogether:
    """The fixes of the findings that save most, replayed at once."""

    #: The findings whose fixes these are, most saved alone first.
    codes: tuple[str, ...]
    #: What each fix does to the step (the edits' labels).
    fixes: tuple[str, ...]
    measured_step_ns: int
    predicted_step_ns: int
    #: The largest avoidable part of the predicted step (None: none left).
    next_bottleneck: str | None


class Explained(msgspec.Struct, frozen=True):
    """The findings with their parts and predictions; ``lead``: the finding that explains the
    account's largest avoidable part (None: none does); ``step_ns``: the measured step the
    predictions start from."""

    findings: list[Finding]
    lead: Code | None
    step_ns: int | None
    together: FixesTogether | None
    #: How many of the account's analysed steps the predictions replay (``step_ns`` is their mean).
    replayed_steps: int = 0


def _kind(*kinds: str) -> Callable[[Row, Finding], bool]:
    return lambda row, f: row[AccountCol.KIND] in kinds


def _named(*names: str) -> Callable[[Row, Finding], bool]:
    return lambda row, f: row[AccountCol.PART] in names


def _sync(row: Row, f: Finding) -> bool:
    return row[AccountCol.KIND] == PartKind.SYNC and row[AccountCol.PART] not in (PartName.QUEUE_FULL,
                                                                                    PartName.STREAM_WAIT)


def _scalar_read(row: Row, f: Finding) -> bool:
    """The waits under the reads the finding counted, and the host work that leads up to them."""
    reads = {str(r.get("name")) for r in f.evidence.get("reads", []) if isinstance(r, dict)}
    part = str(row[AccountCol.PART])
    return any(part.endswith(f" under {name}") or part == f"{PartName.READ_PREFIX}{name}" for name in reads)


def _memcpy_wait(row: Row, f: Finding, synchronous: bool) -> bool:
    """A wait in a copy call: ``cudaMemcpyAsync under aten::to`` (pageable), ``cudaMemcpy`` (synchronous)."""
    call = str(row[AccountCol.PART]).removeprefix("sync: ").split(" ", 1)[0]
    if row[AccountCol.KIND] != PartKind.SYNC or "Memcpy" not in call:
        return False
    return not call.endswith("Async") if synchronous else True


def _host_work(row: Row, f: Finding) -> bool:
    return row[AccountCol.KIND] == PartKind.HOST and not str(row[AccountCol.PART]).startswith("allocator: ")


def _host_transfer(row: Row, f: Finding) -> bool:
    return row[AccountCol.KIND] == PartKind.COPIES and \
        str(row[AccountCol.PART]).removeprefix("copies: ").split(" ")[0] in HOST_DIRECTIONS


#: The parts each time finding explains (largest first, as the account lists them). A code not
#: here explains no part: it is not about step time (memory, trust), or its time is not a part of
#: the account (graph breaks' eager ops are forward and backward work; spikes are a few steps).
EXPLAINS: Final[dict[Code, Callable[[Row, Finding], bool]]] = {
    Code.GPU_IDLE_INPUT: _kind(PartKind.DATA_LOADING),
    Code.INPUT_BOUND: _kind(PartKind.DATA_LOADING),
    Code.GPU_IDLE_SYNC: _sync,
    Code.NSYS_SYNC_API: _sync,
    Code.SCALAR_READ_PER_STEP: _scalar_read,
    Code.GPU_IDLE_LAUNCH: _named(PartName.LAUNCH),
    Code.GPU_IDLE_GRAPH_LAUNCH: _named(PartName.LAUNCH),
    Code.GPU_IDLE_SHORT: _named(PartName.GPU_GAP, PartName.LAUNCH),
    Code.GPU_IDLE_HOST: _host_work,
    Code.GPU_IDLE_ALLOCATOR: lambda row, f: str(row[AccountCol.PART]).startswith("allocator: "),
    Code.ALLOCATOR_IN_STEADY_STATE: lambda row, f: str(row[AccountCol.PART]).startswith("allocator: "),
    Code.GPU_IDLE_COMM_WAIT: _kind(PartKind.COMMUNICATION),
    Code.COMM_EXPOSED: _kind(PartKind.COMMUNICATION),
    Code.AUTOGRAD_IN_INFERENCE: _named(PartName.FORWARD),
    Code.REDUCE_EVERY_MICROBATCH: lambda row, f: (row[AccountCol.KIND] == PartKind.COMMUNICATION
                                                  and api_names.is_reduction(str(row[AccountCol.PART]))),
    Code.GPU_IDLE_DEPENDENCY: _named(PartName.STREAM_WAIT, PartName.GPU_WAIT),
    Code.GPU_IDLE_UNTRACED: _named(PartName.UNTRACED),
    Code.PAGEABLE_MEMCPY: lambda row, f: (row[AccountCol.KIND] == PartKind.COPIES
                                          and str(row[AccountCol.PART]).endswith(" pageable"))
    or _memcpy_wait(row, f, synchronous=False),
    Code.SYNCHRONOUS_MEMCPY: lambda row, f: _memcpy_wait(row, f, synchronous=True),
    Code.RECOMPILE: _kind(PartKind.COMPILATION),
    Code.RECOMPILE_LIMIT: _kind(PartKind.COMPILATION),
    Code.COPY_BOUND: _host_transfer,
    Code.OPTIMIZER_SINGLE_TENSOR: _named(PartName.OPTIMIZER),
    Code.ZERO_GRAD_NOT_NONE: _named(PartName.OPTIMIZER),
    Code.TENSOR_BUILT_ON_HOST: _host_transfer,
    Code.ACTIVATION_RECOMPUTE: _named(PartName.BACKWARD),
    Code.TENSOR_GROWN_BY_CONCAT: lambda row, f: row[AccountCol.PART] == f"host: {f.evidence.get('op')}",
    Code.PER_SAMPLE_LOOP: lambda row, f: row[AccountCol.PART] == f"host: {f.evidence.get('block')}",
    Code.TENSOR_CORES_UNUSED: lambda row, f: re.match(r"kernels: (gemm|conv)", str(row[AccountCol.PART])) is not None,
}
#: Findings that explain one part only: the GPU waits for the host's largest part, not for all of it.
_ONE_PART: Final = {Code.GPU_IDLE_HOST}


def explain(ctx: Context, found: list[Finding], *, replay: bool = True) -> Explained:
    """``found`` with parts and predictions, the unexplained parts added (``unexplained-part``),
    the lead, and the top fixes together (when the options ask for them). Without ``replay``:
    the same findings in the same order as with it, as the rules and ``unexplained_part`` made
    them, nothing predicted, no lead (``diff`` first asks which codes each run has: where they are the
    same, it shows no finding, and no fix need be replayed)."""
    account = ctx.account()
    if account is None:
        return Explained(found, None, None, None)
    rows = [r for r in account.parts.rows(named=True) if r[AccountCol.KIND] != PartKind.UNEXPLAINED]
    out: list[Finding] = []
    fixes: dict[int, tuple[Fix, ...]] = {}
    claimed: dict[str, list[int]] = {}
    for f in found:
        test = EXPLAINS.get(f.code)
        if test is None:
            out.append(f)
            continue
        matched = [r for r in rows if test(r, f)]
        if f.code in _ONE_PART:
            matched = [r for r in matched if not r[AccountCol.ESSENTIAL]][:1]
        for r in matched:
            claimed.setdefault(r[AccountCol.PART], []).append(len(out))
        if not replay:
            out.append(f)
            continue
        # A one-time cost (a recompile paid once) claims its part but predicts no per-step saving;
        # its step is usually left out of the account (a one-time compile), and then it has none.
        one_time = bool(f.evidence.get("one_time_cost"))
        # A finding about how the program does a part's work (an anti-pattern) predicts with its own
        # fix (findings/anti_patterns.own_fixes), also where the part is essential or not on the path.
        edits = () if one_time else own_fixes(ctx, f.code) if f.code in OWN_FIX_CODES else _fixes(matched)
        fixes[len(out)] = edits
        out.append(replace(f, part=None, predicted_step_ns=None, next_bottleneck=None, recoverable_ns_per_step=0)
                   if one_time and not matched else settled(_predicted(ctx, f, matched, edits))
                   if f.code in OWN_FIX_CODES else _predicted(ctx, f, matched, edits))
    for r in rows:
        if (avoidable(r[AccountCol.PART], r[AccountCol.KIND], r[AccountCol.ESSENTIAL])
                and r[AccountCol.PART] not in claimed and r[AccountCol.SHARE] >= th.UNEXPLAINED_PART_MIN_SHARE):
            claimed[r[AccountCol.PART]] = [len(out)]
            if not replay:
                out.append(unexplained_part(ctx, account, r))
                continue
            edits = _fixes([r])
            shared, sharers = _shared(ctx, out, fixes, str(r[AccountCol.PART]))
            if shared is not None:  # their fixes take part of it: they may lead on it
                if shared.taken_ns >= (1 - SHARED_MIN_SHARE) * shared.part_ns:
                    claimed[r[AccountCol.PART]] = sharers
                    continue  # those fixes take (nearly) all of it: explained, by them
                claimed[r[AccountCol.PART]] += sharers
            fixes[len(out)] = edits
            out.append(_beyond(ctx, _predicted(ctx, unexplained_part(ctx, account, r, shared), [r], edits),
                               shared, edits))
    if not replay:
        return Explained(out, None, ctx.measured_step_ns(), None, len(ctx.what_if_windows()))
    largest = account.largest_avoidable()
    lead = None
    if largest is not None and str(largest[AccountCol.PART]) in claimed:
        lead = max((out[i] for i in claimed[str(largest[AccountCol.PART])]),
                   key=lambda f: (f.recoverable_ns_per_step, not str(f.code).startswith("nsys-"))).code
    together = _together(ctx, out, fixes) if ctx.options.fixes_together else None
    return Explained(out, lead, ctx.measured_step_ns(), together, len(ctx.what_if_windows()))


def _fixes(matched: list[Row]) -> tuple[Fix, ...]:
    """The fix of each matched part (one per distinct edit): what the finding predicts with."""
    edits: dict[str, Fix] = {}
    for r in matched:
        fix = fix_for_part(r[AccountCol.PART], r[AccountCol.KIND], r[AccountCol.ESSENTIAL])
        if fix is not None:
            edits.setdefault(repr(fix), fix)
    return tuple(edits.values())


def _predicted(ctx: Context, f: Finding, matched: list[Row], edits: tuple[Fix, ...]) -> Finding:
    """The finding with the part it explains and, where a fix applies, the step predicted with it;
    its recoverable time is then the measured step less the predicted one. A time finding whose
    time is on no part of the path recovers nothing there: the replay has nothing to change."""
    part = f.part or (matched[0][AccountCol.PART] if matched else None)
    if not matched and f.code not in OWN_FIX_CODES:
        step = ctx.measured_step_ns()
        return replace(f, part=None, predicted_step_ns=step, next_bottleneck=_largest_avoidable(ctx),
                       recoverable_ns_per_step=0,
                       evidence={**f.evidence, "measured_step_ns": step, "on_critical_path": False})
    if not edits:  # essential work: no edit says what would change
        return replace(f, part=part)
    p = ctx.predict(edits)
    if f.code == Code.UNEXPLAINED_PART and not p.changed:  # the edit finds nothing to change here
        f = replace(f, statement=f"{f.statement} The fix's replay ({p.label}) finds nothing to change in this "
                                 "trace: the step it predicts is the one measured, not a saving.")
    elif f.code == Code.UNEXPLAINED_PART and p.saved_ns <= 0:  # other work ran beside it and takes its place
        f = replace(f, statement=f"{f.statement} Replayed without it the step is no shorter ({ms(p.measured_ns)}): "
                                 "other work runs beside it, so it costs nothing now.")
    return replace(f, part=part, predicted_step_ns=p.predicted_ns, next_bottleneck=p.next_bottleneck,
                   recoverable_ns_per_step=max(p.saved_ns, 0),
                   evidence={**f.evidence, "measured_step_ns": p.measured_ns, "fix": p.label,
                             "parts": [r[AccountCol.PART] for r in matched]})


#: Another finding's fix is said to take some of an unexplained part from this share of it on;
#: fixes that leave less than this share of it explain it, and no unexplained-part is made.
SHARED_MIN_SHARE: Final = 0.1


def _shared(ctx: Context, found: list[Finding], fixes: dict[int, tuple[Fix, ...]], part: str
            ) -> tuple[Shared | None, list[int]]:
    """How much of ``part`` (an avoidable part no rule claimed) the fixes of the findings already
    made remove as well: a fix's replay also takes the untraced Python around the ops it removes
    (``RemoveCode``), which the account counts in the untraced part. The saving findings whose
    replay shrinks the part by SHARED_MIN_SHARE of it or more, with what their fixes together
    take (ns per step, over the replayed steps), and their indices in ``found``; (None, []) where
    none does."""
    base = ctx.predict(()).parts.get(part, 0)
    if base <= 0:
        return None, []
    sharers = [i for i, f in enumerate(found) if fixes.get(i) and f.recoverable_ns_per_step > 0
               and base - ctx.predict(fixes[i]).parts.get(part, 0) >= SHARED_MIN_SHARE * base]
    if not sharers:
        return None, []
    edits = {repr(e): e for i in sharers for e in fixes[i]}
    together = ctx.predict(tuple(edits.values())).parts.get(part, 0)
    return Shared(codes=tuple(str(found[i].code) for i in sharers), taken_ns=base - together, part_ns=base,
                  fixes=tuple(edits.values())), sharers


def _beyond(ctx: Context, f: Finding, shared: Shared | None, edits: tuple[Fix, ...]) -> Finding:
    """An unexplained part some of which other findings' fixes take: what removing it saves once
    those fixes are made (their replay against theirs with this part's edit added), so that the
    ranking and the fixes-together line count the shared time once."""
    if shared is None or not edits or f.predicted_step_ns is None:
        return f
    made = ctx.predict(shared.fixes)
    beyond = max(made.predicted_ns - ctx.predict(shared.fixes + edits).predicted_ns, 0)
    measured = int(f.evidence["measured_step_ns"])
    return replace(f, recoverable_ns_per_step=beyond, predicted_step_ns=measured - beyond,
                   statement=f"{f.statement} Those fixes made, removing the rest saves {ms(beyond)} per step "
                             f"(alone, the whole part: {ms(f.recoverable_ns_per_step)}).",
                   evidence={**f.evidence, "saved_alone_ns": f.recoverable_ns_per_step})


def _largest_avoidable(ctx: Context) -> str | None:
    account = ctx.account()
    row = account.largest_avoidable() if account is not None else None
    return str(row[AccountCol.PART]) if row is not None else None


def _together(ctx: Context, found: list[Finding], fixes: dict[int, tuple[Fix, ...]]) -> FixesTogether | None:
    """The FIXES_TOGETHER findings that save most, their fixes replayed at once (None: fewer than two)."""
    ranked = sorted((i for i, f in enumerate(found) if fixes.get(i) and f.recoverable_ns_per_step > 0),
                    key=lambda i: (-found[i].recoverable_ns_per_step, found[i].code))
    chosen: list[int] = []
    seen: set[str] = set()
    for i in ranked:
        key = " + ".join(sorted(repr(e) for e in fixes[i]))
        if key not in seen:
            seen.add(key)
            chosen.append(i)
        if len(chosen) == th.FIXES_TOGETHER:
            break
    if len(chosen) < 2:
        return None
    edits = {repr(e): e for i in chosen for e in fixes[i]}
    p = ctx.predict(tuple(edits.values()))
    return FixesTogether(codes=tuple(str(found[i].code) for i in chosen), fixes=tuple(e.label for e in edits.values()),
                         measured_step_ns=p.measured_ns, predicted_step_ns=p.predicted_ns,
                         next_bottleneck=p.next_bottleneck)

