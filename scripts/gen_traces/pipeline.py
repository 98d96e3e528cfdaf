"""A real two-process pipeline, instrumented with ``tracewhy.instrument``, run at in-flight depth
D=1 and D=2.

Rank 0 builds each chunk (``tA0``..``tA1``), sends it (``tSend``), and once D chunks are in
flight receives the oldest result (``tRecv``), decodes it (``tDecode``..``tEmit``). Rank 1, the
mesh leader, receives a chunk, computes (``tB0``..``tB1``) and sends the result back. Transport:
gloo ``send``/``recv`` on 127.0.0.1 (CPU), or NCCL on CUDA when a GPU is present, with CUDA
events on the blocks. With D=1 rank 0 waits for every result before building the next chunk, so
the stages run one after the other; with D=2 it builds chunk k+1 while rank 1 computes chunk k.

    python scripts/gen_traces/pipeline.py --out tests/data/generated/pipeline [--chunks 24]

Writes ``d1/`` and ``d2/``, each with ``tracewhy-instrument.rank0.jsonl`` and ``...rank1.jsonl``,
and ``MANIFEST.md`` with what was planted.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tracewhy import instrument

LOOPBACK = "127.0.0.1"
#: Work per stage: a few matrix products of this size, then a wait that stands for the device
#: work of a real stage (on CPU, two busy processes on a shared two-core machine would measure
#: the scheduler, not the pipeline; on CUDA the products are real and the waits are skipped).
#: Rank 1's stage is the longer one, so it sets the period when the stages overlap.
SIZE = 128
BUILD_REPS, DECODE_REPS, COMPUTE_REPS = 2, 2, 4
BUILD_WAIT_S, DECODE_WAIT_S, COMPUTE_WAIT_S = 0.003, 0.003, 0.008
COLLECTIVE_TIMEOUT = timedelta(seconds=60)


def _work(x: torch.Tensor, reps: int, wait_s: float) -> torch.Tensor:
    for _ in range(reps):
        x = torch.tanh(x @ x) * 0.5
    if x.device.type == "cpu":
        time.sleep(wait_s)
    return x


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rank_main(rank: int, port: int, out: str, depth: int, chunks: int) -> None:
    os.environ.update(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)  # two processes on a small machine: one core each
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=2, timeout=COLLECTIVE_TIMEOUT)
    rec = instrument.configure(Path(out), rank=rank, world_size=2)
    clock = instrument.StageClock(rec, cuda=cuda)
    g = torch.Generator(device="cpu").manual_seed(rank)
    buf = torch.empty(SIZE, SIZE, device=device)
    # Sends are isend: a blocking gloo send waits for the matching recv, and at D=2 both ranks
    # would be sending at once (the next chunk one way, a result the other).
    sends: list[dist.Work] = []
    if rank == 0:
        in_flight: list[int] = []

        def finish_oldest() -> None:
            j = in_flight.pop(0)
            dist.recv(buf, src=1)
            clock.mark("tRecv", chunk=j)
            clock.mark("tDecode", chunk=j)
            with rec.block("decode", chunk=j):
                _work(buf, DECODE_REPS, DECODE_WAIT_S)
                _sync(device)
            clock.mark("tEmit", chunk=j)

        for k in range(chunks):
            rec.next_step(k)
            clock.mark("tA0", chunk=k)
            with rec.block("build", chunk=k):
                x = _work(torch.rand(SIZE, SIZE, generator=g).to(device), BUILD_REPS, BUILD_WAIT_S)
                _sync(device)
            clock.mark("tA1", chunk=k)
            clock.mark("tSend", chunk=k)
            sends.append(dist.isend(x, dst=1))
            in_flight.append(k)
            if len(in_flight) == depth:
                finish_oldest()
        while in_flight:
            finish_oldest()
    else:
        for k in range(chunks):
            rec.next_step(k)
            dist.recv(buf, src=0)
            clock.mark("tB0", chunk=k)
            with rec.block("compute", chunk=k):
                y = _work(buf, COMPUTE_REPS, COMPUTE_WAIT_S)
                _sync(device)
            clock.mark("tB1", chunk=k)
            sends.append(dist.isend(y, dst=0))
    for w in sends:
        w.wait()
    rec.flush()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def run(out: Path, depth: int, chunks: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.jsonl"):
        old.unlink()
    mp.start_processes(_rank_main, args=(_free_port(), str(out), depth, chunks), nprocs=2, join=True,
                       start_method="spawn")


MANIFEST = """# Instrument logs of a real two-process pipeline

- made by: `scripts/gen_traces/pipeline.py` ({device}, torch {torch}, {chunks} chunks per run)
- `d1/`: in-flight depth D=1: rank 0 waits for each result before building the next chunk;
  planted: the stages are serialized (period about stage0 + stage1, OverlapScore near 0).
- `d2/`: D=2: rank 0 builds chunk k+1 while rank 1 computes chunk k; planted: overlap (period
  about max(stage0, stage1), OverlapScore near 1 after the first chunks).
- marks: rank 0 `tA0 tA1 tSend tRecv tDecode tEmit`, rank 1 `tB0 tB1`, per chunk; blocks: `build`,
  `decode` (rank 0), `compute` (rank 1), each with its chunk.
- work per stage: {size}x{size} matrix products (build {build}, decode {decode}, compute {compute}
  repetitions) and, on CPU, a wait standing for device work (build {bw} ms, decode {dw} ms, compute
  {cw} ms); one thread per process; timings vary with the machine's load.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--chunks", type=int, default=24)
    args = ap.parse_args(argv)
    for depth in (1, 2):
        t = time.perf_counter()
        run(args.out / f"d{depth}", depth, args.chunks)
        print(f"D={depth}: {time.perf_counter() - t:.1f} s -> {args.out / f'd{depth}'}", file=sys.stderr)
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    (args.out / "MANIFEST.md").write_text(MANIFEST.format(
        device="two CUDA GPUs, NCCL" if cuda else "CPU, gloo on 127.0.0.1", torch=torch.__version__,
        chunks=args.chunks, size=SIZE, build=BUILD_REPS, decode=DECODE_REPS, compute=COMPUTE_REPS,
        bw=BUILD_WAIT_S * 1e3, dw=DECODE_WAIT_S * 1e3, cw=COMPUTE_WAIT_S * 1e3))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
