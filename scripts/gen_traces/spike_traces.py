"""Steps that run long on a schedule, for ``step-time-spikes``: a training loop (an MLP, SGD) that
every few steps also does work of another kind, as real loops do. In the first, every 4th step
also evaluates (20 forwards under ``torch.no_grad()``, outside any annotation: ops the other
steps do not run); in the second, every 3rd step saves a checkpoint (``torch.save`` of the
model's and optimizer's state into a buffer: Python and serialization the profiler records almost
nothing of, after the optimizer step, at the step's end)."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import torch
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch import nn

#: Thirteen active steps: the schedule's steps (every 4th, every 3rd) land three or four times.
SCHEDULE = {"wait": 1, "warmup": 2, "active": 13}
OPTIONS = "(defaults: no shapes, no stacks)"
EVAL_FILE = "cpu_spikes_eval.pt.trace.json.gz"
SAVE_FILE = "cpu_spikes_save.pt.trace.json.gz"
#: Every EVAL_EVERY-th loop iteration (i % EVAL_EVERY == 0) evaluates EVAL_FORWARDS batches.
EVAL_EVERY, EVAL_FORWARDS = 4, 20
#: Every SAVE_EVERY-th loop iteration saves a checkpoint.
SAVE_EVERY = 3
LAYERS = 3  # Linear layers of the MLP: each forward is LAYERS aten::linear calls
PLANTED_EVAL = (
    f"an MLP (Linear 256->1024, ReLU, Linear 1024->1024, ReLU, Linear 1024->10; SGD with momentum) whose loop "
    f"iterations i % {EVAL_EVERY} == 0 also evaluate: {EVAL_FORWARDS} forwards of the batch under torch.no_grad(), "
    f"outside any annotation ({EVAL_FORWARDS * LAYERS} extra aten::linear calls in those steps)")
PLANTED_SAVE = (
    f"the same MLP whose loop iterations i % {SAVE_EVERY} == 0 also save a checkpoint after the optimizer step: "
    "torch.save({'model': state_dict, 'opt': optimizer state_dict}) into an io.BytesIO (untraced Python and "
    "serialization at the step's end)")


def _mlp() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def _loop(dest: Path, extra: Callable[[int, nn.Module, torch.optim.Optimizer, torch.Tensor], None]) -> None:
    seed_everything()
    model, optimizer = _mlp()
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    with cpu_profile(schedule=step_schedule(**SCHEDULE)) as prof:
        for i in range(total_steps(**SCHEDULE)):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            extra(i, model, optimizer, x)
            prof.step()
    export_trace(prof, dest)


def _evaluate(i: int, model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    if i % EVAL_EVERY == 0:
        model.eval()
        with torch.no_grad():
            for _ in range(EVAL_FORWARDS):
                model(x)
        model.train()


def _save(i: int, model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    if i % SAVE_EVERY == 0:
        torch.save({"model": model.state_dict(), "opt": optimizer.state_dict()}, io.BytesIO())


def make_eval(dest: Path) -> None:
    _loop(dest, _evaluate)


def make_save(dest: Path) -> None:
    _loop(dest, _save)


if __name__ == "__main__":
    import sys

    make_eval(Path(sys.argv[1]) / EVAL_FILE)
    make_save(Path(sys.argv[1]) / SAVE_FILE)
