"""The graph-replay trust finding: how much GPU work CUDA/HIP graph launches replayed, by kernel
family, what that work is charged to (the trace holds no capture to match it to the ops that
recorded it), and what ran eagerly between the graphs, per step where the trace has steps."""

from __future__ import annotations

from typing import Any, Final

import polars as pl

from tracewhy.analyses.graph_replay import ChargedTo, GraphLaunchCol, GraphWorkCol, graph_replays, graph_work
from tracewhy.analyses.steps import StepCol
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.units import fmt_ns, fmt_pct, printable

#: Families, ops and launchers a statement names (the evidence keeps them all, up to _KEPT).
_NAMED: Final = 3
_KEPT: Final = 10
#: Characters of an op or annotation name in a statement (vLLM's step annotations run long).
_NAME_CHARS: Final = 60


def graph_replay_finding(ctx: Context) -> Finding | None:
    replays = ctx.cached("graph_replays", lambda: graph_replays(ctx.trace))
    if not replays.graph_launches:
        return None
    work = graph_work(ctx.trace, replays)
    gpu_ns = int(work.get_column(GraphWorkCol.DUR).sum())
    replayed = work.filter(pl.col(GraphWorkCol.REPLAYED))
    eager = work.filter(~pl.col(GraphWorkCol.REPLAYED) & pl.col(GraphWorkCol.CHARGED_NAME).is_not_null())
    families = _ns_by(replayed, GraphWorkCol.FAMILY)
    launchers = _ns_by(replays.launches.select(GraphLaunchCol.CHARGED_NAME,
                                               pl.col(GraphLaunchCol.GPU_NS).alias(GraphWorkCol.DUR)),
                       GraphLaunchCol.CHARGED_NAME)
    eager_ops = _ns_by(eager, GraphWorkCol.CHARGED_NAME)
    outside_op = replays.launches.filter(pl.col(GraphLaunchCol.CHARGED_KIND) != ChargedTo.CPU_OP).height
    statement = (
        f"{replays.graph_launches} CUDA/HIP graph launches replayed {replays.graph_gpu_rows} kernels, copies and "
        f"memsets ({fmt_ns(replays.graph_gpu_ns)}, {fmt_pct(replays.graph_gpu_ns / max(gpu_ns, 1))} of GPU time: "
        f"{_listed(families, replays.graph_gpu_ns)}). The trace holds no capture of the graphs, so none of them is "
        f"matched to the op that recorded it: each is charged to what launched its graph "
        f"({_listed(launchers, replays.graph_gpu_ns)})"
        + (f"; {outside_op} of the launches have no CPU op around them and are charged to the annotation "
           "around them" if outside_op else "") + ".")
    if replays.eager_gpu_rows:
        statement += (f" Between the graphs {replays.eager_gpu_rows} ran eagerly, one launch call each "
                      f"({fmt_ns(replays.eager_gpu_ns)}, {fmt_pct(replays.eager_gpu_ns / max(gpu_ns, 1))}: "
                      f"{_listed(eager_ops, replays.eager_gpu_ns)}).")
    evidence: dict[str, Any] = {
        "graph_launches": replays.graph_launches,
        "replayed_gpu_rows": replays.graph_gpu_rows,
        "replayed_gpu_ns": replays.graph_gpu_ns,
        "unmatched_to_capture_rows": replays.graph_gpu_rows,
        "launches_outside_op": outside_op,
        "replayed_ns_charged_outside_op": replays.graph_charged_outside_op_ns,
        "replayed_ns_by_family": dict(families[:_KEPT]),
        "replayed_ns_by_launcher": dict(launchers[:_KEPT]),
        "eager_gpu_rows": replays.eager_gpu_rows,
        "eager_gpu_ns": replays.eager_gpu_ns,
        "eager_ns_by_op": dict(eager_ops[:_KEPT]),
        "gpu_time_ns": gpu_ns,
    }
    per_step = _per_step(ctx, work)
    if per_step:
        evidence["per_step"] = per_step
    return Finding(
        code=Code.CUDA_GRAPH_REPLAY, severity=Severity.TRUST, statement=statement,
        next_step="For per-op attribution inside the graphs capture a run with graphs off (e.g. vLLM "
                  "enforce_eager=True, or torch.compile without mode='reduce-overhead').",
        evidence=evidence,
    )


def _ns_by(rows: pl.DataFrame, key: str) -> list[tuple[str, int]]:
    """(key, summed GPU ns), largest first, then by key."""
    if not rows.height:
        return []
    summed = rows.group_by(key).agg(pl.col(GraphWorkCol.DUR).sum()).sort(
        [GraphWorkCol.DUR, key], descending=[True, False])
    return [(str(k), int(ns)) for k, ns in summed.iter_rows()]


def _listed(items: list[tuple[str, int]], total_ns: int) -> str:
    named = [f"{printable(k)[:_NAME_CHARS]} {fmt_pct(ns / max(total_ns, 1))}" for k, ns in items[:_NAMED]]
    more = len(items) - _NAMED
    return ", ".join(named) + (f", {more} more" if more > 0 else "")


def _per_step(ctx: Context, work: pl.DataFrame) -> list[dict[str, int]]:
    """Replayed and eager GPU time of each step: the work that starts within the step's GPU span."""
    table = ctx.steps().table
    if not table.height:
        return []
    out: list[dict[str, int]] = []
    for step in table.iter_rows(named=True):
        start, end = step[StepCol.GPU_START], step[StepCol.GPU_END]
        if start is None or end is None:
            continue
        inside = work.filter(pl.col(GraphWorkCol.TS).is_between(start, end, closed="left"))
        graph_ns = int(inside.filter(pl.col(GraphWorkCol.REPLAYED)).get_column(GraphWorkCol.DUR).sum())
        out.append({"step": step[StepCol.NUMBER] if step[StepCol.NUMBER] is not None else len(out),
                    "replayed_ns": graph_ns, "eager_ns": int(inside.get_column(GraphWorkCol.DUR).sum()) - graph_ns})
    return out
