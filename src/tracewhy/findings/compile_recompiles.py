"""Recompiles judged: a frame that recompiles in most steps from its first recompile on pays the
compile every step; one that recompiled once paid a one-time cost. The advice follows the guard
that failed (from TORCH_LOGS): a tensor-size guard is fixed by a dynamic dimension, a Python
scalar guard (an int argument, a float read with ``.item()``) by keeping the value a tensor."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

import polars as pl

from tracewhy.analyses.compile import CompileResult, CompileStepCol, RecompileCol, RegionCol
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.consolidate import severity_for_share
from tracewhy.findings.model import Finding, Severity
from tracewhy.units import fmt_ns

if TYPE_CHECKING:
    from tracewhy.model.torch_logs import TorchLogs

#: Recompiles named in a statement; the evidence holds them all.
NAMED: Final = 3

# torch/_dynamo/guards.py (torch 2.13) words a failed tensor guard "tensor 'x' size mismatch at
# index 0. expected 16, actual 12" (also stride, dtype, dimensionality); older torch writes
# size guards as "L['x'].size()[0] == 16".
_SIZE_GUARD: Final = re.compile(r"size mismatch|stride mismatch|dimensionality|\.size\(\)\[|\.stride\(\)\[")
# A Python value specialized on: "n == 2" (an int argument), "___stack2 == 0.88" (the float an
# .item() break hands to the resume function).
_SCALAR_GUARD: Final = re.compile(r"^[^=<>!]+?\s*==\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)$")


class GuardKind:
    """What a failed guard checks, as far as its text says."""

    TENSOR_SIZE: Final = "tensor size"
    PYTHON_INT: Final = "Python int"
    PYTHON_FLOAT: Final = "Python float"
    OTHER: Final = "other"
    NOT_LOGGED: Final = "not logged"


def guard_kind(guard: str | None) -> str:
    if not guard:
        return GuardKind.NOT_LOGGED
    if _SIZE_GUARD.search(guard):
        return GuardKind.TENSOR_SIZE
    if m := _SCALAR_GUARD.match(guard.strip()):
        return GuardKind.PYTHON_FLOAT if re.search(r"[.eE]", m.group(1)) else GuardKind.PYTHON_INT
    return GuardKind.OTHER


ADVICE: Final = {
    GuardKind.TENSOR_SIZE: "The guard checks a tensor's size: mark the changing dimension dynamic before the first "
                           "call (torch._dynamo.mark_dynamic(x, 0)) or compile with dynamic=True; a short last batch "
                           "can also be dropped (DataLoader(drop_last=True)) or padded.",
    GuardKind.PYTHON_INT: "The guard checks a Python int argument: Dynamo compiles one graph per value. Pass it as a "
                          "tensor (torch.tensor(n)) and branch on it with torch.where or torch.cond, or let Dynamo "
                          "treat it as dynamic (do not compile with dynamic=False); mark_dynamic does not apply to "
                          "an int.",
    GuardKind.PYTHON_FLOAT: "The guard checks a Python float (a value read with .item() and passed on): Dynamo "
                            "specializes on each value. Keep it a tensor (no .item(); torch.where or torch.cond for "
                            "branches on it), or set torch._dynamo.config.capture_scalar_outputs=True so .item() "
                            "stays in the graph.",
    GuardKind.OTHER: "Keep what the guard checks the same from step to step.",
    GuardKind.NOT_LOGGED: "TORCH_LOGS=recompiles names the failing guard (`tracewhy compile TRACE --logs LOG`): a "
                          "tensor-size guard wants torch._dynamo.mark_dynamic(x, 0) or dynamic=True; a Python scalar "
                          "guard (an int argument, a float from .item()) wants a tensor instead, torch.where/"
                          "torch.cond, or capture_scalar_outputs=True.",
}


def logged_guards(logs: TorchLogs | None) -> dict[str, str]:
    """The first failed guard of each logged recompile, by its region ``F/C``."""
    if logs is None:
        return {}
    from tracewhy.model.torch_logs import LogRecompileCol  # (already loaded: it made ``logs``)

    return {region: guard for region, guard in logs.recompiles.select(
        LogRecompileCol.REGION, LogRecompileCol.GUARD).iter_rows() if region and guard}


def every_step_frames(r: CompileResult) -> dict[int, tuple[int, int]]:
    """Frames that recompile in most steps from their first recompile to the end of the capture
    (their recompile cost is paid per step), each with (steps that recompiled it, those steps)."""
    names = r.per_step.get_column(CompileStepCol.STEP).to_list()
    out: dict[int, tuple[int, int]] = {}
    for (frame,), rows in r.recompiles.drop_nulls(RecompileCol.STEP).group_by(RecompileCol.FRAME):
        first = min(names.index(s) for s in rows.get_column(RecompileCol.STEP).to_list())
        span = len(names) - first
        steps = int(rows.get_column(RecompileCol.FRAME_STEPS)[0])
        if steps >= th.RECOMPILE_EVERY_STEP_MIN_STEPS and steps >= th.RECOMPILE_EVERY_STEP_MIN_SHARE * span:
            out[int(frame)] = (steps, span)
    return out


def resume_frames(r: CompileResult) -> set[int]:
    """Frames whose regions run nested in another region: resume functions after a graph break."""
    nested = r.regions.filter(pl.col(RegionCol.NESTED_CALLS) > 0).get_column(RegionCol.FRAME).to_list()
    return {int(f) for f in nested}


def _parts(rows: pl.DataFrame, guards: dict[str, str]) -> list[str]:
    return [f"{row[RecompileCol.REGION]} in {row[RecompileCol.STEP]} cost {fmt_ns(row[RecompileCol.COST_NS])}"
            + (f" (guard failed: {guards[row[RecompileCol.REGION]]})" if row[RecompileCol.REGION] in guards else "")
            for row in rows.iter_rows(named=True)]


def _advice(rows: pl.DataFrame, guards: dict[str, str]) -> tuple[str, list[str]]:
    kinds = list(dict.fromkeys(guard_kind(guards.get(str(region))) for region in rows.get_column(RecompileCol.REGION)))
    return " ".join(ADVICE[k] for k in kinds), kinds


def _every_step_severity(share: float) -> Severity:
    """A recompile every step is worth fixing however small its share: MEDIUM at least."""
    severity = severity_for_share(share)
    return Severity.MEDIUM if severity is Severity.LOW else severity


def recompile_finding(r: CompileResult, step_p50_ns: float | None, logs: TorchLogs | None,
                      skip_frames: set[int]) -> list[Finding]:
    """Every-step recompiles (a per-step cost) before one-time ones (paid once; not per step).
    ``skip_frames``: frames another finding reports (a frame that gave up compiling)."""
    table = r.recompiles.filter(~pl.col(RecompileCol.FRAME).is_in(list(skip_frames)))
    every = every_step_frames(r)
    repeated = table.filter(pl.col(RecompileCol.FRAME).is_in(list(every)))
    once = table.filter(~pl.col(RecompileCol.FRAME).is_in(list(every)) & pl.col(RecompileCol.STEADY))
    if repeated.height == 0 and once.height == 0:
        return []
    guards = logged_guards(logs)
    steady_steps = max(r.per_step.filter(pl.col(CompileStepCol.STEADY)).height, 1)
    once_text = (f"{once.height} one-time recompile(s): {'; '.join(_parts(once, guards)[:NAMED])}: paid once, when "
                 "what the guard checks changed; the steps after reuse the new graph, so it is no per-step cost.")
    if repeated.height == 0:
        advice, kinds = _advice(once, guards)
        return [Finding(
            code=Code.RECOMPILE, severity=Severity.LOW, statement=once_text[0].upper() + once_text[1:],
            next_step=f"Only if the change recurs in a longer run. {advice}",
            evidence={"recompiles": once.to_dicts(), "cost_ns": int(once.get_column(RecompileCol.COST_NS).sum()),
                      "guards": guards, "guard_kinds": kinds, "every_step": False, "one_time_cost": True},
        )]
    steady_cost = int(repeated.filter(pl.col(RecompileCol.STEADY)).get_column(RecompileCol.COST_NS).sum())
    per_step = steady_cost / steady_steps
    frames = ", ".join(f"frame {f} in {every[f][0]} of the {every[f][1]} steps from its first recompile on"
                       for f in sorted(int(x) for x in repeated.get_column(RecompileCol.FRAME).unique()))
    advice, kinds = _advice(repeated, guards)
    return [Finding(
        code=Code.RECOMPILE, severity=_every_step_severity(per_step / step_p50_ns if step_p50_ns else 1.0),
        statement=f"torch.compile recompiles every step ({frames}): {repeated.height} recompiles, "
                  f"{fmt_ns(per_step)} per steady step; {'; '.join(_parts(repeated, guards)[:NAMED])}. Each stalls "
                  "its step for the whole compile and fills the frame's cache until the recompile limit."
                  + (f" Besides, {once_text}" if once.height else ""),
        next_step=advice,
        recoverable_ns_per_step=round(per_step),
        evidence={"recompiles": repeated.to_dicts(), "cost_ns": steady_cost, "guards": guards, "guard_kinds": kinds,
                  "every_step": True, "one_time": once.to_dicts()},
    )]
