"""``comm-exposed`` on a run with no GPU: collectives a CPU backend (gloo) runs while the training
thread waits, which the overlap analysis (device streams) cannot see. The step account's
communication parts say how much of the step they hold; the structure says why: how many
collective calls the training thread issues per step, how many gradients backward accumulates
(its ``AccumulateGrad`` nodes), and whether the first call starts only once backward has ended
(every gradient all-reduced after backward, none under it): only then is the cause known; the
communication of a run that starts it under backward and still waits (a late rank, collectives
slower than the compute beside them) stays the step account's ``unexplained-part``. The prediction is the account's for
the part (``HideCollective`` through ``explain``), the replay ``bench/calibrate.py`` measures on
the gloo pairs."""

from __future__ import annotations

from typing import Final

import numpy as np

from tracewhy.analyses.account import AccountCol
from tracewhy.analyses.account_host import HostPurpose
from tracewhy.analyses.account_names import PartKind
from tracewhy.analyses.steps import WindowCol
from tracewhy.analyses.what_if_comm import ACCUMULATE_NODE
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, KIND_CODE, Kind
from tracewhy.units import fmt_ns as ms

#: Collectives issued one by one after backward: what DDP does instead, or a loop can do itself.
_FIX: Final = ("Let DistributedDataParallel do it (it groups gradients into buckets, 25 MB by default, and "
               "all-reduces each bucket during backward as soon as its gradients are ready) instead of all-reducing "
               "each gradient after backward; in a loop of your own, start each all-reduce from a gradient hook "
               "(register_post_accumulate_grad_hook, async_op=True) and wait on the handles before the optimizer step.")


def findings(ctx: Context) -> list[Finding]:
    account = ctx.account()
    if account is None or ctx.trace.of_kind(*GPU_ACTIVITY_KINDS).height:
        return []  # beside a GPU the overlap rule (findings/overlap) measures it on the device's streams
    comm = account.parts.filter((account.parts[AccountCol.KIND] == PartKind.COMMUNICATION)
                                & ~account.parts[AccountCol.ESSENTIAL])
    held = float(comm.get_column(AccountCol.NS_PER_STEP).sum())
    step = float(account.mean_step_ns)
    if not step or held < th.EXPOSED_COMM_MIN_NS or held < th.EXPOSED_COMM_MIN_SHARE * step:
        return []
    calls, gradients, after = _structure(ctx)
    if calls == 0 or not after:
        return []  # under backward and still waited on: a late rank or slow collectives (unexplained-part says)
    names = ", ".join(str(p) for p in comm.get_column(AccountCol.PART).to_list()[:3])
    per_gradient = (f", one per gradient backward accumulates ({gradients:g} AccumulateGrad nodes per step)"
                    if gradients and abs(calls - gradients) < 0.5 else "")
    return [Finding(
        code=Code.COMM_EXPOSED,
        severity=Severity.HIGH if held >= th.EXPOSED_COMM_HIGH_SHARE * step else Severity.MEDIUM,
        statement=f"The training thread waits on collectives for {ms(round(held))} per step ({held / step:.0%} of the "
                  f"step; {names}): {calls:g} collective calls per step{per_gradient}, "
                  "all of them issued after backward has ended, one after another, with no compute beside them. "
                  "This run has no GPU: the CPU backend runs them on its own threads while the step waits.",
        next_step=_FIX,
        recoverable_ns_per_step=round(held),
        evidence={"comm_ns_per_step": held, "share": round(held / step, 4), "calls_per_step": calls,
                  "gradients_per_step": gradients, "cpu_only": True},
    )]


def _structure(ctx: Context) -> tuple[float, float, bool]:
    """(collective calls per step on the steps' threads, AccumulateGrad nodes per step, whether
    in every steady step the first call starts after backward's last node ended)."""
    model = ctx.step_model()
    hc, ts, end = model.rules.ctx, model.rules.slice_ts, model.rules.slice_end
    ids = np.arange(hc.outer_op.size)
    outermost = ids[hc.outer_op == ids]
    # Each collective call: an op in a collective's context none of whose ancestors is one (DDP's
    # reducer calls them from inside backward's nodes, so they need not be outermost).
    in_comm = hc.context == int(HostPurpose.COMMUNICATION)
    parent = ctx.host_tree().parent
    ops = model.rules.kind_code == KIND_CODE[Kind.CPU_OP.value]
    comm = ids[in_comm & ops & ~in_comm[np.maximum(parent, 0)] | (in_comm & ops & (parent < 0))]
    backward = outermost[hc.in_backward[outermost]]
    accumulate = backward[np.array([hc.name(int(b)).endswith(ACCUMULATE_NODE) for b in backward], dtype=bool)] \
        if backward.size else backward
    markers = model.found.windows.get_column(WindowCol.STEP_ID).to_list()
    steps = [(p.window_start, p.window_end, p.pid, markers[p.step]) for p in model.paths]
    calls, grads, after = 0, 0, True
    for start, stop, pid, marker in steps:
        # The calls the step's own thread makes (its marker's; the process's, without a marker).
        thread = (hc.tid[comm] == hc.tid[marker]) if marker is not None else np.ones(comm.size, dtype=bool)
        mine = comm[(ts[comm] >= start) & (ts[comm] < stop) & (hc.pid[comm] == pid) & thread]
        nodes = backward[(ts[backward] >= start) & (ts[backward] < stop) & (hc.pid[backward] == pid)]
        calls += mine.size
        grads += int(np.count_nonzero((ts[accumulate] >= start) & (ts[accumulate] < stop)))
        if mine.size == 0 or nodes.size == 0 or ts[mine].min() < end[nodes].max():
            after = False
    n = max(len(steps), 1)
    return calls / n, grads / n, after and calls > 0
