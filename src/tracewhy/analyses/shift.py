"""How much one sample is shifted from another: the Hodges-Lehmann estimate with its exact
rank-based (Moses) confidence interval, and the Mann-Whitney test behind it.

Why this method for step times: a trace holds few steady steps (often 4 to 20), their
distribution is skewed with rare spikes (allocator calls, syncs, GC), and they are not normal.
The Hodges-Lehmann shift (the median of all pairwise differences b_j - a_i) estimates the change
in median under a location shift; its interval comes from the exact distribution of the
Mann-Whitney U statistic, so its coverage holds for any continuous distribution at any sample
size, and one spike moves it by one rank, not by its size. A percentile bootstrap of the
difference in medians undercovers badly at these sizes (with 5 steps the resampled median
takes only 5 values) and a t interval assumes a normality that spiky step times lack.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from tracewhy.analyses.stats import nearest_ns

#: Up to this many pairs the null distribution of U is computed exactly (a fraction of a second);
#: beyond it the normal approximation with continuity correction is accurate to well under 0.5%.
EXACT_MAX_PAIRS = 10_000


@dataclass(frozen=True)
class Shift:
    """B relative to A. ``*_ns`` are B minus A; the interval is None when the samples are too
    small to reach the requested confidence (with 3 and 3 values, the best is 90%)."""

    a_count: int
    b_count: int
    a_median_ns: float
    b_median_ns: float
    median_change_ns: float  # plain difference of the sample medians
    hl_shift_ns: float  # Hodges-Lehmann estimate of the shift
    ci_low_ns: float | None
    ci_high_ns: float | None
    confidence: float  # the interval's exact coverage (>= the requested level)
    requested_confidence: float
    p_value: float  # two-sided Mann-Whitney, exact below EXACT_MAX_PAIRS pairs
    method: str


def hodges_lehmann(a: npt.ArrayLike, b: npt.ArrayLike, confidence: float = 0.95) -> Shift:
    """Shift of ``b`` relative to ``a`` with a two-sided ``confidence`` interval."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.size == 0 or y.size == 0:
        raise ValueError("both samples need at least one value")
    n, m = x.size, y.size
    diffs = np.sort((y[None, :] - x[:, None]).ravel())
    pairs = diffs.size
    u_obs = float((diffs > 0).sum() + 0.5 * (diffs == 0).sum())  # pairs where b > a
    alpha = 1.0 - confidence
    if pairs <= EXACT_MAX_PAIRS:
        cdf = _u_cdf(n, m)
        # Largest c with P(U <= c) <= alpha / 2; the interval is [D_(c+1), D_(nm-c)].
        below = np.flatnonzero(cdf <= alpha / 2)
        c = int(below[-1]) if below.size else -1
        achieved = 1.0 - 2.0 * float(cdf[c]) if c >= 0 else 0.0
        lo_u, hi_u = math.floor(u_obs), math.floor(pairs - u_obs)  # P(U >= u) = P(U <= nm - u)
        p = 2.0 * min(float(cdf[min(lo_u, pairs)]), float(cdf[min(hi_u, pairs)]))
        method = "Hodges-Lehmann shift, exact Mann-Whitney (Moses) interval"
    else:
        mean = pairs / 2.0
        sd = math.sqrt(n * m * (n + m + 1) / 12.0)
        z = NormalDist().inv_cdf(1.0 - alpha / 2)
        c = math.floor(mean - z * sd - 0.5)
        achieved = 1.0 - 2.0 * NormalDist().cdf((c + 0.5 - mean) / sd) if c >= 0 else 0.0
        p = 2.0 * NormalDist().cdf(-(abs(u_obs - mean) - 0.5) / sd) if abs(u_obs - mean) > 0.5 else 1.0
        method = "Hodges-Lehmann shift, normal-approximation Mann-Whitney interval"
    ci_low: float | None = float(diffs[c]) if c >= 0 else None
    ci_high: float | None = float(diffs[pairs - 1 - c]) if c >= 0 else None
    return Shift(
        a_count=n,
        b_count=m,
        a_median_ns=float(np.median(x)),
        b_median_ns=float(np.median(y)),
        median_change_ns=float(np.median(y) - np.median(x)),
        hl_shift_ns=float(np.median(diffs)),
        ci_low_ns=ci_low,
        ci_high_ns=ci_high,
        confidence=achieved if c >= 0 else 0.0,
        requested_confidence=confidence,
        p_value=min(1.0, p),
        method=method,
    )


def in_whole_ns(s: Shift) -> Shift:
    """``s`` between two samples of durations with its medians, shift and bounds in whole
    nanoseconds, the nearest (a median of an even count, and the shift, can fall between two)."""

    def whole(v: float | None) -> int | None:
        return None if v is None else nearest_ns(v)

    return dataclasses.replace(s, a_median_ns=nearest_ns(s.a_median_ns), b_median_ns=nearest_ns(s.b_median_ns),
                               median_change_ns=nearest_ns(s.median_change_ns), hl_shift_ns=nearest_ns(s.hl_shift_ns),
                               ci_low_ns=whole(s.ci_low_ns), ci_high_ns=whole(s.ci_high_ns))


def _u_cdf(n: int, m: int) -> npt.NDArray[np.float64]:
    """P(U <= u) for u = 0..n*m under H0 (no ties), U = #pairs with b > a.

    Recurrence on the largest of all n + m values: it belongs to B with probability m/(n+m)
    (adding n to U: it exceeds every a) or to A with probability n/(n+m) (adding nothing).
    """
    # prob[i][j] is the pmf for sizes (i, j); we keep one row of j at a time.
    prev = [np.ones(1) for _ in range(m + 1)]  # i = 0: U = 0 for any j
    for i in range(1, n + 1):
        row = [np.zeros(1)] * (m + 1)
        row[0] = np.ones(1)  # j = 0: U = 0
        for j in range(1, m + 1):
            pmf = np.zeros(i * j + 1)
            a_part = prev[j]  # (i - 1, j): the largest value was an a
            pmf[: a_part.size] += (i / (i + j)) * a_part
            b_part = row[j - 1]  # (i, j - 1): the largest value was a b, above all i a's
            pmf[i : i + b_part.size] += (j / (i + j)) * b_part
            row[j] = pmf
        prev = row
    cdf: npt.NDArray[np.float64] = np.minimum(np.cumsum(prev[m]), 1.0)
    return cdf
