"""Training loops fed by a DataLoader: single-process slow (sleeping ``__getitem__``, an
input-bound job) and fast (the same loader without the sleep), the README demo, and the slow
loader fed by worker processes too few for its per-batch work."""

from __future__ import annotations

from pathlib import Path

from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from workloads import BATCH_SIZE, make_loader, make_model, train_step

SCHEDULE = {"wait": 1, "warmup": 1, "active": 8}
SLOW_SLEEP_PER_ITEM_S = 0.002
DEMO_SCHEDULE = {"wait": 1, "warmup": 2, "active": 16}
DEMO_SLEEP_PER_ITEM_S = 0.0002
#: Two workers, each taking SLOW_SLEEP_PER_BATCH_S per batch: they deliver a batch every
#: ~16 ms against a ~2 ms step, so the main process still waits in __next__ most of the step.
FEW_WORKERS = 2


def _loader_loop(dest: Path, sched: dict[str, int], sleep_per_item_s: float, num_workers: int = 0) -> None:
    seed_everything()
    model, optimizer = make_model()
    loader = make_loader(total_steps(**sched), sleep_per_item_s, num_workers)
    with cpu_profile(schedule=step_schedule(**sched), record_shapes=True) as prof:
        # Fetching the next batch happens at the top of the loop, after the previous
        # prof.step(), so each DataLoader __next__ span falls inside its own ProfilerStep.
        for x, y in loader:
            train_step(model, optimizer, x, y)
            prof.step()
    export_trace(prof, dest)


def make_dataloader_slow(dest: Path) -> None:
    _loader_loop(dest, SCHEDULE, SLOW_SLEEP_PER_ITEM_S)


def make_dataloader_fast(dest: Path) -> None:
    _loader_loop(dest, SCHEDULE, 0.0)


def make_dataloader_few_workers(dest: Path) -> None:
    _loader_loop(dest, SCHEDULE, SLOW_SLEEP_PER_ITEM_S, FEW_WORKERS)


def make_demo(dest: Path) -> None:
    _loader_loop(dest, DEMO_SCHEDULE, DEMO_SLEEP_PER_ITEM_S)


SLOW_SLEEP_PER_BATCH_S = SLOW_SLEEP_PER_ITEM_S * BATCH_SIZE
DEMO_SLEEP_PER_BATCH_S = DEMO_SLEEP_PER_ITEM_S * BATCH_SIZE
