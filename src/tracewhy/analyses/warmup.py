"""Which leading steps are warm-up: the run's first iteration, or a first step slower than the
others by far (never one that is faster)."""

from __future__ import annotations

import numpy as np

#: A leading step slower than the median of the others by more than this many MADs is warm-up...
WARMUP_OUTLIER_MADS = 3.0
#: ...with the MAD taken as at least this share of that median: with a handful of steps whose
#: times agree to the microsecond, a MAD of almost nothing would flag a 2% slower first step.
WARMUP_MIN_MAD_SHARE = 0.01
#: A first step that launched more than this many times its own span of GPU work (and this many
#: times what the others launch for theirs) ran while the GPU's queue was still filling: its span
#: is not the loop's period (94.6 ms of GPU work in a 35 ms step among 96 ms ones on HTA's V100
#: trace, the GPU drained when the capture began). Speed alone never decides; this does.
QUEUE_FILLING_RATIO = 2.0
#: Of two unnumbered steps (iterations found without markers), the first is warm-up when it took
#: more than this many times the second: two durations give no spread to measure, but a first
#: pass of 1.17 s before one of 3.4 ms (TraceLens' MI300X normalization-layer benchmark, three
#: passes over ten layers) is no steady step.
WARMUP_PAIR_RATIO = 3.0


def default_warmup(numbers: list[int | None], durations: list[int],
                   gpu_busy: list[int] | None = None) -> tuple[int, str]:
    """Leading steps to exclude, and why (of 2 steps: WARMUP_PAIR_RATIO). Not by position alone: under
    ``schedule(wait=1, warmup=1, active=3)`` the first recorded step is ProfilerStep#2, two
    iterations into the run and as warm as the rest. The first step is warm-up when it is the
    run's first iteration (torch.profiler numbers steps from 0: ProfilerStep#0), or when it is a
    slow outlier: more than WARMUP_OUTLIER_MADS MADs above the median of the others. Never for
    being faster: what warms up (lazy initialization, autotuning, allocator growth, compilation)
    only adds time, and a fast first step is one of the run's steps (a smaller batch). Unless
    ``gpu_busy`` (the GPU work each step launched) shows the GPU's queue still filling in the
    first step (QUEUE_FILLING_RATIO): the CPU ran ahead of a GPU the capture found idle."""
    if len(durations) < 2:
        return 0, "fewer than 3 steps: none excluded"
    if len(durations) >= 3 and numbers and numbers[0] == 0:
        return 1, "step #0 is the run's first iteration (lazy initialization, caches, compilation)"
    if len(durations) == 2:
        # Numbered steps keep both: a profiler schedule picks them from a warm run, and its last
        # step can be a stub (49 µs after 9.3 ms on HTA's MI250 trace).
        if all(n is None for n in numbers) and durations[0] > WARMUP_PAIR_RATIO * durations[1]:
            return 1, (f"the first of 2 steps took {durations[0] / 1e6:.3f} ms, more than {WARMUP_PAIR_RATIO:g}x "
                       f"the second's {durations[1] / 1e6:.3f} ms")
        return 0, "fewer than 3 steps: none excluded"
    rest = np.asarray(durations[1:], dtype=np.float64)
    median = float(np.median(rest))
    mad = max(float(np.median(np.abs(rest - median))), WARMUP_MIN_MAD_SHARE * median)
    if durations[0] - median > WARMUP_OUTLIER_MADS * mad:
        return 1, (f"the first step took {durations[0] / 1e6:.3f} ms, more than {WARMUP_OUTLIER_MADS:g} MADs above "
                   f"the others' median of {median / 1e6:.3f} ms")
    if gpu_busy is not None and durations[0] > 0:
        others = [b / d for b, d in zip(gpu_busy[1:], durations[1:], strict=True) if d > 0]
        ratio = gpu_busy[0] / durations[0]
        if others and ratio > QUEUE_FILLING_RATIO * max(1.0, float(np.median(others))):
            return 1, (f"the first step launched {gpu_busy[0] / 1e6:.3f} ms of GPU work in "
                       f"{durations[0] / 1e6:.3f} ms: the CPU ran ahead while the GPU's queue filled")
    first = f"step #{numbers[0]}" if numbers and numbers[0] is not None else "the first step"
    faster = " (faster, which warm-up never is)" if median - durations[0] > WARMUP_OUTLIER_MADS * mad else ""
    return 0, f"{first} is not the run's first iteration and is not slower than the others{faster}: kept"
