"""Ranks whose torch.compile work differs, from the TORCH_TRACE logs of several ranks
(``compile-ranks-differ``): a rank that compiles other graphs, breaks elsewhere or recompiles
more runs other code than its peers, which makes it a straggler at every collective, and a
collective inside graphs that differ can hang the job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from tracewhy.findings.codes import Code
from tracewhy.findings.model import Finding, Severity

if TYPE_CHECKING:
    from tracewhy.model.torch_logs import TorchLogs

#: Ranks named in the statement; the evidence holds every rank's row.
NAMED_RANKS: Final = 3


def rank_divergence_findings(logs: TorchLogs | None) -> list[Finding]:
    """One finding when the logs of several ranks show ranks whose compiles differ from most."""
    if logs is None or logs.ranks is None or logs.ranks.height < 2:
        return []
    from tracewhy.model.torch_logs import LogRankCol  # (already loaded: it made ``logs``)

    differing = [row for row in logs.ranks.iter_rows(named=True) if row[LogRankCol.DIFFERS]]
    if not differing:
        return []
    ranked = logs.ranks.drop_nulls(LogRankCol.RANK).height or logs.ranks.height
    named = "; ".join(f"rank {row[LogRankCol.RANK]} {row[LogRankCol.DIFFERS]}" for row in differing[:NAMED_RANKS])
    more = f" (and {len(differing) - NAMED_RANKS} more ranks)" if len(differing) > NAMED_RANKS else ""
    return [Finding(
        code=Code.COMPILE_RANKS_DIFFER, severity=Severity.MEDIUM,
        statement=f"{len(differing)} of {ranked} ranks compile differently from the others (TORCH_TRACE "
                  f"logs): {named}{more}. Ranks that run different graphs take different times to each collective "
                  "(the others wait), and a collective inside graphs that differ can hang.",
        next_step="Make the compiled code the same on every rank: no branch on the rank, on rank-local values or on "
                  "a per-rank shape inside the compiled function (torch._dynamo.mark_dynamic on a dimension that "
                  "varies). `tlparse DIR --all-ranks-html` shows every rank's compiles side by side.",
        evidence={"ranks": logs.ranks.to_dicts(), "reference_rank_of_breaks": logs.rank},
    )]
