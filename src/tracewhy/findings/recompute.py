"""``activation-recompute``: backward runs forward ops again (activation checkpointing), found
from the trace's structure (``account_host.HostContext.recompute``: forward ops recorded under an
autograd engine node or on backward's thread), with their time on the analysed steps' critical
paths, and priced by the step replayed without them (``RemoveRecompute``, the edit
``bench/calibrate.py`` measures against real pairs). Checkpointing is a trade of time for memory:
the finding says what the time is, so the user can weigh it against the memory it saves; it
explains the ``backward`` part, which holds the rerun ops.
"""

from __future__ import annotations

import numpy as np

from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.model.schema import Col
from tracewhy.units import fmt_ns as ms


def findings(ctx: Context) -> list[Finding]:
    """One finding when the analysed steps' critical paths hold recomputed forward work."""
    if ctx.trace.slices.height == 0 or ctx.account() is None:
        return []
    model = ctx.step_model()
    recompute = model.rules.ctx.recompute
    if not model.paths or not (recompute >= 0).any():
        return []
    g, launch = model.graph, model.rules.launch
    # The rerun ops themselves, outermost only (an op recorded inside another rerun op is part of it).
    parent = model.trace.slices.get_column(Col.PARENT).fill_null(-1).to_numpy()
    rows = np.arange(recompute.size)
    outermost = (recompute == rows) & ((parent < 0) | (recompute[np.maximum(parent, 0)] < 0))
    ts = model.rules.slice_ts
    on_path = 0
    ops = 0
    for p in model.paths:
        e = p.edges
        if e.size == 0:
            continue
        attr = g.attr[e]
        safe = np.maximum(attr, 0)
        host = (attr >= 0) & (g.kind[e] != int(Edge.GPU)) & (recompute[safe] >= 0)
        launched_by = np.where(attr >= 0, launch[safe], -1)
        gpu = (g.kind[e] == int(Edge.GPU)) & (launched_by >= 0) & (recompute[np.maximum(launched_by, 0)] >= 0)
        dur = g.node_ts[g.dst[e]] - np.maximum(g.node_ts[g.src[e]], p.window_start)
        on_path += int(dur[host | gpu].sum())
        ops += int(np.count_nonzero(outermost & (ts >= p.window_start) & (ts < p.window_end)))
    n = len(model.paths)
    per_step = round(on_path / n)
    if per_step <= 0:
        return []
    return [Finding(
        code=Code.ACTIVATION_RECOMPUTE, severity=Severity.MEDIUM,
        statement=f"Backward runs forward ops again (activation checkpointing): {ops / n:,.0f} rerun ops per step, "
                  f"{ms(per_step)} per step on the critical path, besides what checkpoint's own hooks add in forward "
                  "and backward (the replay without checkpointing takes out both).",
        next_step="Checkpointing trades this time for activation memory: where memory allows, checkpoint fewer "
                  "blocks (only those with the largest activations), or keep the matmuls' outputs and recompute only "
                  "the cheap ops (selective checkpointing: torch.utils.checkpoint.create_selective_checkpoint_contexts)"
                  "; tracewhy memory TRACE (with profile_memory=True) shows the activations' share of the peak.",
        recoverable_ns_per_step=per_step,
        evidence={"recompute_ns_per_step": per_step, "recomputed_ops_per_step": round(ops / n, 2)},
    )]
