"""Two-rank DDP runs over gloo on loopback, each rank profiled; rank 1 is a planted
straggler that sleeps before every backward.

``make_ddp``: the sleep is unannotated, one gradient bucket. ``make_ddp_broadcast``: the sleep
is ``record_function("straggler_delay")``, the gradients travel in several buckets, and every
step begins with a few tiny broadcasts from rank 0, which rank 0 reaches a little after rank 1
(it prepares the values first): rank 0 arrives last at more collectives, rank 1 causes nearly
all the waiting."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch.autograd.profiler import record_function
from torch.nn.parallel import DistributedDataParallel
from workloads import make_model, synthetic_batch, train_step

WORLD_SIZE = 2
LOOPBACK = "127.0.0.1"
SCHEDULE = {"wait": 1, "warmup": 1, "active": 6}
STRAGGLER_RANK = 1
STRAGGLER_SLEEP_S = 0.02
#: make_ddp_broadcast: tiny broadcasts per step, elements each, the gradient bucket cap (small
#: enough to split SmallCNN's 34k gradients into a few buckets), and Python frames on.
BROADCASTS_PER_STEP = 6
BROADCAST_ELEMENTS = 4
BUCKET_CAP_MB = 0.05
BROADCAST_SCHEDULE = {"wait": 1, "warmup": 1, "active": 4}
STRAGGLER_ANNOTATION = "straggler_delay"
COLLECTIVE_TIMEOUT = timedelta(seconds=60)
RUN_TIMEOUT_S = 180.0


def rank_file(dest_dir: Path, rank: int) -> Path:
    return dest_dir / f"ddp_gloo_rank{rank}.pt.trace.json.gz"


def broadcast_rank_file(dest_dir: Path, rank: int) -> Path:
    return dest_dir / f"ddp_gloo_bcast_rank{rank}.pt.trace.json.gz"


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, port: int, dest_dir: str) -> None:
    """One rank: join the group, train under the profiler, write this rank's trace."""
    os.environ.update(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=COLLECTIVE_TIMEOUT,
        init_method=f"tcp://{LOOPBACK}:{port}",
    )
    try:
        seed_everything()  # same seed on both ranks: same initial weights, like a real job
        model, _ = make_model()
        ddp_model = DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(rank)  # each rank its own data shard
        straggle = (lambda: time.sleep(STRAGGLER_SLEEP_S)) if rank == STRAGGLER_RANK else None
        with cpu_profile(schedule=step_schedule(**SCHEDULE), record_shapes=True) as prof:
            for _ in range(total_steps(**SCHEDULE)):
                x, y = synthetic_batch(g)
                train_step(ddp_model, optimizer, x, y, before_backward=straggle)
                prof.step()
        export_trace(prof, rank_file(Path(dest_dir), rank))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _sync_config(rank: int, step: int) -> None:
    """What a job does at the top of a step to keep ranks agreed (a seed, a learning rate,
    a flag): rank 0 computes each value, then broadcasts it. The computing makes rank 0 reach
    each broadcast a little after rank 1, so rank 0 is the rank that arrives last there."""
    for i in range(BROADCASTS_PER_STEP):
        if rank == 0:
            a = torch.randn(256, 256)
            value = torch.full((BROADCAST_ELEMENTS,), float(step * 10 + i)) + (a @ a).mean()
        else:
            value = torch.empty(BROADCAST_ELEMENTS)
        dist.broadcast(value, src=0)


def _delay() -> None:
    with record_function(STRAGGLER_ANNOTATION):
        time.sleep(STRAGGLER_SLEEP_S)


def _broadcast_rank_main(rank: int, port: int, dest_dir: str) -> None:
    """One rank of ``make_ddp_broadcast``."""
    os.environ.update(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=COLLECTIVE_TIMEOUT,
        init_method=f"tcp://{LOOPBACK}:{port}",
    )
    try:
        seed_everything()
        model, _ = make_model()
        ddp_model = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
        optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(rank)
        straggle = _delay if rank == STRAGGLER_RANK else None
        # Python frames, for what the straggler was doing; no shapes (the files stay small).
        with cpu_profile(schedule=step_schedule(**BROADCAST_SCHEDULE), with_stack=True) as prof:
            for step in range(total_steps(**BROADCAST_SCHEDULE)):
                _sync_config(rank, step)
                x, y = synthetic_batch(g)
                train_step(ddp_model, optimizer, x, y, before_backward=straggle)
                prof.step()
        export_trace(prof, broadcast_rank_file(Path(dest_dir), rank))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def make_ddp(dest_dir: Path) -> None:
    """Spawn both ranks of the one-bucket run and wait for them."""
    _spawn(_rank_main, dest_dir)


def make_ddp_broadcast(dest_dir: Path) -> None:
    """Spawn both ranks of the broadcasts-and-buckets run and wait for them."""
    _spawn(_broadcast_rank_main, dest_dir)


def _spawn(rank_main: Callable[[int, int, str], None], dest_dir: Path) -> None:
    """Spawn both ranks and wait for them, never longer than ``RUN_TIMEOUT_S``."""
    # Gloo picks its interface from the hostname unless told; keep it on loopback.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    port = _free_loopback_port()
    context = mp.start_processes(
        rank_main, args=(port, str(dest_dir)), nprocs=WORLD_SIZE, join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
            raise TimeoutError(f"DDP run did not finish within {RUN_TIMEOUT_S:.0f} s")
