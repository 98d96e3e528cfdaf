"""The change to advise when the main process waits on the DataLoader, decided from what the
trace says the loader already does: without workers, load in worker processes; with workers
and still waiting, the per-batch work is the cost, so make it cheaper or size the workers."""

from __future__ import annotations

from typing import Any

from tracewhy.findings.applicability import RunFacts
from tracewhy.units import fmt_ns as ms


def worker_scale(wait_ns: float, window_ns: float) -> float | None:
    """How many times the current workers keep up with the step. With N workers each taking B
    per batch, a step that computes for S waits W = B/N - S, so the window is S + W = B/N and
    B/S = N * window / (window - wait) workers hide the work (None: the step is all wait)."""
    compute = window_ns - wait_ns
    return window_ns / compute if compute > 0 and window_ns > 0 else None


def loader_advice(facts: RunFacts, wait_ns: float, window_ns: float | None, suffix: str = "") -> str:
    """The next step for time spent waiting in DataLoader __next__ (``wait_ns`` per ``window_ns``)."""
    # pin_memory only speeds up host-to-device copies: advice for a run that has a device.
    pin = "" if facts.cpu_only else "pin_memory=True, "
    if facts.loader_workers is not True:
        per_gpu = "" if facts.cpu_only else " (start at the CPU cores per GPU)"
        then = "" if facts.cpu_only else "; then move any per-sample preprocessing that is still slow to the GPU"
        return (f"Load batches in worker processes: DataLoader(..., num_workers=N{per_gpu}, {pin}"
                f"persistent_workers=True, prefetch_factor=2+){then}{suffix}.")
    scale = worker_scale(wait_ns, window_ns) if window_ns else None
    size = (f"about {scale:.1f}x the num_workers it runs now (step {ms(window_ns or 0)} / the "
            f"{ms((window_ns or 0) - wait_ns)} not spent waiting), within the CPU cores" if scale else
            "more workers, within the CPU cores")
    where = " on the GPU" if not facts.cpu_only else " vectorized over the batch"
    return ("The DataLoader already runs worker processes and the main process still waits: the cost is the "
            "per-batch work each worker does (Dataset __getitem__, transforms, collate_fn), so turning workers on "
            f"is not the fix. Make that work cheaper (decode or augment less, do the transforms{where}, a leaner "
            f"collate_fn), or size the workers to it: {size}; keep persistent_workers=True, {pin}"
            f"prefetch_factor=2+{suffix}.")


def loader_evidence(facts: RunFacts, wait_ns: float, window_ns: float | None) -> dict[str, Any]:
    """What the advice was decided from: the loader's workers and the sizing figure."""
    scale = worker_scale(wait_ns, window_ns) if window_ns else None
    return {"loader_workers": facts.loader_workers, "loader_workers_rule": facts.loader_workers_rule,
            "worker_scale": None if scale is None else round(scale, 2)}
