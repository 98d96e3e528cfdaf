"""Scalar reads from two sources in one loop: Adam's single-tensor step (``foreach=False``, the
path PyTorch takes for CPU parameters: ``_get_value(step_t)`` calls ``.item()`` on each
parameter's step counter) and one planted ``loss.item()`` in user code, captured with
``with_stack`` so the reading Python line is in the trace."""

from __future__ import annotations

from pathlib import Path

import torch
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch.autograd.profiler import record_function
from workloads import SmallCNN, synthetic_batch, train_step

SCHEDULE = {"wait": 1, "warmup": 1, "active": 5}


def log_loss(loss: torch.Tensor) -> float:
    """The planted user read: what a logging line does every step."""
    return loss.item()


def make_adam_item(dest: Path) -> None:
    seed_everything()
    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(0)
    with cpu_profile(schedule=step_schedule(**SCHEDULE), record_shapes=True, with_stack=True) as prof:
        for _ in range(total_steps(**SCHEDULE)):
            x, y = synthetic_batch(g)
            loss = train_step(model, optimizer, x, y)
            with record_function("log_loss"):
                log_loss(loss)
            prof.step()
    export_trace(prof, dest)


if __name__ == "__main__":
    import sys

    make_adam_item(Path(sys.argv[1]))
