"""Traces for ``tracewhy lines``: ``with_stack=True`` training loops, each with one
slow Python function planted on a known line. With ``with_stack`` the profiler names a frame
``file.py(N): function``, N being the line the function starts on (``co_firstlineno``) for a
function called while the profiler runs, so the planted line is each planted function's ``def``.

- sleep: a Dataset's ``__getitem__`` sleeps (slow decoding): first by host self time;
- item: ``read_metrics`` reads three scalars with ``.item()`` every step: first by sync points;
- loop: ``python_loop_sum`` adds up a tensor element by element in a Python loop: first by host
  self time and by the CPU ops it calls directly.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch.utils.data import DataLoader, Dataset
from workloads import BATCH_SIZE, IMAGE_SHAPE, NUM_CLASSES, Batch, make_model, synthetic_batch, train_step

SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}
OPTIONS = "with_stack=True"
SLEEP_PER_ITEM_S = 0.001
ITEM_READS_PER_STEP = 3
LOOP_ELEMENTS = 300

SLEEP_FILE = "cpu_lines_sleep.pt.trace.json.gz"
ITEM_FILE = "cpu_lines_item.pt.trace.json.gz"
LOOP_FILE = "cpu_lines_loop.pt.trace.json.gz"


class SlowImages(Dataset[Batch]):
    """Fixed random images whose every fetch sleeps: the planted slow line of the sleep trace."""

    def __init__(self, length: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randn(length, *IMAGE_SHAPE, generator=g)
        self.labels = torch.randint(0, NUM_CLASSES, (length,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Batch:
        time.sleep(SLEEP_PER_ITEM_S)
        return self.images[index], self.labels[index]


def read_metrics(loss: torch.Tensor, logits: torch.Tensor) -> tuple[float, float, float]:
    """The planted reads of the item trace: three ``.item()`` per step (a device sync each on GPU)."""
    return loss.item(), logits.max().item(), logits.mean().item()


def python_loop_sum(x: torch.Tensor) -> torch.Tensor:
    """The planted loop of the loop trace: one Python iteration and a few ops per element."""
    total = torch.zeros(())
    for value in x.flatten()[:LOOP_ELEMENTS]:
        total = total + value * 2
    return total


def make_sleep(dest: Path) -> None:
    seed_everything()
    model, optimizer = make_model()
    loader = DataLoader(SlowImages(total_steps(**SCHEDULE) * BATCH_SIZE), batch_size=BATCH_SIZE,
                        shuffle=False, num_workers=0)
    with cpu_profile(schedule=step_schedule(**SCHEDULE), with_stack=True) as prof:
        for x, y in loader:
            train_step(model, optimizer, x, y)
            prof.step()
    export_trace(prof, dest)


def make_item(dest: Path) -> None:
    seed_everything()
    model, optimizer = make_model()
    g = torch.Generator().manual_seed(0)
    with cpu_profile(schedule=step_schedule(**SCHEDULE), with_stack=True) as prof:
        for _ in range(total_steps(**SCHEDULE)):
            x, y = synthetic_batch(g)
            loss = train_step(model, optimizer, x, y)
            with torch.no_grad():
                read_metrics(loss, model(x))
            prof.step()
    export_trace(prof, dest)


def make_loop(dest: Path) -> None:
    seed_everything()
    model, optimizer = make_model()
    g = torch.Generator().manual_seed(0)
    with cpu_profile(schedule=step_schedule(**SCHEDULE), with_stack=True) as prof:
        for _ in range(total_steps(**SCHEDULE)):
            x, y = synthetic_batch(g)
            train_step(model, optimizer, x, y)
            python_loop_sum(x)
            prof.step()
    export_trace(prof, dest)


def _def_line(function: object) -> str:
    code = function.__code__  # type: ignore[attr-defined]
    return f"`{Path(code.co_filename).name}({code.co_firstlineno}): {code.co_name}`"


PLANTED_SLEEP = (f"input-bound: {_def_line(SlowImages.__getitem__)} sleeps {SLEEP_PER_ITEM_S * 1e3:g} ms per "
                 f"item ({SLEEP_PER_ITEM_S * BATCH_SIZE * 1e3:g} ms per batch of {BATCH_SIZE}); "
                 "first by host self time in `tracewhy lines`.")
PLANTED_ITEM = (f"{_def_line(read_metrics)} calls `.item()` {ITEM_READS_PER_STEP} times per step "
                "(aten::item under it; no other scalar read in the loop); first by sync points.")
PLANTED_LOOP = (f"{_def_line(python_loop_sum)} loops in Python over {LOOP_ELEMENTS} elements of the batch "
                "every step (aten::add / aten::mul / aten::select per element); first by host self time "
                "and by the CPU ops it calls.")


# Appended below the planted functions above so that their lines, which the traces already
# made name, stay where they are.
STARTED_FILE = "cpu_lines_started.pt.trace.json.gz"
START_AT_ITERATION = 2
STARTED_STEPS = 3
# No wait and no warm-up: prof.start() starts recording at once, in the loop's own frame.
STARTED_SCHEDULE = {"wait": 0, "warmup": 0, "active": STARTED_STEPS}


def make_started(dest: Path) -> None:
    """The profiler started inside the loop (``prof.start()`` at its third iteration): the loop's
    frame is already running then, and it reads the loss with ``.item()`` on its own line."""
    seed_everything()
    model, optimizer = make_model()
    g = torch.Generator().manual_seed(0)
    prof = cpu_profile(schedule=step_schedule(**STARTED_SCHEDULE), with_stack=True)
    losses = []
    for i in range(START_AT_ITERATION + STARTED_STEPS):
        if i == START_AT_ITERATION:
            prof.start()
        x, y = synthetic_batch(g)
        loss = train_step(model, optimizer, x, y)
        losses.append(loss.item())
        if i >= START_AT_ITERATION:
            prof.step()
    prof.stop()
    export_trace(prof, dest)


PLANTED_STARTED = (f"`prof.start()` inside the loop of {_def_line(make_started)} at iteration {START_AT_ITERATION}; "
                   "the loop's own frame, running when the profiler started, is named by the `prof.start()` line, "
                   "and reads the loss with `.item()` on another of its lines once per step "
                   f"({STARTED_STEPS} ProfilerSteps).")
