"""A Python loop over the batch inside a block, beside a block whose ops repeat for another
reason: one training step augments its batch sample by sample under
``record_function("augment")`` (indexing ``batch[i]``: a random crop offset, a flip and a
brightness jitter per image, then ``torch.stack``), then runs an encoder of identical layers under
``record_function("encoder")`` (the same Linear and GELU once per layer, each on the whole batch),
a head and SGD. The first is a loop over samples; the second is not."""

from __future__ import annotations

from pathlib import Path

import torch
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch import nn
from torch.autograd.profiler import record_function

SCHEDULE = {"wait": 1, "warmup": 1, "active": 5}
OPTIONS = "(defaults: no shapes, no stacks)"
FILE = "cpu_loop_augment.pt.trace.json.gz"
BATCH, SIZE, CROP, LAYERS, WIDTH = 32, 40, 32, 12, 256
PLANTED = (
    f"per-sample augmentation under record_function('augment'): for i in range({BATCH}): batch[i] cropped at a "
    f"random offset to {CROP}x{CROP}, flipped on a coin, brightness-jittered, then torch.stack; then "
    f"record_function('encoder'): {LAYERS} identical Linear({WIDTH}, {WIDTH}) + GELU layers on the whole batch (the "
    "same ops once per layer: no loop over samples); a head, cross-entropy and SGD"
)


def augment(batch: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    out = []
    for i in range(batch.shape[0]):
        top, left = (int(v) for v in torch.randint(0, SIZE - CROP + 1, (2,), generator=g))
        image = batch[i][:, top:top + CROP, left:left + CROP]
        if torch.rand((), generator=g) < 0.5:
            image = image.flip(-1)
        out.append(image * (1 + 0.1 * torch.randn((), generator=g)))
    return torch.stack(out)


def make(dest: Path) -> None:
    seed_everything()
    stem = nn.Linear(3 * CROP * CROP, WIDTH)
    encoder = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(LAYERS))
    head = nn.Linear(WIDTH, 10)
    params = [*stem.parameters(), *encoder.parameters(), *head.parameters()]
    optimizer = torch.optim.SGD(params, lr=1e-3, foreach=True)
    g = torch.Generator().manual_seed(0)
    with cpu_profile(schedule=step_schedule(**SCHEDULE)) as prof:
        for _ in range(total_steps(**SCHEDULE)):
            images, labels = torch.randn(BATCH, 3, SIZE, SIZE, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
            with record_function("augment"):
                x = augment(images, g)
            h = stem(x.flatten(1))
            with record_function("encoder"):
                for layer in encoder:
                    h = layer(h)
            loss = nn.functional.cross_entropy(head(h), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    export_trace(prof, dest)


if __name__ == "__main__":
    import sys

    make(Path(sys.argv[1]) / FILE)
