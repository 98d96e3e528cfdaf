"""Host overhead of ``tracewhy.instrument`` per block and per mark (target: under 5 us a block).

Each measurement times N empty ``with`` bodies and subtracts a bare context manager that reads
the same clock twice (the least any timer does), in the same process, interleaved over rounds;
the median round is reported. Cases: the recorder's block with torch imported and no profiler
running (the usual state: ``record_function`` is skipped), the decorator/``with block(...)``
form through the process-wide recorder, a stage mark, and, for scale, PyTorch's own
``record_function`` with no profiler. On a CUDA machine the same runs add CUDA events per block
(``cuda_events=True``), still without a synchronize.

Usage: python bench/bench_instrument.py [--n 100000] [--rounds 7] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.autograd.profiler import record_function

from tracewhy import instrument


class _Bare:
    __slots__ = ("t",)

    def __enter__(self) -> None:
        self.t = time.perf_counter_ns()

    def __exit__(self, *exc: object) -> None:
        time.perf_counter_ns()


def _per_call(body: Callable[[int], None], n: int) -> float:
    t = time.perf_counter_ns()
    body(n)
    return (time.perf_counter_ns() - t) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.zeros(1, device="cuda")  # initialize CUDA: the recorder never does
    rec = instrument.configure(tempfile.mkdtemp(prefix="tw-instr-"), rank=0, world_size=1, cuda_events=cuda)

    def bare(n: int) -> None:
        for _ in range(n):
            with _Bare():
                pass

    def recorder_block(n: int) -> None:
        for _ in range(n):
            with rec.block("b"):
                pass

    def module_block(n: int) -> None:
        for _ in range(n):
            with instrument.block("b"):
                pass

    def mark(n: int) -> None:
        for i in range(n):
            rec.mark("m", chunk=i)

    def torch_record_function(n: int) -> None:
        for _ in range(n):
            with record_function("b"):
                pass

    cases = {"bare timer (baseline)": bare, "Recorder.block": recorder_block, "instrument.block": module_block,
             "StageClock mark": mark, "torch record_function (no profiler)": torch_record_function}
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):
        for name, body in cases.items():
            samples[name].append(_per_call(body, args.n))
            rec.flush()
    base = statistics.median(samples["bare timer (baseline)"])
    rows = []
    for name, values in samples.items():
        med = statistics.median(values)
        rows.append(f"| {name} | {med / 1e3:.2f} | {(med - base) / 1e3:.2f} |")
    load = os.getloadavg()
    text = "\n".join([
        "# Instrument overhead per call (bench_instrument.py)",
        "",
        f"Made by `python bench/bench_instrument.py --n {args.n} --rounds {args.rounds}`: median of {args.rounds} "
        f"rounds of {args.n:,} empty bodies each, cases interleaved in every round. *overhead* is the case minus "
        "the bare timer (two `perf_counter_ns` reads in a `with`). Target: under 5 us of host time per "
        "block.",
        "",
        f"- machine: {os.cpu_count()} logical cores, {platform.processor() or platform.machine()}, "
        f"{'CUDA ' + torch.cuda.get_device_name() if cuda else 'no GPU'}",
        f"- Python {platform.python_version()}, torch {torch.__version__}",
        f"- load average at end: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (shared machine: timings are noisy)",
        "",
        "| case | us per call | overhead us |",
        "| --- | ---: | ---: |",
        *rows,
    ])
    print(text)
    if not args.no_write:
        out = Path(__file__).with_name("results_instrument_cuda.md" if cuda else "results_instrument.md")
        out.write_text(text + "\n")
        print(f"\nwritten to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
