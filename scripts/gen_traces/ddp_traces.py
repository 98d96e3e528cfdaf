"""A two-rank DDP run over gloo on loopback, each rank profiled; rank 1 is a planted
straggler that sleeps before every backward."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch.nn.parallel import DistributedDataParallel
from workloads import make_model, synthetic_batch, train_step

WORLD_SIZE = 2
LOOPBACK = "127.0.0.1"
SCHEDULE = {"wait": 1, "warmup": 1, "active": 6}
STRAGGLER_RANK = 1
STRAGGLER_SLEEP_S = 0.02
COLLECTIVE_TIMEOUT = timedelta(seconds=60)
RUN_TIMEOUT_S = 180.0


def rank_file(dest_dir: Path, rank: int) -> Path:
    return dest_dir / f"ddp_gloo_rank{rank}.pt.trace.json.gz"


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


def make_ddp(dest_dir: Path) -> None:
    """Spawn both ranks and wait for them, never longer than ``RUN_TIMEOUT_S``."""
    # Gloo picks its interface from the hostname unless told; keep it on loopback.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    port = _free_loopback_port()
    context = mp.start_processes(
        _rank_main, args=(port, str(dest_dir)), nprocs=WORLD_SIZE, join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
            raise TimeoutError(f"DDP run did not finish within {RUN_TIMEOUT_S:.0f} s")
