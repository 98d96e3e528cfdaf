"""Known training-loop mistakes, present and absent: the same small conv-BN network trained
with (``present``) a Conv2d whose bias feeds a BatchNorm2d, Adam on its single-tensor path
(``foreach=False``), ``zero_grad(set_to_none=False)`` and a per-class accuracy loop that reads
one scalar per iteration; and (``absent``) the same loop with each of them fixed. Each run
also writes what torch's own pattern matcher (TorchTidy, ``report_all_anti_patterns`` on the
live profiler) reports about it, beside the trace, for the tests to compare with."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import torch
from capture import REPO_ROOT, cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch import nn
from torch.autograd.profiler import record_function
from torch.profiler._pattern_matcher import report_all_anti_patterns
from workloads import NUM_CLASSES, synthetic_batch

SCHEDULE = {"wait": 1, "warmup": 1, "active": 4}
OPTIONS = "record_shapes=True, with_stack=True, with_modules=True"
PRESENT_FILE = "cpu_anti_present.pt.trace.json.gz"
ABSENT_FILE = "cpu_anti_absent.pt.trace.json.gz"
#: Classes the accuracy loop reads one by one (one ``.item()`` each per step).
READ_CLASSES = 4
PLANTED_PRESENT = (
    "four anti-patterns: Conv2d(3, 8, bias=True) directly followed by BatchNorm2d(8); "
    "torch.optim.Adam(foreach=False) (the single-tensor path: one op sequence per parameter "
    "under Optimizer.step#Adam.step); optimizer.zero_grad(set_to_none=False) (one aten::zero_ "
    f"per parameter under Optimizer.zero_grad#Adam.zero_grad); and a loop over {READ_CLASSES} classes "
    "calling .item() once per class per step in per_class_accuracy(). TorchTidy's report is "
    "written beside it (`cpu_anti_present.torchtidy.txt`)."
)
PLANTED_ABSENT = (
    "the cpu_anti_present loop with each anti-pattern fixed: Conv2d(bias=False), "
    "Adam(foreach=True), zero_grad(set_to_none=True), and the per-class counts kept as one "
    "tensor (no .item() in the loop). TorchTidy's report is written beside it "
    "(`cpu_anti_absent.torchtidy.txt`)."
)


class ConvBnNet(nn.Module):
    """Conv -> BatchNorm -> ReLU -> pool -> linear head."""

    def __init__(self, conv_bias: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, kernel_size=3, padding=1, bias=conv_bias)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(8 * 8 * 8, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.act(self.bn(self.conv(x)))), 1))


def per_class_accuracy(logits: torch.Tensor, y: torch.Tensor) -> list[float]:
    """The planted loop: one host read per class."""
    hits = (logits.argmax(1) == y)
    return [hits[y == c].float().sum().item() for c in range(READ_CLASSES)]


def per_class_counts(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The fix: the same counts kept as one tensor, read when the caller chooses."""
    hits = (logits.argmax(1) == y).float()
    return torch.zeros(NUM_CLASSES).index_add_(0, y, hits)[:READ_CLASSES]


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               present: bool) -> None:
    """One step, in a function entered while profiling: its frame names the lines below."""
    with record_function("forward"):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
    with record_function("backward"):
        loss.backward()
    with record_function("optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=not present)
    with record_function("metrics"):
        if present:
            per_class_accuracy(logits.detach(), y)
        else:
            per_class_counts(logits.detach(), y)


def _run(dest: Path, present: bool) -> None:
    seed_everything()
    model = ConvBnNet(conv_bias=present)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=not present)
    g = torch.Generator().manual_seed(0)
    with cpu_profile(schedule=step_schedule(**SCHEDULE), record_shapes=True, with_stack=True,
                     with_modules=True) as prof:
        for _ in range(total_steps(**SCHEDULE)):
            x, y = synthetic_batch(g)
            train_step(model, optimizer, x, y, present)
            prof.step()
    export_trace(prof, dest)
    _write_torchtidy(prof, dest.with_name(dest.name.replace(".pt.trace.json.gz", ".torchtidy.txt")))


def _write_torchtidy(prof: torch.profiler.profile, dest: Path) -> None:
    """TorchTidy's printed report, with this checkout's absolute path made repo-relative."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        report_all_anti_patterns(prof, should_benchmark=False, print_enable=True)
    dest.write_text(out.getvalue().replace(str(REPO_ROOT) + os.sep, ""), encoding="utf-8")


def make_present(dest: Path) -> None:
    _run(dest, present=True)


def make_absent(dest: Path) -> None:
    _run(dest, present=False)


if __name__ == "__main__":
    import sys

    make_present(Path(sys.argv[1]) / PRESENT_FILE)
    make_absent(Path(sys.argv[1]) / ABSENT_FILE)
