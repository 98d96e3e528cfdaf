"""Loops whose steps are not what ``ProfilerStep`` markers would say: a capture with the
autograd profiler API (no ``prof.step()``, so no step markers at all) whose first iteration
fills a cache, and a scheduled capture whose first recorded step is the fastest."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch import nn
from torch.utils.data import DataLoader
from workloads import BATCH_SIZE, SyntheticImages, make_model, synthetic_batch, train_step

AUTOGRAD_API_FILE = "cpu_autograd_api_loader.pt.trace.json.gz"
AUTOGRAD_API_BATCHES = 7
AUTOGRAD_API_SLEEP_PER_ITEM_S = 0.001
#: What the dataset's first access costs once (an index or cache filled on first use).
AUTOGRAD_API_FIRST_ACCESS_S = 0.25
AUTOGRAD_API_PLANTED = (
    f"no ProfilerStep markers and no record_function: torch.autograd.profiler.profile() around "
    f"{AUTOGRAD_API_BATCHES} plain iterations (fetch, forward, cross-entropy, backward, SGD step, zero_grad) over a "
    f"DataLoader(num_workers=0) whose __getitem__ sleeps {AUTOGRAD_API_SLEEP_PER_ITEM_S * 1e3:g} ms per item "
    f"(about {AUTOGRAD_API_SLEEP_PER_ITEM_S * BATCH_SIZE * 1e3:g} ms per batch: input-bound), and whose first access "
    f"sleeps {AUTOGRAD_API_FIRST_ACCESS_S * 1e3:g} ms once more (a cache filled on first use): the first iteration "
    "is warm-up."
)

FASTER_FIRST_FILE = "cpu_faster_first_step.pt.trace.json.gz"
FASTER_FIRST_SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}
#: The batch grows after the first recorded step: the later steps do this many times the work.
FASTER_FIRST_GROWTH = 8
FASTER_FIRST_PLANTED = (
    "a 3-step capture whose first recorded step (ProfilerStep#2, two iterations into the run) is the fastest: "
    f"it trains on a batch of {BATCH_SIZE}, the two after it on batches {FASTER_FIRST_GROWTH}x larger (a batch-size "
    "ramp). The first step is not warm-up."
)


class _CacheFilledOnFirstUse(SyntheticImages):
    """The first access pays once for what a real dataset does lazily (opening shards, reading
    an index): the first iteration is slower than the rest for a reason that does not repeat."""

    def __init__(self, length: int) -> None:
        super().__init__(length, AUTOGRAD_API_SLEEP_PER_ITEM_S)
        self.filled = False

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.filled:
            time.sleep(AUTOGRAD_API_FIRST_ACCESS_S)
            self.filled = True
        return super().__getitem__(index)


def make_autograd_api_loader(dest: Path) -> None:
    seed_everything()
    model, optimizer = make_model()
    dataset = _CacheFilledOnFirstUse(AUTOGRAD_API_BATCHES * BATCH_SIZE)
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=False, num_workers=0)
    # The autograd profiler API, as 2021-era scripts used it: no schedule, no prof.step().
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    export_trace(prof, dest)  # type: ignore[arg-type]


def make_faster_first_step(dest: Path) -> None:
    seed_everything()
    model, optimizer = make_model()
    g = torch.Generator().manual_seed(0)
    sched = FASTER_FIRST_SCHEDULE
    first_recorded = sched["wait"] + sched["warmup"]
    with cpu_profile(schedule=step_schedule(**sched), record_shapes=True) as prof:
        for i in range(total_steps(**sched)):
            batches = [synthetic_batch(g) for _ in range(1 if i <= first_recorded else FASTER_FIRST_GROWTH)]
            x = torch.cat([b[0] for b in batches])
            y = torch.cat([b[1] for b in batches])
            train_step(model, optimizer, x, y)
            prof.step()
    export_trace(prof, dest)
