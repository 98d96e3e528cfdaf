"""Extra copies on the step's path, present and absent: a small two-layer network trained on
CPU whose forward (``present``) copies its input transposed into a fresh buffer every step
(``x.transpose(1, 2).contiguous()`` feeding a matmul) and casts its hidden activations to half
and straight back (``h.half().float()``); and (``absent``) the same step with the matmul on the
transposed view and no cast, plus a ``.contiguous()`` on a tensor that already is (no copy).
Each run also writes TorchTidy's report (``report_all_anti_patterns`` on the live profiler)
beside the trace, for the tests to compare with."""

from __future__ import annotations

from pathlib import Path

import torch
from anti_pattern_traces import _write_torchtidy
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch import nn

SCHEDULE = {"wait": 1, "warmup": 1, "active": 4}
OPTIONS = "record_shapes=True, with_stack=True"
PRESENT_FILE = "cpu_copies_present.pt.trace.json.gz"
ABSENT_FILE = "cpu_copies_absent.pt.trace.json.gz"
#: The input batch: (batch, features, sequence); the network reads it as (batch, sequence, features).
BATCH, FEATURES, SEQUENCE, HIDDEN = 16, 64, 256, 128
PLANTED_PRESENT = (
    f"two extra copies per step in forward(): x.transpose(1, 2).contiguous() of a float "
    f"[{BATCH}, {FEATURES}, {SEQUENCE}] input feeding a matmul, and h.half().float() on the "
    f"[{BATCH}, {SEQUENCE}, {HIDDEN}] hidden activations (a float -> half -> float round trip; "
    "backward casts its gradient back and forth too). TorchTidy's report is written beside it "
    "(`cpu_copies_present.torchtidy.txt`)."
)
PLANTED_ABSENT = (
    "the cpu_copies_present step without the copies: the matmul reads the transposed view, no cast, "
    "and a .contiguous() on an already contiguous tensor (returns it: no op, no copy). TorchTidy's report "
    "is written beside it (`cpu_copies_absent.torchtidy.txt`)."
)


class TwoLayer(nn.Module):
    def __init__(self, present: bool) -> None:
        super().__init__()
        self.present = present
        self.w1 = nn.Parameter(torch.randn(FEATURES, HIDDEN) / FEATURES ** 0.5)
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.present:
            xt = x.transpose(1, 2).contiguous()  # the planted copy: matmul reads strided views itself
            h = torch.relu(torch.matmul(xt, self.w1))
            h = h.half().float()  # the planted round trip
        else:
            h = torch.relu(torch.matmul(x.transpose(1, 2), self.w1)).contiguous()  # already contiguous
        return self.head(h).mean()


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    loss = model(x)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def _run(dest: Path, present: bool) -> None:
    seed_everything()
    model = TwoLayer(present)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=True)
    g = torch.Generator().manual_seed(0)
    with cpu_profile(schedule=step_schedule(**SCHEDULE), record_shapes=True, with_stack=True) as prof:
        for _ in range(total_steps(**SCHEDULE)):
            x = torch.randn(BATCH, FEATURES, SEQUENCE, generator=g)
            train_step(model, optimizer, x)
            prof.step()
    export_trace(prof, dest)
    _write_torchtidy(prof, dest.with_name(dest.name.replace(".pt.trace.json.gz", ".torchtidy.txt")))


def make_present(dest: Path) -> None:
    _run(dest, present=True)


def make_absent(dest: Path) -> None:
    _run(dest, present=False)

