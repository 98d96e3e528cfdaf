"""Frames torch.compile gave up on, judged: one that never ran a compiled region had no effect
(``compile-no-effect``); one that ran compiled until a compile produced nothing reached the
recompile limit (``recompile-limit``). The trace says which frame, in which step, and how long
its call site runs eagerly after; TORCH_LOGS adds the function's name and the reason."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import polars as pl

from tracewhy.analyses.compile import CompileResult, RecompileCol
from tracewhy.analyses.compile_fallback import FallbackCol
from tracewhy.findings.codes import Code
from tracewhy.findings.compile_recompiles import ADVICE, guard_kind
from tracewhy.findings.model import Finding, Severity
from tracewhy.units import fmt_ns

if TYPE_CHECKING:
    from tracewhy.model.torch_logs import TorchLogs

#: What Dynamo cannot do when it skips a frame after a break in a loop, and the fix.
LOOP_BREAK_ADVICE: Final = ("Dynamo cannot resume inside a loop, so a graph break there skips the whole frame: move "
                            "the break's cause (.item(), print, data-dependent Python, an unsupported call) out of "
                            "the loop, or compile the loop body as its own function.")
NOT_LOGGED_ADVICE: Final = ("TORCH_LOGS=graph_breaks,recompiles says why Dynamo gave up on the frame (`tracewhy "
                            "compile TRACE --logs LOG` joins it here): a graph break inside a loop skips the whole "
                            "frame; the recompile limit (torch._dynamo.config.recompile_limit, 8 by default) stops "
                            "compiling a frame whose guards keep failing.")


def _logged(logs: TorchLogs | None) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Logged give-ups by region ``F/C`` and by frame ``F`` (the log's compile id may be the
    compile before the one the trace shows with no region)."""
    if logs is None:
        return {}, {}
    from tracewhy.model.torch_logs import LogFallbackCol  # (already loaded: it made ``logs``)

    rows = [row for row in logs.fallbacks.iter_rows(named=True) if row[LogFallbackCol.REGION]]
    return ({row[LogFallbackCol.REGION]: row for row in rows},
            {str(row[LogFallbackCol.REGION]).split("/")[0]: row for row in rows})


def fallback_findings(r: CompileResult, logs: TorchLogs | None) -> list[Finding]:
    by_region, by_frame = _logged(logs)
    out = []
    for row in r.fallbacks.iter_rows(named=True):
        frame = row[FallbackCol.FRAME]
        logged = by_region.get(row[FallbackCol.REGION]) or by_frame.get(str(frame))
        out.append(_finding(r, row, logged))
    return out


def _finding(r: CompileResult, row: dict[str, Any], logged: dict[str, Any] | None) -> Finding:
    frame, region, step = row[FallbackCol.FRAME], row[FallbackCol.REGION], row[FallbackCol.STEP] or "the trace"
    function = logged.get("function") if logged else None
    name = f"`{function}` (frame {frame})" if function else f"frame {frame}"
    reason = f" The log says: {logged['kind']}, {logged['reason']}." if logged and logged.get("reason") else ""
    site, eager_steps, eager_ns = row[FallbackCol.CALL_SITE], row[FallbackCol.EAGER_STEPS], row[
        FallbackCol.EAGER_NS_PER_STEP]
    if site and eager_steps:
        eager = (f"its call site `{site}` runs eagerly in the {eager_steps} captured step(s) after, "
                 f"{fmt_ns(eager_ns)} per step")
    else:
        eager = "no later step of its call site was captured to time the eager runs"
    evidence: dict[str, Any] = {**{k: v for k, v in row.items()}, "logged": logged}
    if row[FallbackCol.COMPILED_BEFORE] == 0:
        skipped = logged is not None and "loop" in str(logged.get("reason") or "")
        return Finding(
            code=Code.COMPILE_NO_EFFECT, severity=Severity.HIGH if eager_steps else Severity.MEDIUM,
            statement=f"torch.compile had no effect on {name}: Dynamo spent {fmt_ns(row[FallbackCol.COMPILE_NS])} "
                      f"compiling it ({region}) in {step} and no compiled region of it ran in any captured step; "
                      f"{eager}.{reason}",
            next_step=LOOP_BREAK_ADVICE if skipped else NOT_LOGGED_ADVICE,
            evidence=evidence,
        )
    before = r.recompiles.filter(pl.col(RecompileCol.FRAME) == frame)
    recompiled = "; ".join(f"{x[RecompileCol.REGION]} in {x[RecompileCol.STEP]} cost {fmt_ns(x[RecompileCol.COST_NS])}"
                           for x in before.iter_rows(named=True))
    limit = logged is not None and "limit" in str(logged.get("kind") or "")
    guard = str(logged.get("reason") or "").partition("last guard failure: ")[2] if limit and logged else ""
    return Finding(
        code=Code.RECOMPILE_LIMIT, severity=Severity.HIGH if eager_steps else Severity.MEDIUM,
        statement=f"torch.compile stopped compiling {name} in {step}: its compile {region} produced no graph "
                  f"({'the recompile limit' if limit else 'the recompile limit or a skipped frame'}), after "
                  f"{row[FallbackCol.COMPILED_BEFORE]} compiled version(s) and "
                  f"{fmt_ns(row[FallbackCol.COMPILE_NS])} of compile work"
                  + (f" (recompiles: {recompiled})" if recompiled else "") + f"; {eager}.{reason}",
        next_step=(f"{ADVICE[guard_kind(guard)]} " if guard else "") + "Raising "
                  "torch._dynamo.config.recompile_limit only delays the fallback while every new value compiles "
                  "again." + ("" if logged else " " + NOT_LOGGED_ADVICE),
        # The compiles stop at the limit: their time is paid before it, not in every later step.
        evidence={**evidence, "recompiles": before.to_dicts(), "one_time_cost": True},
    )
