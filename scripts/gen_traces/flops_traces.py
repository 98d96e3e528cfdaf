"""A training loop whose trace carries PyTorch's own FLOP counts beside the recorded shapes:
linear, matmul, conv2d and scaled_dot_product_attention, forward and backward, in
``record_function`` regions, for the MFU cross-check.

torch 2.13 computes a FLOP count per op under ``with_flops=True`` (``computeFlops`` in
torch/csrc/profiler/util.cpp: conv2d, mm, addmm, bmm, baddbmm, mul, add) and keeps it on the
profiler's events, but its Chrome-trace export leaves it out. The exported file gets that count
written back into each op's ``args`` as ``"flops"`` (the key the Kineto exports of earlier
releases carry and the trace readers use), matched by the op's ``External id`` (the event's
correlation id). ``torch.utils.flop_counter.FlopCounterMode`` over one identical step, run
outside the profiler, gives a second count per aten op (convolution backward included), and
torch's attention formulas the count of one attention call; both are stored with
``prof.add_metadata_json`` under ``flop_counter_step``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch import nn
from torch.autograd.profiler import record_function
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

FILE = "cpu_flops_attention.pt.trace.json.gz"
SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}
BATCH = 4
IMAGE = 16
DIM = 32
HEADS = 2
CLASSES = 10
#: The profiler's own count per aten op of one step, stored in the trace's metadata.
FLOP_COUNTER_KEY = "flop_counter_step"
PLANTED = (
    "nothing slow: a conv stem (Conv2d 3->32, k3, p1 on 4x3x16x16, avg-pooled to 16 tokens), "
    "one attention block (Linear 32->96 for q/k/v, scaled_dot_product_attention with 2 heads of "
    "16, Linear 32->32) and an MLP (Linear 32->64, GELU, Linear 64->32), a torch.matmul head; "
    "SGD. record_function regions conv_stem, attention, mlp, head. Every op's `flops` arg is "
    "the profiler's own with_flops count written back (see flops_traces.py), and the metadata "
    f"key `{FLOP_COUNTER_KEY}` holds FlopCounterMode's per-op count of one step (`ops`) and torch's "
    "sdpa_flop_count / sdpa_backward_flop_count of one attention call (`sdpa_call`)."
)


class AttentionNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, DIM, 3, padding=1)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)
        self.head = nn.Parameter(torch.randn(DIM, CLASSES) * 0.1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        with record_function("conv_stem"):
            x = torch.nn.functional.avg_pool2d(self.conv(images), 4)  # [B, DIM, 4, 4]
            tokens = x.flatten(2).transpose(1, 2)  # [B, 16, DIM]
        with record_function("attention"):
            b, n, _ = tokens.shape
            q, k, v = self.qkv(tokens).view(b, n, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            tokens = tokens + self.out(a.transpose(1, 2).reshape(b, n, DIM))
        with record_function("mlp"):
            tokens = tokens + self.down(torch.nn.functional.gelu(self.up(tokens)))
        with record_function("head"):
            return torch.matmul(tokens.mean(dim=1), self.head)


def _step(model: AttentionNet, optimizer: torch.optim.Optimizer, images: torch.Tensor,
          labels: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()


def _flop_counter_step(model: AttentionNet, images: torch.Tensor, labels: torch.Tensor) -> dict[str, int]:
    """FlopCounterMode's count per aten op over one forward and backward (no optimizer: SGD's
    elementwise updates are not counted by it)."""
    counter = FlopCounterMode(display=False)
    with counter:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return {str(op): int(n) for op, n in sorted(counter.get_flop_counts()["Global"].items(), key=str)}


def _sdpa_call_flops() -> dict[str, int]:
    """torch's own attention formulas for one call of the block's attention shape: FlopCounterMode
    counts the CUDA attention ops only, not ``_scaled_dot_product_flash_attention_for_cpu``."""
    qkv = (BATCH, HEADS, (IMAGE // 4) ** 2, DIM // HEADS)
    return {"forward": int(sdpa_flop_count(qkv, qkv, qkv)),
            "backward": int(sdpa_backward_flop_count(qkv, qkv, qkv, qkv))}


def _write_back_flops(dest: Path, flops_by_external_id: dict[int, int]) -> None:
    """Put the profiler's per-op FLOP count into each op's args (see the module docstring)."""
    with gzip.open(dest, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    for e in doc["traceEvents"]:
        args = e.get("args")
        if e.get("cat") == "cpu_op" and isinstance(args, dict):
            flops = flops_by_external_id.get(args.get("External id", -1))
            if flops:
                args["flops"] = flops
    text = json.dumps(doc)
    with open(dest, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                                compresslevel=9) as gz:
        gz.write(text.encode("utf-8"))


def make_flops_attention(dest: Path) -> None:
    seed_everything()
    model = AttentionNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g)
    labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
    counted = {"ops": _flop_counter_step(model, images, labels), "sdpa_call": _sdpa_call_flops()}
    with cpu_profile(schedule=step_schedule(**SCHEDULE), record_shapes=True, with_flops=True) as prof:
        for i in range(total_steps(**SCHEDULE)):
            _step(model, optimizer, images, labels)
            if i == total_steps(**SCHEDULE) - 1:  # metadata is kept only while the profiler records
                prof.add_metadata_json(FLOP_COUNTER_KEY, json.dumps(counted, sort_keys=True))
            prof.step()
    export_trace(prof, dest)
    flops = {e.correlation_id(): int(e.flops()) for e in prof.profiler.kineto_results.events() if e.flops()}
    _write_back_flops(dest, flops)
