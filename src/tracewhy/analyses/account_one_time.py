"""Steps a one-time compile made slow, left out of the step account and its predictions.

A recompile that happens once (the batch shape changed once, a new Python value once) stalls
its step for the whole compile: on a capture of six steps, one 8.1 s recompile among steps of
0.75 ms makes the mean step 1.35 s and "99.9% compilation", although the steps after it reuse
the new graph and pay nothing. Such a step is no steady step: it is a slow outlier whose time is
mostly compilation, as the run's first iteration is. A compile in every step (or in most) is a
per-step cost and stays in (``compile`` and ``diagnose``'s ``recompile`` judge it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracewhy.analyses.account_names import PartKind
from tracewhy.analyses.account_parts import PartRules
from tracewhy.analyses.critical_path_graph import Graph
from tracewhy.analyses.warmup import WARMUP_MIN_MAD_SHARE, WARMUP_OUTLIER_MADS
from tracewhy.units import fmt_ns

#: A slow step is a one-time compile's when compilation holds more than this share of its path.
ONE_TIME_COMPILE_MIN_SHARE = 0.5


@dataclass(frozen=True)
class OneTimeCompileStep:
    """An analysed step left out: its index among the trace's steps, its name, its duration and
    the compilation on its critical path."""

    step: int
    name: str
    window_ns: int
    compile_ns: int


def one_time_compile_steps(rules: PartRules, g: Graph, paths: list[tuple[int, int, int, np.ndarray]],
                           names: list[str]) -> list[OneTimeCompileStep]:
    """Of ``paths`` ((step, window start, window end, edges) per analysed step), the steps to
    leave out: more than WARMUP_OUTLIER_MADS MADs slower than the analysed steps' median, the
    path mostly compilation, and fewer than half of all the analysed steps mostly compilation
    (else compiling is the loop's per-step cost, its first recompile merely the longest). The
    other steps are classified only when such an outlier exists, so most traces pay nothing."""
    if len(paths) < 3:
        return []
    durations = np.array([end - start for _, start, end, _ in paths], dtype=np.float64)
    median = float(np.median(durations))
    mad = max(float(np.median(np.abs(durations - median))), WARMUP_MIN_MAD_SHARE * median)

    def compile_ns(start: int, e: np.ndarray) -> int:
        if e.size == 0:
            return 0
        part, _, _ = rules.of_edges(g.kind[e].astype(np.int64), g.attr[e], rules.category[e], g.src[e], g.dst[e])
        dur = g.node_ts[g.dst[e]] - np.maximum(g.node_ts[g.src[e]], start)
        compiling = np.array([rules.parts[i].kind == PartKind.COMPILATION for i in part.tolist()], dtype=bool)
        return int(dur[compiling].sum())

    slow = durations - median > WARMUP_OUTLIER_MADS * mad
    share = ONE_TIME_COMPILE_MIN_SHARE
    out = [OneTimeCompileStep(step, names[step], int(d), c) for (step, start, _, e), d, s in
           zip(paths, durations, slow, strict=True) if s and (c := compile_ns(start, e)) > share * d]
    if not out:
        return []
    # Compiling in half the steps or more is the loop's cost, however its size varies.
    compiling = len(out) + sum(1 for (_, start, _, e), d, s in zip(paths, durations, slow, strict=True)
                               if not s and compile_ns(start, e) > share * d)
    return out if 2 * compiling < len(paths) else []


def one_time_note(left_out: list[OneTimeCompileStep]) -> str | None:
    """What the account says of the steps it left out."""
    if not left_out:
        return None
    said = ", ".join(f"{s.name} ({fmt_ns(s.window_ns)}, {fmt_ns(s.compile_ns)} of it compiling)" for s in left_out)
    return (f"left out as one-time compiles (slow outliers whose time is mostly compilation; "
            f"`tracewhy compile` shows them): {said}")
