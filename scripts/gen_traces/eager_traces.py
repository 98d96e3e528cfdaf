"""Eager-mode training loops on synthetic batches: the schedule/no-schedule pair, the
per-step ``.item()`` sync, the heavy-options capture and the planted-slowdown A/B pair."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch.autograd.profiler import record_function
from workloads import make_model, synthetic_batch, train_step

SCHEDULE = {"wait": 1, "warmup": 1, "active": 5}
NOSCHEDULE_ITERATIONS = 6
ITEM_SYNC_SCHEDULE = {"wait": 1, "warmup": 1, "active": 6}
SLOW_STEP_SCHEDULE = {"wait": 1, "warmup": 1, "active": 10}
PLANTED_SLEEP_S = 0.005
HEAVY_OPTIONS = {
    "record_shapes": True,
    "with_stack": True,
    "profile_memory": True,
    "with_flops": True,
    "with_modules": True,
}


def _scheduled_loop(
    dest: Path,
    sched: dict[str, int],
    *,
    planted_sleep_s: float | None = None,
    read_scalars: bool = False,
    **profiler_options: bool,
) -> None:
    """Train under ``step_schedule(**sched)``, one ``prof.step()`` per iteration."""
    seed_everything()
    model, optimizer = make_model()
    g = torch.Generator().manual_seed(0)
    with cpu_profile(schedule=step_schedule(**sched), **profiler_options) as prof:
        for _ in range(total_steps(**sched)):
            x, y = synthetic_batch(g)
            if planted_sleep_s is not None:
                with record_function("planted_slowdown"):
                    time.sleep(planted_sleep_s)
            loss = train_step(model, optimizer, x, y)
            if read_scalars:
                # What a logging line does: each read waits for the value (a device sync on
                # GPU; on CPU it is cheap but aten::item/_local_scalar_dense still show).
                _ = loss.item()
                with torch.no_grad():
                    predictions = model(x).argmax(dim=1).cpu()
                _ = (predictions == y).float().mean().item()
            prof.step()
    export_trace(prof, dest)


def make_eager_schedule(dest: Path) -> None:
    _scheduled_loop(dest, SCHEDULE, record_shapes=True)


def make_eager_noschedule(dest: Path) -> None:
    """No schedule and no ``prof.step()``: iterations are ``train_step`` annotations only."""
    seed_everything()
    model, optimizer = make_model()
    g = torch.Generator().manual_seed(0)
    with cpu_profile(record_shapes=True) as prof:
        for _ in range(NOSCHEDULE_ITERATIONS):
            with record_function("train_step"):
                x, y = synthetic_batch(g)
                train_step(model, optimizer, x, y)
    export_trace(prof, dest)


def make_item_sync(dest: Path) -> None:
    _scheduled_loop(dest, ITEM_SYNC_SCHEDULE, read_scalars=True, record_shapes=True)


def make_with_stack_memory(dest: Path) -> None:
    _scheduled_loop(dest, SCHEDULE, **HEAVY_OPTIONS)


def make_slow_step_base(dest: Path) -> None:
    _scheduled_loop(dest, SLOW_STEP_SCHEDULE, record_shapes=True)


def make_slow_step_planted(dest: Path) -> None:
    _scheduled_loop(dest, SLOW_STEP_SCHEDULE, planted_sleep_s=PLANTED_SLEEP_S, record_shapes=True)
