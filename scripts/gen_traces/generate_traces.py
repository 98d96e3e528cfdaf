"""A plain ``generate`` loop, as a Hugging Face-style script runs one: a tiny decoder-only
transformer with a KV cache, one prefill over the prompt and then one decode step per new token,
``prof.step()`` after each. Nothing in the trace names prefill or decode: only the shapes do
(the attention query is the whole prompt once, then one token per sequence)."""

from __future__ import annotations

from pathlib import Path

import torch
from capture import cpu_profile, export_trace, seed_everything, step_schedule
from torch import nn
from torch.nn import functional as F

GENERATE_FILE = "cpu_generate_kv_cache.pt.trace.json.gz"
VOCAB = 256
D_MODEL = 64
HEADS = 4
LAYERS = 2
BATCH = 2
PROMPT_TOKENS = 32
NEW_TOKENS = 6
GENERATE_SCHEDULE = {"wait": 0, "warmup": 0, "active": 1 + NEW_TOKENS}
GENERATE_PLANTED = (
    f"a greedy generate loop over a {LAYERS}-layer decoder (d_model {D_MODEL}, {HEADS} heads, vocabulary "
    f"{VOCAB}, float32) with a KV cache: ProfilerStep#0 is the prefill (batch {BATCH} x {PROMPT_TOKENS} prompt "
    f"tokens), ProfilerStep#1..#{NEW_TOKENS} are decode steps (one token per sequence, attention over the "
    "cache); no record_function names either phase."
)


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.out = nn.Linear(D_MODEL, D_MODEL)
        self.up = nn.Linear(D_MODEL, 4 * D_MODEL)
        self.down = nn.Linear(4 * D_MODEL, D_MODEL)
        self.norm1 = nn.LayerNorm(D_MODEL)
        self.norm2 = nn.LayerNorm(D_MODEL)

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor] | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        b, n, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(D_MODEL, dim=-1)
        q, k, v = (t.view(b, n, HEADS, D_MODEL // HEADS).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        # Causal over the prompt; a decode step's one query sees the whole cache.
        a = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        x = x + self.out(a.transpose(1, 2).reshape(b, n, D_MODEL))
        x = x + self.down(F.gelu(self.up(self.norm2(x))))
        return x, [k, v]


class _Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.layers = nn.ModuleList(_Layer() for _ in range(LAYERS))
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor, caches: list[list[torch.Tensor]] | None
                ) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
        x = self.embed(ids)
        new = []
        for i, layer in enumerate(self.layers):
            x, c = layer(x, None if caches is None else caches[i])
            new.append(c)
        return self.head(x[:, -1]), new


def make_generate(dest: Path) -> None:
    seed_everything()
    model = _Decoder().eval()
    prompt = torch.randint(0, VOCAB, (BATCH, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    # (Without a schedule, prof.step() records no ProfilerStep#N range in torch 2.13.)
    sched = step_schedule(**GENERATE_SCHEDULE)
    with torch.inference_mode(), cpu_profile(schedule=sched, record_shapes=True) as prof:
        logits, caches = model(prompt, None)
        prof.step()
        for _ in range(NEW_TOKENS):
            token = logits.argmax(dim=-1, keepdim=True)
            logits, caches = model(token, caches)
            prof.step()
    export_trace(prof, dest)
