"""Memory across and within steps, on CPU with profile_memory=True: two runs whose allocated
memory rises across steps for opposite reasons, and one whose peak is in the optimizer step.

``make_fsdp``: FSDP2 (``fully_shard``) over gloo, two ranks on loopback; rank 0's trace. Its
buffers are allocated lazily in the first steps and kept: allocated memory rises in steps and
then holds. Not a leak. ``make_growth``: a loop that keeps one activation row per step in a list
(``history.append``) and grows a buffer with ``torch.cat``: allocated rises by the same amount in
every step. A leak, in two functions of the loop. ``make_optimizer_peak``: a parameter-heavy
MLP with foreach Adam and tiny activations, whose peak is inside ``Optimizer.step``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from ddp_traces import COLLECTIVE_TIMEOUT, LOOPBACK, RUN_TIMEOUT_S, _free_loopback_port
from torch import nn
from torch.autograd.profiler import record_function
from workloads import SmallCNN, synthetic_batch, train_step

FSDP_FILE = "cpu_fsdp2_memory_rank0.pt.trace.json.gz"
GROWTH_FILE = "cpu_memory_growth.pt.trace.json.gz"
OPTIMIZER_PEAK_FILE = "cpu_optimizer_peak_memory.pt.trace.json.gz"
FSDP_WORLD_SIZE = 2
#: The first steps (traced) hold FSDP's lazy allocations; the later ones are flat.
FSDP_SCHEDULE = {"wait": 0, "warmup": 0, "active": 8}
ACCUMULATE = 2
GROWTH_SCHEDULE = {"wait": 1, "warmup": 1, "active": 6}
#: Kept per step: a 48 x 512 float32 block (96 KiB) appended to a list, and a 16 x 512 float32
#: block (32 KiB) concatenated onto a growing buffer: 128 KiB a step. The batch (2048 images of
#: 3x16x16) puts the peak near 60 MiB, so the growth is about 0.2% of the peak per step.
KEPT_ROWS, KEPT_COLS, CAT_ROWS, GROWTH_BATCH = 48, 512, 16, 2048
OPTIMIZER_SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}
#: Two 4096 x 4096 layers: 128 MiB of parameters, as much in gradients, twice that in Adam's state.
OPTIMIZER_WIDTH, OPTIMIZER_BATCH = 4096, 8
OPTIONS = "profile_memory=True, record_shapes=True, with_stack=True"
PLANTED_FSDP = (f"FSDP2 fully_shard on SmallCNN (each Linear and the root), gloo, {FSDP_WORLD_SIZE} ranks on "
                "127.0.0.1, Adam, gradient accumulation over 2 micro-batches (one profiler step each, "
                "set_requires_gradient_sync and set_reshard_after_backward off on the first); rank 0's trace "
                "from the first step on: the unsharded parameters and gradients are kept from the accumulation "
                "step into the optimizer step, and Adam's state appears at the first optimizer step, so "
                "allocated at a step's end alternates (about 310 KiB, then 580 KiB) and the last step ends "
                "above the first. No leak: nothing rises in every step.")
PLANTED_GROWTH = ("a steady leak: every step keep_history() keeps a 48x512 float32 block (96 KiB) in a Python "
                  "list (`history.append(hidden.detach().clone())`) and grow_buffer() torch.cat's a 16x512 block "
                  "(32 KiB) onto a buffer it replaces (`torch.cat([buffer, rows])`): allocated grows by 128 KiB "
                  "in every step, about 0.2% of the ~60 MiB peak (SmallCNN, batch 2048 of 3x16x16, SGD).")
PLANTED_OPTIMIZER = ("the peak is in the optimizer step: two Linear(4096, 4096) layers (128 MiB of parameters), "
                     "foreach Adam (its state, 256 MiB, made in the untraced first step), batch 8: parameters, "
                     "gradients, Adam's state and foreach Adam's temporaries are live at once inside "
                     "Optimizer.step, above anything forward or backward holds.")


def _fsdp_rank(rank: int, port: int, dest: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=FSDP_WORLD_SIZE, timeout=COLLECTIVE_TIMEOUT,
                            init_method=f"tcp://{LOOPBACK}:{port}")
    try:
        seed_everything()
        model = SmallCNN()
        mesh = init_device_mesh("cpu", (FSDP_WORLD_SIZE,))
        for layer in model.modules():
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(rank)
        with cpu_profile(schedule=step_schedule(**FSDP_SCHEDULE), profile_memory=True) as prof:
            for step in range(total_steps(**FSDP_SCHEDULE)):
                # Gradient accumulation over ACCUMULATE micro-batches, one profiler step each: FSDP
                # keeps the unsharded parameters and gradients between them (no reshard, no sync),
                # and Adam's state appears at the first optimizer step.
                last = (step + 1) % ACCUMULATE == 0
                model.set_requires_gradient_sync(last)
                model.set_reshard_after_backward(last)
                x, y = synthetic_batch(g)
                with record_function("forward"):
                    loss = nn.functional.cross_entropy(model(x), y)
                with record_function("backward"):
                    loss.backward()
                if last:
                    with record_function("optimizer"):
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                prof.step()
        if rank == 0:
            export_trace(prof, Path(dest))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def make_fsdp(dest: Path) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    ctx = mp.get_context("spawn")
    port = _free_loopback_port()
    procs = [ctx.Process(target=_fsdp_rank, args=(rank, port, str(dest))) for rank in range(FSDP_WORLD_SIZE)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(RUN_TIMEOUT_S)
        if p.exitcode != 0:
            raise RuntimeError(f"FSDP rank exited with {p.exitcode}")


def keep_history(history: list[torch.Tensor], hidden: torch.Tensor) -> None:
    history.append(hidden.detach().clone())


def grow_buffer(buffer: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return torch.cat([buffer, rows])


def make_growth(dest: Path) -> None:
    seed_everything()
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    history: list[torch.Tensor] = []
    buffer = torch.zeros(0, KEPT_COLS)
    with cpu_profile(schedule=step_schedule(**GROWTH_SCHEDULE), profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
        for _ in range(total_steps(**GROWTH_SCHEDULE)):
            x = torch.randn(GROWTH_BATCH, 3, 16, 16, generator=g)
            y = torch.randint(0, 10, (GROWTH_BATCH,), generator=g)
            train_step(model, optimizer, x, y)
            hidden = torch.randn(KEPT_ROWS, KEPT_COLS, generator=g)
            keep_history(history, hidden)
            buffer = grow_buffer(buffer, hidden[:CAT_ROWS])
            prof.step()
    export_trace(prof, dest)


def make_optimizer_peak(dest: Path) -> None:
    seed_everything()
    model = nn.Sequential(nn.Linear(OPTIMIZER_WIDTH, OPTIMIZER_WIDTH), nn.ReLU(),
                          nn.Linear(OPTIMIZER_WIDTH, OPTIMIZER_WIDTH), nn.Linear(OPTIMIZER_WIDTH, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)
    g = torch.Generator().manual_seed(0)
    with cpu_profile(schedule=step_schedule(**OPTIMIZER_SCHEDULE), profile_memory=True, record_shapes=True) as prof:
        for _ in range(total_steps(**OPTIMIZER_SCHEDULE)):
            x = torch.randn(OPTIMIZER_BATCH, OPTIMIZER_WIDTH, generator=g)
            y = torch.randint(0, 10, (OPTIMIZER_BATCH,), generator=g)
            train_step(model, optimizer, x, y)
            prof.step()
    export_trace(prof, dest)
