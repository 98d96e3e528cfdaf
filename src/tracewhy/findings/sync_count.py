"""One count of the calls that block the host on the GPU, for every output that states one:
``check --max-syncs-per-step`` and diagnose's ``nsys-sync-api`` say the same number, over the
same calls (analyses/syncs.py finds them), with the statistic named."""

from __future__ import annotations

from typing import Final

import msgspec
import polars as pl

from tracewhy.analyses.steps import StepCol
from tracewhy.findings.context import Context
from tracewhy.model.schema import Col

#: Which calls count, in the words every statement and note uses.
COUNTED: Final = ("device, stream, event and context synchronize and synchronous (non-Async) memcpy/memset "
                  "calls, CUDA or HIP, runtime or driver; each call once")


class SyncCount(msgspec.Struct, frozen=True):
    """``per_step``: blocking calls per steady step (their mean), or over the whole trace when it
    has no steady steps (``steps`` is 0 then); ``by_name``: the same figure per call name."""

    per_step: float
    steps: int
    by_name: dict[str, float]

    @property
    def statistic(self) -> str:
        """What ``per_step`` is: "mean of 3 steady steps", or "over the trace (no step markers)"."""
        return f"mean of {self.steps} steady steps" if self.steps else "over the trace (no step markers)"

    def breakdown(self) -> str:
        """The names behind the count, largest first: "cudaEventSynchronize 7.67, cudaDeviceSynchronize 0.33"."""
        return ", ".join(f"{name} {n:.3g}" for name, n in self.by_name.items())


def blocking_syncs(ctx: Context) -> SyncCount:
    """Blocking calls per steady step (or over the trace), each call once, by name."""
    r = ctx.syncs()
    steady = r.per_step.filter(pl.col(StepCol.STEADY))
    calls = r.calls
    n = steady.height
    if n:
        calls = calls.filter(pl.col("step").is_in(steady.get_column("step").to_list()))
    by_name = calls.group_by(Col.NAME).len().sort(["len", Col.NAME], descending=[True, False])
    scale = 1.0 / n if n else 1.0
    return SyncCount(per_step=calls.height * scale, steps=n,
                     by_name={str(name): count * scale for name, count in by_name.iter_rows()})
