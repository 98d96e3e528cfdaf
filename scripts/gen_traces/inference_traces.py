"""An inference loop, with and without autograd recording: a 6-block MLP (Linear(512, 512) +
GELU, then Linear(512, 10)) in eval mode scores a batch of 256 and takes the argmax, every step.
``make_recorded``: as written, grad mode on, so every forward op records autograd for a backward
that never runs; ``make_inference_mode``: the same loop under ``torch.inference_mode()``."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch import nn

SCHEDULE = {"wait": 1, "warmup": 2, "active": 8}
OPTIONS = "record_shapes=True"
RECORDED_FILE = "cpu_inference_recorded.pt.trace.json.gz"
INFERENCE_MODE_FILE = "cpu_inference_mode.pt.trace.json.gz"
BLOCKS, WIDTH, BATCH = 6, 512, 256
PLANTED_RECORDED = (f"inference with autograd on: a {BLOCKS}-block MLP (Linear({WIDTH}, {WIDTH}) + GELU, then "
                    f"Linear({WIDTH}, 10)) in eval mode scores a batch of {BATCH} and takes the argmax each step, no "
                    "torch.no_grad()/inference_mode(): every forward op records autograd; no backward runs")
PLANTED_INFERENCE_MODE = "the same loop under torch.inference_mode(): nothing recorded"


def _loop(dest: Path, inference_mode: bool) -> None:
    seed_everything()
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(BLOCKS)]
    model = nn.Sequential(*blocks, nn.Linear(WIDTH, 10)).eval()
    x = torch.randn(BATCH, WIDTH)
    with cpu_profile(schedule=step_schedule(**SCHEDULE), record_shapes=True) as prof:
        for _ in range(total_steps(**SCHEDULE)):
            with torch.inference_mode() if inference_mode else contextlib.nullcontext():
                model(x).argmax(1)
            prof.step()
    export_trace(prof, dest)


def make_recorded(dest: Path) -> None:
    _loop(dest, inference_mode=False)


def make_inference_mode(dest: Path) -> None:
    _loop(dest, inference_mode=True)
