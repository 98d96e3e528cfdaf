"""The small models, synthetic datasets and training step that every trace profiles."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn
from torch.autograd.profiler import record_function
from torch.utils.data import DataLoader, Dataset

IMAGE_SHAPE = (3, 16, 16)
NUM_CLASSES = 10
BATCH_SIZE = 16

Batch = tuple[torch.Tensor, torch.Tensor]


class SmallCNN(nn.Module):
    """Conv -> pool -> MLP head: enough distinct ops (conv, pool, addmm, relu, loss) to be
    a realistic op mix, small enough that a step takes about a millisecond on one core."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(8 * 8 * 8, 64),
            nn.ReLU(),
            nn.Linear(64, NUM_CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def make_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, optimizer


def synthetic_batch(generator: torch.Generator) -> Batch:
    x = torch.randn(BATCH_SIZE, *IMAGE_SHAPE, generator=generator)
    y = torch.randint(0, NUM_CLASSES, (BATCH_SIZE,), generator=generator)
    return x, y


class SyntheticImages(Dataset[Batch]):
    """Fixed random images; ``sleep_per_item_s`` stands in for slow decoding or I/O."""

    def __init__(self, length: int, sleep_per_item_s: float = 0.0, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(length, *IMAGE_SHAPE, generator=g)
        self.labels = torch.randint(0, NUM_CLASSES, (length,), generator=g)
        self.sleep_per_item_s = sleep_per_item_s

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Batch:
        if self.sleep_per_item_s:
            time.sleep(self.sleep_per_item_s)
        return self.images[index], self.labels[index]


def make_loader(steps: int, sleep_per_item_s: float, num_workers: int = 0) -> DataLoader[Batch]:
    """A loader yielding exactly ``steps`` batches, in a fixed order: single-process by
    default, else fed by ``num_workers`` worker processes."""
    dataset = SyntheticImages(steps * BATCH_SIZE, sleep_per_item_s)
    return DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=False, num_workers=num_workers)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    before_backward: Callable[[], None] | None = None,
) -> torch.Tensor:
    """One step in three annotated blocks: ``forward``, ``backward``, ``optimizer``.

    ``before_backward`` runs between forward and backward (DDP uses it to plant a straggler).
    Returns the loss, still a tensor: reading it is the caller's choice (see item_sync).
    """
    with record_function("forward"):
        loss = nn.functional.cross_entropy(model(x), y)
    if before_backward is not None:
        before_backward()
    with record_function("backward"):
        loss.backward()
    with record_function("optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.detach()
