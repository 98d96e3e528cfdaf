"""Which leading steps are warm-up: the run's first iteration, or a first step slower than the
others by far (never one that is faster)."""

from __future__ import annotations

import numpy as np

#: A leading step slower than the median of the others by more than this many MADs is warm-up...
WARMUP_OUTLIER_MADS = 3.0
#: ...with the MAD taken as at least this share of that median: with a handful of steps whose
#: times agree to the microsecond, a MAD of almost nothing would flag a 2% slower first step.
WARMUP_MIN_MAD_SHARE = 0.01


def default_warmup(numbers: list[int | None], durations: list[int]) -> tuple[int, str]:
    """Leading steps to exclude, and why. Not by position alone: under
    ``schedule(wait=1, warmup=1, active=3)`` the first recorded step is ProfilerStep#2, two
    iterations into the run and as warm as the rest. The first step is warm-up when it is the
    run's first iteration (torch.profiler numbers steps from 0: ProfilerStep#0), or when it is a
    slow outlier: more than WARMUP_OUTLIER_MADS MADs above the median of the others. Never for
    being faster: what warms up (lazy initialization, autotuning, allocator growth, compilation)
    only adds time, and a fast first step is one of the run's steps (a smaller batch, or the CPU
    running ahead while the GPU's queue fills)."""
    if len(durations) < 3:
        return 0, "fewer than 3 steps: none excluded"
    if numbers and numbers[0] == 0:
        return 1, "step #0 is the run's first iteration (lazy initialization, caches, compilation)"
    rest = np.asarray(durations[1:], dtype=np.float64)
    median = float(np.median(rest))
    mad = max(float(np.median(np.abs(rest - median))), WARMUP_MIN_MAD_SHARE * median)
    if durations[0] - median > WARMUP_OUTLIER_MADS * mad:
        return 1, (f"the first step took {durations[0] / 1e6:.3f} ms, more than {WARMUP_OUTLIER_MADS:g} MADs above "
                   f"the others' median of {median / 1e6:.3f} ms")
    first = f"step #{numbers[0]}" if numbers and numbers[0] is not None else "the first step"
    faster = " (faster, which warm-up never is)" if median - durations[0] > WARMUP_OUTLIER_MADS * mad else ""
    return 0, f"{first} is not the run's first iteration and is not slower than the others{faster}: kept"
