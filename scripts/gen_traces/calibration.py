"""Before/after pairs for calibrating the step-time predictions (``what_if``): one small CPU
loop per fix type, captured once as written (*before*) and once with that one fix applied
(*after*), several repeats, alternating before and after so that load drifts on a shared
machine hit both sides alike.

    python scripts/gen_traces/calibration.py --out tests/data/calibration [--repeats 3] [--only KEY ...]
    python scripts/gen_traces/calibration.py --out tests/data/holdout --holdout

The captures of one fix run in one interpreter, before and after in turn, each from a freshly
built model on one intra-op thread, seeded: a process's own speed (where the OS placed it, what
shares its core) then weighs on both sides alike, which separate processes did not give (on a
quiet 16-core machine, the same program's step differed by up to 1.6x from one process to the
next). The two fixes whose state would carry over from one capture to the next (the Dynamo cache
of the recompile pair, the worker processes of the DataLoader pair) run each capture in a fresh
interpreter instead, and the distributed fix spawns its two gloo ranks afresh for each capture
(both profiled alike, rank 0's trace kept). Each capture waits until the machine's other processes are quiet
(``wait_for_quiet``: under QUIET_CORES for two seconds), and captures.log gets the load average
before and after each interpreter and, per capture, the cores the other processes used before
and during it; MANIFEST.md (written by hand) says what each pair plants and where it was
captured. The fix a pair applies is declared here, from the code below, never measured from the
trace.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import queue
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from first_touch import MIB, first_touch_ratio
from torch import nn
from torch.autograd.profiler import record_function
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset

#: Steps a capture holds: a few warm-up steps outside the trace (allocator, worker start-up,
#: first compile), then enough active steps for a steady median.
SCHEDULE = {"wait": 1, "warmup": 3, "active": 10}
#: The recompile pair: each recompiling step is a compile's worth of Dynamo and AOT autograd
#: events, so fewer active steps keep the file small.
COMPILE_SCHEDULE = {"wait": 1, "warmup": 2, "active": 6}
#: The foreach and .item() pairs: a step is thousands of profiler events (each parameter's
#: optimizer ops, each read's ops), so fewer active steps keep the file under 0.5 MB.
SHORT_SCHEDULE = {"wait": 1, "warmup": 3, "active": 6}
VARIANTS = ("before", "after")

Step = Callable[[], None]


def _mlp(depth: int, width: int, hidden: int | None = None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, hidden or width), nn.ReLU()]
        if hidden:
            layers.append(nn.Linear(hidden, width))
    return nn.Sequential(*layers)


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, set_to_none: bool = True) -> None:
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=set_to_none)


# --- DataLoader workers ---------------------------------------------------------------------------

LOADER_BATCH = 16
LOADER_READ_S = 0.0006  # per sample: a slow read (file, network), no CPU used


class SlowImages(Dataset[torch.Tensor]):
    """Images read slowly, then normalised and flipped (the transform)."""

    def __init__(self, length: int) -> None:
        self.images = torch.randn(length, 3, 32, 32, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(LOADER_READ_S)
        image = self.images[index]
        return ((image - image.mean()) / (image.std() + 1e-5)).flip(-1)


def dataloader_workers(after: bool, steps: int) -> Step:
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, padding=1),
                          nn.ReLU(), nn.Flatten(), nn.Linear(16 * 16 * 16, 10))
    return _loader_step(model, SlowImages(steps * LOADER_BATCH), workers=2 if after else 0)


def _loader_step(model: nn.Module, dataset: Dataset[torch.Tensor], workers: int) -> Step:
    """One SGD step per batch the DataLoader hands over; with workers, prefetching 4 batches
    each and kept between epochs (started before the trace)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    options = {"num_workers": workers, "prefetch_factor": 4, "persistent_workers": True} if workers else {}
    batches = iter(DataLoader(dataset, batch_size=LOADER_BATCH, **options))  # type: ignore[arg-type]

    def step() -> None:
        _train(model, optimizer, next(batches))
    return step


# --- foreach optimizer ----------------------------------------------------------------------------


FOREACH_PARAMS, FOREACH_SIZE = 128, 16


class ManySmall(nn.Module):
    """Many small parameters (bias-sized: norms, scales, embeddings' rows) that one op gathers:
    the optimizer's per-parameter work is the step's, not the model's compute."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = nn.ParameterList(nn.Parameter(torch.randn(FOREACH_SIZE) * 0.1) for _ in range(FOREACH_PARAMS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ torch.stack(list(self.rows)).T


def foreach_optimizer(after: bool, steps: int) -> Step:
    model = ManySmall()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=after)
    x = torch.randn(64, FOREACH_SIZE)
    return lambda: _train(model, optimizer, x)


# --- .item() reads --------------------------------------------------------------------------------

ITEM_LAYERS, ITEM_WIDTH = 48, 32


def item_reads(after: bool, steps: int) -> Step:
    model = _mlp(depth=ITEM_LAYERS, width=ITEM_WIDTH)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    norms: list[float] = []

    @torch.no_grad()
    def monitor(_module: nn.Module, _inputs: object, out: torch.Tensor) -> None:
        norms.append(out.abs().mean().item())

    if not after:
        # Activation monitoring left on: every layer (Linear and ReLU) reads its output's mean
        # magnitude, a scalar read per layer, hundreds per step.
        for layer in model:
            layer.register_forward_hook(monitor)
    x = torch.randn(16, ITEM_WIDTH)

    def step() -> None:
        norms.clear()
        _train(model, optimizer, x)
    return step


# --- activation checkpointing ---------------------------------------------------------------------


class Checkpointed(nn.Module):
    def __init__(self, blocks: nn.ModuleList, on: bool) -> None:
        super().__init__()
        self.blocks, self.on = blocks, on

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.on else block(x)
        return x


def checkpointing(after: bool, steps: int) -> Step:
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128)) for _ in range(8))
    model = Checkpointed(blocks, on=not after)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 128)
    return lambda: _train(model, optimizer, x)


class PreNormLayer(nn.Module):
    """One pre-norm transformer layer: causal attention and an MLP, each on a residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


def checkpointing_transformer(after: bool, steps: int) -> Step:
    """Held out (``HOLDOUT``): not calibrated on, only checked against (a model the edit was not
    written for: layer norms, attention, residual adds, AdamW)."""
    layers = nn.ModuleList(PreNormLayer(128, 4) for _ in range(3))
    model = Checkpointed(layers, on=not after)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 64, 128)
    return lambda: _train(model, optimizer, x)


TOKENS_PER_SAMPLE = 256


class Tokenised(Dataset[torch.Tensor]):
    """Text split into words and hashed into token ids in Python: CPU work per sample (the
    calibration's dataset waits on a slow read instead)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        words = " ".join(f"w{(index * 7919 + i * 104729) % 5003}" for i in range(TOKENS_PER_SAMPLE)).split()
        return torch.tensor([hash(w) % 1000 for w in words]).float() / 1000


def dataloader_tokens(after: bool, steps: int) -> Step:
    """Held out (``HOLDOUT``): DataLoader workers where the fetch is CPU work, one worker (a
    second core for it on a 2-core machine, the main process on one intra-op thread)."""
    return _loader_step(_mlp(depth=4, width=TOKENS_PER_SAMPLE, hidden=1024), Tokenised(steps * LOADER_BATCH),
                        workers=1 if after else 0)


# --- recompiles -----------------------------------------------------------------------------------


def recompile(after: bool, steps: int) -> Step:
    # A new sequence length every step: with dynamic=False each one is a new graph. The
    # recompile limit is raised (as jobs that hit it do) so the steps keep compiling.
    torch._dynamo.config.recompile_limit = 64
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    compiled = torch.compile(model, backend="aot_eager", dynamic=after)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    lengths = iter(range(8, 8 + steps))

    def step() -> None:
        _train(compiled, optimizer, torch.randn(4, next(lengths), 32))
    return step


# --- per-sample host loop -------------------------------------------------------------------------

HOST_BATCH = 64


def host_loop(after: bool, steps: int) -> Step:
    model = _mlp(depth=4, width=256)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    raw = torch.randn(HOST_BATCH, 256)

    def preprocess(batch: torch.Tensor) -> torch.Tensor:
        with record_function("preprocess"):
            if after:
                return (batch - batch.mean(1, keepdim=True)) / (batch.std(1, keepdim=True) + 1e-5)
            return torch.stack([(s - s.mean()) / (s.std() + 1e-5) for s in batch])

    return lambda: _train(model, optimizer, preprocess(raw))


# --- growth by torch.cat --------------------------------------------------------------------------

DECODE_TOKENS, DECODE_WINDOW = 64, 8
DECODE_BATCH, DECODE_DIM = 512, 64


def cat_growth(after: bool, steps: int) -> Step:
    """One step decodes DECODE_TOKENS tokens with a key cache kept whole (for later reuse)
    while each token attends over the last DECODE_WINDOW keys (sliding-window attention): the
    cache grown by torch.cat every token (before: each token copies everything grown so far) or
    written in place into a buffer allocated for the whole sequence (after)."""
    proj = nn.Linear(DECODE_DIM, DECODE_DIM)
    start = torch.randn(DECODE_BATCH, DECODE_DIM)

    @torch.no_grad()
    def step() -> None:
        x = start
        if after:
            cache = torch.empty(DECODE_BATCH, DECODE_TOKENS, DECODE_DIM)
        else:
            cache = torch.empty(DECODE_BATCH, 0, DECODE_DIM)
        for t in range(DECODE_TOKENS):
            k = proj(x)
            if after:
                cache[:, t] = k
                keys = cache[:, max(0, t + 1 - DECODE_WINDOW): t + 1]
            else:
                cache = torch.cat([cache, k[:, None]], dim=1)
                keys = cache[:, -DECODE_WINDOW:]
            weights = torch.softmax(torch.bmm(keys, x[:, :, None]), dim=1)
            x = torch.bmm(weights.transpose(1, 2), keys)[:, 0]
    return step


# --- per-step logging moved off the step ----------------------------------------------------------

LOG_LAYERS, LOG_WIDTH, LOG_BATCH = 4, 512, 64


@torch.no_grad()
def _log_metrics(step: int, out: torch.Tensor, loss: torch.Tensor, model: nn.Module, sink: IO[str]) -> None:
    """What a training loop logs each step: the outputs' statistics and histogram, the loss,
    each parameter's norm and a checksum of the parameters (to catch silent corruption),
    formatted into one line and written."""
    stats = [out.mean(), out.std(), out.abs().max(), (out > 0).float().mean()]
    norms = {name: round(p.detach().norm().item(), 5) for name, p in model.named_parameters()}
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy())
    histogram = torch.histc(out.detach().float(), bins=32).tolist()
    sink.write(f"step {step} loss {loss.item():.6f} out {[round(s.item(), 5) for s in stats]} "
               f"norms {norms} sha256 {digest.hexdigest()} hist {histogram}\n")


def host_logging(after: bool, steps: int) -> Step:
    """Before: the metrics computed and written in the step; after: the step puts the detached
    outputs and loss on a queue that a background thread drains (the parameters it reads live,
    as such loggers do)."""
    model = _mlp(depth=LOG_LAYERS, width=LOG_WIDTH)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(LOG_BATCH, LOG_WIDTH)
    sink = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (lives as long as the capture)
    pending: queue.Queue[tuple[int, torch.Tensor, torch.Tensor]] = queue.Queue()

    def drain() -> None:  # exits after the capture's last step, so the next capture runs alone
        for _ in range(steps):
            item = pending.get()
            _log_metrics(*item, model, sink)

    if after:
        threading.Thread(target=drain, name="metrics logger").start()  # joined by capture()
    count = iter(range(steps))

    def step() -> None:
        out = model(x)
        loss = out.square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if after:
            pending.put((next(count), out.detach(), loss.detach()))
        else:
            _log_metrics(next(count), out.detach(), loss.detach(), model, sink)
    return step


# --- gradient all-reduce hidden under backward (two gloo ranks) -----------------------------------

DDP_LAYERS, DDP_WIDTH, DDP_BATCH = 6, 1024, 32
#: DDP's bucket size: six 4 MiB weights in several buckets, so the first ones are reduced while
#: backward computes the rest (the default 25 MiB would make one bucket, reduced at the end).
DDP_BUCKET_MB = 8.0
WORLD_SIZE = 2
LOOPBACK = "127.0.0.1"


def grad_allreduce(after: bool, steps: int) -> Step:
    """Built in each rank once its process group is up (``_rank_capture``). Before: backward,
    then one synchronous all_reduce per gradient; after: DistributedDataParallel."""
    model = _mlp(depth=DDP_LAYERS, width=DDP_WIDTH)
    x = torch.randn(DDP_BATCH, DDP_WIDTH, generator=torch.Generator().manual_seed(dist.get_rank()))
    if after:
        ddp = DistributedDataParallel(model, bucket_cap_mb=DDP_BUCKET_MB)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        return lambda: _train(ddp, optimizer, x)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        model(x).square().mean().backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= WORLD_SIZE
        optimizer.step()
        optimizer.zero_grad()
    return step


#: Gradient accumulation: micro-batches per optimizer step, each of this many samples.
ACCUM_MICRO, ACCUM_BATCH = 4, 8


def grad_accumulation(after: bool, steps: int) -> Step:
    """Built in each rank once its process group is up. DistributedDataParallel over the same MLP,
    gradients accumulated over ACCUM_MICRO micro-batches per optimizer step. Before: every
    backward all-reduces (no no_sync()); after: the micro-batches before the last run under
    ddp.no_sync(), so only the last backward all-reduces."""
    model = _mlp(depth=DDP_LAYERS, width=DDP_WIDTH)
    ddp = DistributedDataParallel(model, bucket_cap_mb=DDP_BUCKET_MB)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    batches = [torch.randn(ACCUM_BATCH, DDP_WIDTH, generator=g) for _ in range(ACCUM_MICRO)]

    def step() -> None:
        for i, x in enumerate(batches):
            if after and i < ACCUM_MICRO - 1:
                with ddp.no_sync():
                    ddp(x).square().mean().backward()
            else:
                ddp(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return step


def _rank_capture(rank: int, port: int, key: str, after: bool, dest: str) -> None:
    """One rank of a distributed fix: both ranks run and profile the same loop; rank 0's trace
    is written."""
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, init_method=f"tcp://{LOOPBACK}:{port}",
                            timeout=timedelta(seconds=120))
    try:
        fix = BY_KEY[key]
        seed_everything()  # same seed on both ranks: the same initial weights, as DDP requires
        torch.use_deterministic_algorithms(False)
        n = total_steps(**fix.sched)
        step = fix.build(after, n)
        with cpu_profile(schedule=step_schedule(**fix.sched)) as prof:
            for _ in range(n):
                step()
                prof.step()
        if rank == 0:
            export_trace(prof, Path(dest))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run_ranks(fix: Fix, after: bool, dest: Path) -> float:
    """Spawn the fix's ranks (fresh interpreters, a fresh process group) and wait for them;
    returns the cores the other processes used meanwhile (the ranks' own CPU time taken out)."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo would pick its interface from the hostname
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port = int(s.getsockname()[1])
    busy, total = _cpu_jiffies()
    own = _own_and_children_cpu_s()
    mp.start_processes(_rank_capture, args=(port, fix.key, after, str(dest)), nprocs=fix.ranks, join=True,
                       start_method="spawn")
    return _others_cores(busy, total, _own_and_children_cpu_s() - own)


def _own_and_children_cpu_s() -> float:
    """CPU seconds of this process and of its reaped children (a distributed fix's ranks)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime

# --- zero_grad(set_to_none) -----------------------------------------------------------------------


def zero_grad_none(after: bool, steps: int) -> Step:
    model = _mlp(depth=12, width=512)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 512)
    return lambda: _train(model, optimizer, x, set_to_none=after)


@dataclass(frozen=True)
class Fix:
    key: str
    build: Callable[[bool, int], Step]  # (after, steps) -> one training step
    before: str
    after: str
    sched: dict[str, int]
    env: dict[str, str]
    isolated: bool = False  # each capture in a fresh interpreter (state would carry over)
    ranks: int = 1  # more: each capture spawns this many gloo ranks (``_run_ranks``), rank 0's trace kept
    #: its edit charges a cost of the machine, not of the trace (``SetGradsToNone``'s first touch):
    #: the interpreter measures it before its captures and the log keeps it for bench/calibrate.py
    machine_constant: bool = False


FIXES: tuple[Fix, ...] = (
    Fix("dataloader_workers", dataloader_workers,
        f"DataLoader(num_workers=0) over a dataset whose __getitem__ waits {LOADER_READ_S * 1e3:.1f} ms per sample "
        f"(a slow read) then normalises and flips it; batch {LOADER_BATCH}; a small CNN trained with SGD",
        "num_workers=2, prefetch_factor=4, persistent_workers=True (workers started before the trace)",
        SCHEDULE, {}, isolated=True),
    Fix("foreach_optimizer", foreach_optimizer,
        f"Adam(foreach=False) over {FOREACH_PARAMS} small parameters ({FOREACH_SIZE} values each, gathered by one "
        "torch.stack: x @ stack(params).T), batch 64",
        "Adam(foreach=True)", SHORT_SCHEDULE, {}),
    Fix("item_reads", item_reads,
        f"a no_grad forward hook on each of the {2 * ITEM_LAYERS} layers of {ITEM_LAYERS} x (Linear({ITEM_WIDTH}, "
        f"{ITEM_WIDTH}) + ReLU) reads its output's mean magnitude with out.abs().mean().item() (activation "
        f"monitoring left on: {2 * ITEM_LAYERS} reads per step); SGD, batch 16",
        "no hook: the per-layer reads removed", SHORT_SCHEDULE, {}),
    Fix("checkpointing", checkpointing,
        "8 blocks Linear(128, 512) GELU Linear(512, 128), each under torch.utils.checkpoint(use_reentrant=False); "
        "SGD, batch 32",
        "the same blocks without checkpoint", SCHEDULE, {}),
    Fix("recompile", recompile,
        "torch.compile(backend='aot_eager', dynamic=False) on a 2-layer MLP fed a new sequence length every step "
        "(8, 9, 10, ...; recompile_limit raised to 64): every step recompiles",
        "torch.compile(..., dynamic=True): one compile, in the warm-up steps", COMPILE_SCHEDULE,
        {"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}, isolated=True),
    Fix("host_loop", host_loop,
        f"a record_function('preprocess') block normalises the batch one sample at a time in a Python loop "
        f"({HOST_BATCH} samples: mean, std, sub, add, div each, then torch.stack); 4 Linear(256, 256) + ReLU, SGD",
        "the same normalisation vectorised over the batch (mean and std over dim 1)", SCHEDULE, {}),
    Fix("cat_growth", cat_growth,
        f"inference, no_grad: one step decodes {DECODE_TOKENS} tokens, batch {DECODE_BATCH}, width {DECODE_DIM}, "
        f"attending (bmm, softmax, bmm) over the last {DECODE_WINDOW} keys of a key cache kept whole and grown by "
        "torch.cat every token",
        "the cache allocated once per step for all tokens and written in place (cache[:, t] = k)", SCHEDULE, {}),
    Fix("zero_grad_none", zero_grad_none,
        "optimizer.zero_grad(set_to_none=False) after each step: 12 Linear(512, 512) + ReLU (3.2 M parameters), "
        "SGD, batch 4",
        "zero_grad(set_to_none=True)", SCHEDULE, {}, machine_constant=True),
    Fix("host_logging", host_logging,
        f"after each step the loop logs metrics: the outputs' mean, std, max, share positive and 32-bin histogram, "
        f"the loss, each parameter's norm (.item() each) and a sha256 of the parameters, written as one line; "
        f"{LOG_LAYERS} Linear({LOG_WIDTH}, {LOG_WIDTH}) + ReLU, SGD, batch {LOG_BATCH}",
        "the step puts its detached outputs and loss on a queue; a background thread computes and writes the same "
        "line (reading the parameters live)", SCHEDULE, {}),
    Fix("grad_allreduce", grad_allreduce,
        f"two gloo ranks on loopback, {DDP_LAYERS} Linear({DDP_WIDTH}, {DDP_WIDTH}) + ReLU, SGD, batch {DDP_BATCH}: "
        "after backward, one synchronous dist.all_reduce per gradient (then divided by the world size)",
        f"DistributedDataParallel(bucket_cap_mb={DDP_BUCKET_MB:g}): bucketed all-reduces launched during backward",
        SCHEDULE, {}, ranks=WORLD_SIZE),
    Fix("grad_accumulation", grad_accumulation,
        f"two gloo ranks on loopback, DistributedDataParallel(bucket_cap_mb={DDP_BUCKET_MB:g}) over {DDP_LAYERS} "
        f"Linear({DDP_WIDTH}, {DDP_WIDTH}) + ReLU, SGD; gradients accumulated over {ACCUM_MICRO} micro-batches of "
        f"{ACCUM_BATCH} per optimizer step, every backward all-reducing",
        f"the first {ACCUM_MICRO - 1} micro-batches under ddp.no_sync(): only the last backward all-reduces",
        SCHEDULE, {}, ranks=WORLD_SIZE),
)
#: Pairs held out of the calibration: ``bench/calibrate.py`` never reads them, and a test checks
#: the fix's prediction on them (``tests/test_holdout.py``): each a fix type the calibration has,
#: on a program its edit was not written for. Written to their own directory (``--holdout``).
HOLDOUT: tuple[Fix, ...] = (
    Fix("checkpointing_transformer", checkpointing_transformer,
        "3 pre-norm transformer layers (LayerNorm, causal scaled_dot_product_attention, residual adds, "
        "Linear(128, 512) GELU Linear(512, 128)), width 128, 4 heads, each under "
        "torch.utils.checkpoint(use_reentrant=False); AdamW, batch 8 x 64 tokens",
        "the same layers without checkpoint", SHORT_SCHEDULE, {}),
    Fix("dataloader_tokens", dataloader_tokens,
        f"DataLoader(num_workers=0) over a dataset that builds {TOKENS_PER_SAMPLE} words per sample and hashes "
        f"them into token ids in Python (CPU work); batch {LOADER_BATCH}; a 4-block MLP of width "
        f"{TOKENS_PER_SAMPLE} (hidden 1024) trained with SGD",
        "num_workers=1, prefetch_factor=4, persistent_workers=True (the worker started before the trace)",
        SCHEDULE, {}, isolated=True),
)
BY_KEY = {f.key: f for f in (*FIXES, *HOLDOUT)}


def trace_name(key: str, variant: str, repeat: int) -> str:
    return f"{key}_{variant}_{repeat}.pt.trace.json.gz"


#: Other processes' CPU use (cores) under which a capture may start: this 2-core machine is
#: shared, and a test run beside a capture moved the same program's step by up to 2x.
QUIET_CORES = 0.3
#: How long to wait for that before capturing anyway (the log says how busy it was).
QUIET_WAIT_S = 60.0


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text(encoding="utf-8").split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def _others_cores(busy0: int, total0: int, own_s: float) -> float:
    """Cores the machine's other processes used since (busy0, total0), this process's own CPU
    time ``own_s`` taken out."""
    busy1, total1 = _cpu_jiffies()
    cores = os.cpu_count() or 1
    span_s = (total1 - total0) / cores / os.sysconf("SC_CLK_TCK")
    used = (busy1 - busy0) / os.sysconf("SC_CLK_TCK") - own_s
    return max(used, 0.0) / span_s if span_s > 0 else 0.0


def wait_for_quiet() -> tuple[float, float]:
    """Wait (up to QUIET_WAIT_S) until the other processes used under QUIET_CORES for two
    seconds in a row; returns (their last use in cores, seconds waited)."""
    started = time.monotonic()
    calm = 0
    while True:
        busy, total = _cpu_jiffies()
        own = time.process_time()
        time.sleep(1.0)
        others = _others_cores(busy, total, time.process_time() - own)
        calm = calm + 1 if others < QUIET_CORES else 0
        waited = time.monotonic() - started
        if calm >= 2 or waited > QUIET_WAIT_S:
            return others, waited


def _own_cpu_s() -> float:
    """CPU seconds of this process and of its finished children (a distributed fix's ranks)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def capture(fix: Fix, after: bool, dest: Path) -> str:
    """Capture one trace once the machine is quiet; returns its log line (how busy the other
    processes were before and during the capture)."""
    quiet, waited = wait_for_quiet()
    during = _run_ranks(fix, after, dest) if fix.ranks > 1 else _capture_here(fix, after, dest)
    return (f"{dest.name}\tother processes {quiet:.2f} cores before (waited {waited:.0f} s), "
            f"{during:.2f} during the capture")


def _capture_here(fix: Fix, after: bool, dest: Path) -> float:
    """Capture in this interpreter; returns the cores the other processes used during the loop."""
    seed_everything()
    torch.use_deterministic_algorithms(False)  # index_put's deterministic path is not what the after loop runs
    n = total_steps(**fix.sched)
    step = fix.build(after, n)
    busy, total = _cpu_jiffies()
    own = time.process_time()
    faults: list[int] = []  # per step: the pages it faulted in (each a first touch of a fresh page)
    with cpu_profile(schedule=step_schedule(**fix.sched)) as prof:
        for _ in range(n):
            faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            step()
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faulted)
            prof.step()
        for thread in threading.enumerate():  # the step's background work (a logger) ends in the capture
            if thread is not threading.main_thread() and not thread.daemon:  # (not a DataLoader queue's feeder)
                thread.join()
    during = _others_cores(busy, total, time.process_time() - own)
    export_trace(prof, dest)
    if fix.machine_constant:  # the pages the steps faulted in: whether the machine's cost was paid
        active = faults[-fix.sched["active"]:]
        print(f"{FAULTS}{dest.name}\tminor page faults per traced step: median {statistics.median(active):,.0f}, "
              f"{min(active):,} to {max(active):,}", flush=True)
    return during


#: How captures.log names the machine's first-touch ratio (bench/calibrate.py reads it back).
FIRST_TOUCH = "first touch "
#: How it names the page faults a capture's steps took (each a first touch of a fresh page).
FAULTS = "faults "


def first_touch_line() -> str:
    """The machine's first-touch cost against a warm ``zero_()``, measured in this interpreter
    before its captures (``first_touch.py``)."""
    first, warm, ratio = first_touch_ratio()
    return f"{FIRST_TOUCH}{ratio:.2f}x a warm zero_() ({MIB} MiB: {first:.2f} ms against {warm:.2f} ms)"


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3])


def _run(fix: Fix, runs: list[tuple[str, Path]]) -> tuple[str, str, float, list[str]]:
    """``runs`` (variant, trace) in this order, in one fresh interpreter; returns the load
    average before and after, the wall time and each capture's log line."""
    with tempfile.TemporaryDirectory(prefix="calibration_") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, **fix.env}
        load_before = _loadavg()
        started = time.monotonic()
        child = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", fix.key,
                                *(f"{variant}={dest}" for variant, dest in runs)],
                               env=env, check=True, timeout=1800, stdout=subprocess.PIPE, text=True)
        lines = [line for line in child.stdout.splitlines()
                 if ".pt.trace.json.gz\t" in line or line.startswith((FIRST_TOUCH, FAULTS))]
        return load_before, _loadavg(), time.monotonic() - started, lines


def captures(keys: list[str], repeats: int) -> Iterator[tuple[Fix, list[tuple[str, int]]]]:
    """Per fix, the interpreters to start and the (variant, repeat) each captures: before then
    after, repeat after repeat, so each pair's sides alternate in time."""
    for key in keys:
        fix = BY_KEY[key]
        order = [(variant, repeat) for repeat in range(1, repeats + 1) for variant in VARIANTS]
        if fix.isolated:
            yield from ((fix, [run]) for run in order)
        else:
            yield fix, order


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for the traces")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=sorted(BY_KEY))
    parser.add_argument("--holdout", action="store_true", help="the held-out pairs (HOLDOUT) instead")
    parser.add_argument("--one", choices=sorted(BY_KEY), help=argparse.SUPPRESS)
    parser.add_argument("runs", nargs="*", help=argparse.SUPPRESS)  # child mode: VARIANT=TRACE ...
    args = parser.parse_args(argv)
    if args.one:  # child mode, see _run
        if BY_KEY[args.one].machine_constant:
            print(first_touch_line(), flush=True)
        for run in args.runs:
            variant, dest = run.split("=", 1)
            print(capture(BY_KEY[args.one], variant == "after", Path(dest)), flush=True)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "captures.log", "a", encoding="utf-8") as log:
        for fix, order in captures(args.only or [f.key for f in (HOLDOUT if args.holdout else FIXES)], args.repeats):
            runs = [(variant, args.out / trace_name(fix.key, variant, repeat)) for variant, repeat in order]
            before, after, seconds, lines = _run(fix, runs)
            line = f"{' '.join(d.name for _, d in runs)}\tload {before} -> {after}\t{seconds:.1f} s"
            for text in [line, *(f"  {one}" for one in lines)]:
                print(text, flush=True)
                log.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
