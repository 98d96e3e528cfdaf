"""Memory compared: across the ranks of one job, and between two runs of one program, on CPU
with profile_memory=True.

``make_ranks``: DDP over gloo, two ranks on loopback, each rank's trace. Rank 1 alone keeps a
planted 2 MiB buffer (``hold_rank_buffer``), made in the first traced step and held to the end:
its peak is 2 MiB above rank 0's, from one allocation site. ``make_vs``: the same loop three
times, each in a fresh process: run A, A again (the rerun: what noise looks like), and B, which also keeps
a 4 MiB lookup table (``build_lookup_table``) from its first traced step on.

    python scripts/gen_traces/make_all.py --out tests/data/generated --only memory_ranks memory_vs
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from ddp_traces import COLLECTIVE_TIMEOUT, LOOPBACK, RUN_TIMEOUT_S, WORLD_SIZE, _spawn
from torch.nn.parallel import DistributedDataParallel
from workloads import SmallCNN, train_step

RANK_FILES = tuple(f"cpu_memory_ranks_rank{r}.pt.trace.json.gz" for r in range(WORLD_SIZE))
VS_A, VS_A_RERUN, VS_B = ("cpu_memory_vs_a.pt.trace.json.gz", "cpu_memory_vs_a_rerun.pt.trace.json.gz",
                          "cpu_memory_vs_b.pt.trace.json.gz")
SCHEDULE = {"wait": 1, "warmup": 1, "active": 4}
#: Batch 256 of 3x16x16: activations of a few MiB, so the planted buffers are a visible share.
BATCH = 256
#: float32 elements: 2 MiB on rank 1 only, 4 MiB in run B only.
RANK_BUFFER_ELEMENTS, LOOKUP_ELEMENTS = 512 * 1024, 1024 * 1024
PLANTED_RANK = 1
FIRST_TRACED = SCHEDULE["wait"] + SCHEDULE["warmup"]
RANKS_OPTIONS = "profile_memory=True, record_shapes=True (DDP, gloo, 2 ranks on 127.0.0.1, one trace per rank)"
VS_OPTIONS = "profile_memory=True, record_shapes=True, with_stack=True"
PLANTED_RANKS = ("a rank-dependent buffer: SmallCNN under DDP over gloo, batch 256, SGD; rank 1 alone keeps a "
                 "2 MiB float32 buffer (hold_rank_buffer(), torch.zeros(524288)) from the first traced step to the "
                 "end, so its peak allocated is 2 MiB above rank 0's and one site (aten::zeros, 2 MiB) differs.")
PLANTED_VS = ("run B holds an extra buffer: three runs of one loop (SmallCNN, batch 256, SGD), each in a fresh "
              f"process: {VS_A} (A), {VS_A_RERUN} (A again: the noise between two runs of the same program) and {VS_B} "
              "(B), which also keeps a 4 MiB float32 lookup table (build_lookup_table(), torch.zeros(1048576)) "
              "from its first traced step on: B's peak allocated is 4 MiB above A's, from that one line.")


def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(BATCH, 3, 16, 16, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def hold_rank_buffer() -> torch.Tensor:
    return torch.zeros(RANK_BUFFER_ELEMENTS)


def build_lookup_table() -> torch.Tensor:
    return torch.zeros(LOOKUP_ELEMENTS)


def _rank_main(rank: int, port: int, dest_dir: str) -> None:
    os.environ.update(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=COLLECTIVE_TIMEOUT,
                            init_method=f"tcp://{LOOPBACK}:{port}")
    try:
        seed_everything()
        model = DistributedDataParallel(SmallCNN())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(rank)
        held: list[torch.Tensor] = []
        with cpu_profile(schedule=step_schedule(**SCHEDULE), profile_memory=True, record_shapes=True) as prof:
            for step in range(total_steps(**SCHEDULE)):
                if step == FIRST_TRACED and rank == PLANTED_RANK:
                    held.append(hold_rank_buffer())
                x, y = batch(g)
                train_step(model, optimizer, x, y)
                prof.step()
        export_trace(prof, Path(dest_dir) / RANK_FILES[rank])
        dist.barrier()
    finally:
        dist.destroy_process_group()


def make_ranks(dest_dir: Path) -> None:
    _spawn(_rank_main, dest_dir)


def _run(dest: Path, *, lookup: bool) -> None:
    seed_everything()
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    held: list[torch.Tensor] = []
    with cpu_profile(schedule=step_schedule(**SCHEDULE), profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
        for step in range(total_steps(**SCHEDULE)):
            if lookup and step == FIRST_TRACED:
                held.append(build_lookup_table())
            x, y = batch(g)
            train_step(model, optimizer, x, y)
            prof.step()
    export_trace(prof, dest)


def make_vs(dest_dir: Path) -> None:
    """Each run in a fresh process: what one run leaves in the process would count in the next's
    Total Allocated (CPU's allocator totals are per process)."""
    ctx = mp.get_context("spawn")
    for name, lookup in ((VS_A, False), (VS_A_RERUN, False), (VS_B, True)):
        p = ctx.Process(target=_run, args=(dest_dir / name,), kwargs={"lookup": lookup})
        p.start()
        p.join(RUN_TIMEOUT_S)
        if p.exitcode != 0:
            raise RuntimeError(f"run {name} exited with {p.exitcode}")
