"""Gradient accumulation under FSDP2 (``fully_shard``) over gloo, two ranks on loopback; rank 0's
trace. Each profiled step runs forward and backward on ACCUMULATE micro-batches, then the
optimizer. ``make_sync``: nothing tells FSDP to skip the reduction, so every backward
reduce-scatters the gradients; ``make_fixed``: ``set_requires_gradient_sync(False)`` before the
micro-batches before the last, so only the last one does. Both re-gather the parameters for
every backward (the all-gathers FSDP needs either way)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
import torch.distributed as dist
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from ddp_traces import COLLECTIVE_TIMEOUT, LOOPBACK, _spawn
from torch import nn
from torch.profiler import profile

SYNC_FILE = "cpu_fsdp2_accumulate_sync_rank0.pt.trace.json.gz"
FIXED_FILE = "cpu_fsdp2_accumulate_fixed_rank0.pt.trace.json.gz"
WORLD_SIZE = 2
ACCUMULATE = 4  # micro-batches per optimizer step
SCHEDULE = {"wait": 1, "warmup": 1, "active": 4}
OPTIONS = "(defaults: no shapes, no stacks)"
_MODEL = ("an MLP (Linear 512->1024, ReLU, Linear 1024->1024, ReLU, Linear 1024->10), each Linear and the root "
          "fully_shard'ed")
PLANTED_SYNC = (f"FSDP2 over gloo, {WORLD_SIZE} ranks on 127.0.0.1, {_MODEL}, SGD; {ACCUMULATE} micro-batches of 8 per "
                "profiled step, each backward reduce-scattering the gradients (no set_requires_gradient_sync(False))")
PLANTED_FIXED = (f"the same loop with model.set_requires_gradient_sync(k == {ACCUMULATE - 1}) before micro-batch k: "
                 "only the last backward reduce-scatters")


def _rank(rank: int, port: int, dest: str, *, fixed: bool) -> None:
    os.environ.update(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=COLLECTIVE_TIMEOUT,
                            init_method=f"tcp://{LOOPBACK}:{port}")
    try:
        prof = _train(rank, fixed)
        dist.barrier()  # both ranks done before rank 0 writes
    finally:
        dist.destroy_process_group()
    if rank == 0:
        export_trace(prof, Path(dest))


def _train(rank: int, fixed: bool) -> profile:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    seed_everything()
    torch.use_deterministic_algorithms(False)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(8, 512, generator=g), torch.randint(0, 10, (8,), generator=g)
    with cpu_profile(schedule=step_schedule(**SCHEDULE)) as prof:
        for _ in range(total_steps(**SCHEDULE)):
            for k in range(ACCUMULATE):
                if fixed:
                    model.set_requires_gradient_sync(k == ACCUMULATE - 1)
                nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    return prof


def make_sync(dest: Path) -> None:
    _spawn(functools.partial(_rank, fixed=False), dest)


def make_fixed(dest: Path) -> None:
    _spawn(functools.partial(_rank, fixed=True), dest)
