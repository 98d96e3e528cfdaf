"""Tensors grown by concatenation, present and absent, on loops the rule was not written for.

- ``kv_cache``: greedy decoding with a small two-layer attention decoder whose per-layer key and
  value caches grow by ``torch.cat`` along the sequence every token (how a dynamic KV cache
  works), with ``record_shapes=True``: each step generates a sequence.
- ``static_cache``: the same decoder writing each token's keys and values in place into caches
  allocated once per sequence; it still concatenates fixed-size tensors every token (the query
  with a position feature), which grow nothing.
- ``collect``: an evaluation loop that gathers each mini-batch's embeddings into one tensor by
  ``torch.cat`` after every batch, profiled with the profiler's defaults (no shapes, no stacks).
"""

from __future__ import annotations

from pathlib import Path

import torch
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch import nn

SCHEDULE = {"wait": 1, "warmup": 1, "active": 4}
OPTIONS_SHAPES = "record_shapes=True"
OPTIONS_DEFAULT = "(defaults: no shapes, no stacks)"
KV_FILE = "cpu_growth_kv_cache.pt.trace.json.gz"
STATIC_FILE = "cpu_growth_static_cache.pt.trace.json.gz"
COLLECT_FILE = "cpu_growth_collect.pt.trace.json.gz"
#: Decoder: batch, width, heads, layers; tokens generated per step.
BATCH, WIDTH, HEADS, LAYERS, TOKENS = 32, 256, 4, 1, 40
#: Evaluation loop: mini-batches per step, batch, input and embedding width.
EVAL_BATCHES, EVAL_BATCH, EVAL_IN, EVAL_OUT = 48, 64, 128, 1024
PLANTED_KV = (
    f"greedy decoding of {TOKENS} tokens per step (batch {BATCH}, width {WIDTH}, {HEADS} heads, {LAYERS} layer, "
    "no_grad): each layer's key and value caches grow by torch.cat([cache, new], dim=2) every token, "
    f"{2 * LAYERS} growing tensors of [{BATCH}, {HEADS}, t, {WIDTH // HEADS}] float32"
)
PLANTED_STATIC = (
    f"the cpu_growth_kv_cache decoder with caches of [{BATCH}, {HEADS}, {TOKENS}, {WIDTH // HEADS}] allocated once "
    "per sequence and written in place (cache[:, :, t] = new); each token still concatenates its query with a "
    f"position feature (torch.cat of [{BATCH}, {WIDTH}] and [{BATCH}, 1]: fixed sizes, nothing grows)"
)
PLANTED_COLLECT = (
    f"an evaluation loop over {EVAL_BATCHES} mini-batches per step (batch {EVAL_BATCH}, Linear({EVAL_IN}, "
    f"{EVAL_OUT}) + ReLU, no_grad) gathering the embeddings by embeddings = torch.cat([embeddings, out]) after "
    f"each batch: one tensor grown to [{EVAL_BATCHES * EVAL_BATCH}, {EVAL_OUT}] float32; profiler defaults"
)


class Decoder(nn.Module):
    """Single-token attention layers over cached keys and values, then a projection to the next input."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.ModuleList(nn.Linear(WIDTH + 1, 3 * WIDTH) for _ in range(LAYERS))
        self.out = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))

    def layer(self, i: int, x: torch.Tensor, t: int, caches: list[torch.Tensor], static: bool) -> torch.Tensor:
        position = torch.full((x.shape[0], 1), float(t))
        q, k, v = self.qkv[i](torch.cat([x, position], dim=1)).view(BATCH, 3, HEADS, 1, WIDTH // HEADS).unbind(1)
        if static:
            caches[2 * i][:, :, t] = k[:, :, 0]
            caches[2 * i + 1][:, :, t] = v[:, :, 0]
            keys, values = caches[2 * i][:, :, : t + 1], caches[2 * i + 1][:, :, : t + 1]
        else:
            caches[2 * i] = keys = torch.cat([caches[2 * i], k], dim=2)
            caches[2 * i + 1] = values = torch.cat([caches[2 * i + 1], v], dim=2)
        attended = torch.softmax(q @ keys.transpose(2, 3) / (WIDTH // HEADS) ** 0.5, dim=-1) @ values
        return x + self.out[i](attended.reshape(BATCH, WIDTH))

    @torch.no_grad()
    def generate(self, x: torch.Tensor, static: bool) -> torch.Tensor:
        shape = (BATCH, HEADS, TOKENS if static else 0, WIDTH // HEADS)
        caches = [torch.zeros(shape) for _ in range(2 * LAYERS)]
        for t in range(TOKENS):
            for i in range(LAYERS):
                x = self.layer(i, x, t, caches, static)
        return x


def _decode(dest: Path, static: bool) -> None:
    seed_everything()
    model = Decoder()
    start = torch.randn(BATCH, WIDTH)
    with cpu_profile(schedule=step_schedule(**SCHEDULE), record_shapes=True) as prof:
        for _ in range(total_steps(**SCHEDULE)):
            model.generate(start, static)
            prof.step()
    export_trace(prof, dest)


def make_kv_cache(dest: Path) -> None:
    _decode(dest, static=False)


def make_static_cache(dest: Path) -> None:
    _decode(dest, static=True)


def make_collect(dest: Path) -> None:
    seed_everything()
    model = nn.Sequential(nn.Linear(EVAL_IN, EVAL_OUT), nn.ReLU())
    batches = [torch.randn(EVAL_BATCH, EVAL_IN) for _ in range(EVAL_BATCHES)]
    with cpu_profile(schedule=step_schedule(**SCHEDULE)) as prof, torch.no_grad():
        for _ in range(total_steps(**SCHEDULE)):
            embeddings = torch.empty(0, EVAL_OUT)
            for x in batches:
                embeddings = torch.cat([embeddings, model(x)])
            prof.step()
    export_trace(prof, dest)


if __name__ == "__main__":
    import sys

    out = Path(sys.argv[1])
    make_kv_cache(out / KV_FILE)
    make_static_cache(out / STATIC_FILE)
    make_collect(out / COLLECT_FILE)
