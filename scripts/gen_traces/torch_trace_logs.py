"""``TORCH_TRACE`` structured compile logs (what tlparse reads), each with the profiler trace
and the ``TORCH_LOGS="graph_breaks,recompiles"`` stderr of the same run.

    python scripts/gen_traces/torch_trace_logs.py --out tests/data/generated [--only KEY ...]

``ttrace_break_item``: compile_traces' ``compile_break_item`` case (a ``.item()`` graph break
in the forward, then a recompile of the resume function in trace step 1) run again with
``TORCH_TRACE`` set. ``ttrace_ranks``: two ranks over gloo on 127.0.0.1, each compiling the
same model, whose forward breaks the graph on rank 1 only (a rank-dependent branch): rank 1
compiles more frames and graphs than rank 0, which is the cross-rank divergence a reader must
see. Each run is a fresh interpreter with its own empty inductor cache dir (caches on: the
first compile of each graph misses, a repeat graph hits).

The logs are written as torch wrote them, except for paths: the checkout's are made
checkout-relative (``scripts/...``, also where Dynamo cut a path to a column; the checkout
itself, inductor's default cutlass dir in the logged config, is ``<checkout>``), the torch
install, the interpreter's prefix and the temporary cache dir are replaced by ``<torch>``,
``<python>`` and ``<inductor_cache>``, and the payload hash (``has_payload``, the
md5 of the payload) of an entry whose payload that changed is recomputed, so the hashes still
check. Files are renamed without tempfile's random suffix and gzipped with mtime 0.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

LOOPBACK = "127.0.0.1"
WORLD_SIZE = 2
BREAK_RANK = 1
RANKS_SCHEDULE = {"wait": 0, "warmup": 0, "active": 4}
RUN_TIMEOUT_S = 900
TORCH_LOGS = "graph_breaks,recompiles"


@dataclass(frozen=True)
class LogCase:
    key: str
    traces: tuple[str, ...]  # the profiler traces of the run
    schedule: dict[str, int]
    planted: str

    def log_dir(self, out_dir: Path) -> Path:
        return out_dir / f"cpu_{self.key}.torch_trace"


CASES = (
    LogCase("ttrace_break_item", ("cpu_ttrace_break_item.pt.trace.json.gz",), {"wait": 0, "warmup": 0, "active": 5},
            "compile_traces' compile_break_item run with TORCH_TRACE: TinyNet with x.abs().mean().item() "
            "before the head (graph break, resume function), 5 cold steps; the resume function recompiles "
            "in trace step 1 (new float value; 1/1). Files: cpu_ttrace_break_item.pt.trace.json.gz (profiler), "
            "cpu_ttrace_break_item.torch_logs.txt (TORCH_LOGS stderr), cpu_ttrace_break_item.torch_trace/ "
            "(the TORCH_TRACE directory, one log)."),
    LogCase("ttrace_ranks", tuple(f"cpu_ttrace_ranks_rank{r}.pt.trace.json.gz" for r in range(WORLD_SIZE)),
            RANKS_SCHEDULE,
            f"two ranks (gloo, 127.0.0.1, world size {WORLD_SIZE}), each torch.compile'ing RankNet; its "
            f"forward calls torch._dynamo.graph_break() between the body and the head on rank {BREAK_RANK} "
            "only, so rank 1 compiles two frames (0/0 and the resume function 1/0) where rank 0 compiles "
            "one; gradients all-reduced by hand after backward (outside the compiled code), 4 cold steps "
            "profiled per rank. Files: cpu_ttrace_ranks_rank{0,1}.pt.trace.json.gz, "
            "cpu_ttrace_ranks.torch_trace/dedicated_log_torch_trace_rank_{0,1}.log.gz."),
)
BY_KEY = {c.key: c for c in CASES}


def _rank_main(rank: int, port: int, out_dir: str) -> None:
    """One rank of ``ttrace_ranks`` (a spawned child; TORCH_TRACE is in its environment)."""
    import torch
    import torch.distributed as dist
    from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
    from torch import nn

    class RankNet(nn.Module):
        def __init__(self, break_graph: bool) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
            self.head = nn.Linear(32, 10)
            self.break_graph = break_graph

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.body(x)
            if self.break_graph:  # a rank-dependent branch: only one rank breaks the graph here
                torch._dynamo.graph_break()
            return self.head(h)

    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=120),
                            init_method=f"tcp://{LOOPBACK}:{port}")
    try:
        seed_everything()
        torch.use_deterministic_algorithms(False)
        model = RankNet(break_graph=rank == BREAK_RANK)
        compiled = torch.compile(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)
        with cpu_profile(schedule=step_schedule(**RANKS_SCHEDULE)) as prof:
            for _ in range(total_steps(**RANKS_SCHEDULE)):
                x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
                loss = nn.functional.cross_entropy(compiled(x), y)
                loss.backward()
                for p in model.parameters():
                    assert p.grad is not None
                    dist.all_reduce(p.grad)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                prof.step()
        export_trace(prof, Path(out_dir) / f"cpu_ttrace_ranks_rank{rank}.pt.trace.json.gz")
        dist.barrier()
    finally:
        dist.destroy_process_group()


# What is left of a checkout path before "scripts/gen_traces/" (Dynamo cuts paths in guard
# comments to a column: "ork/main/scripts/...").
_CHECKOUT_TAIL = re.compile(r"[^\s\"'<>]*(?=scripts/gen_traces/)")


def _scrubbed(text: str, replacements: list[tuple[str, str]]) -> str:
    for old, new in replacements:
        text = text.replace(old, new)
    return _CHECKOUT_TAIL.sub("", text)


def _replacements(cache_dir: str) -> list[tuple[str, str]]:
    import torch

    here = Path(__file__).resolve().parents[2]
    pairs = [(str(Path(torch.__file__).resolve().parent), "<torch>"), (cache_dir, "<inductor_cache>"),
             (str(here) + os.sep, ""), (str(here), "<checkout>"), (sys.prefix, "<python>"),
             (sys.base_prefix, "<python>"),
             (tempfile.gettempdir() + os.sep, "<tmp>" + os.sep)]
    return sorted({p for p in pairs if p[0]}, key=lambda p: -len(p[0]))


_HAS_PAYLOAD = re.compile(r'"has_payload": "[0-9a-f]{32}"')


def write_log(src: Path, dest: Path, replacements: list[tuple[str, str]]) -> None:
    """``src`` gzipped to ``dest`` with paths replaced and each changed payload's md5 recomputed."""
    lines = src.read_text(encoding="utf-8").split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        envelope = _scrubbed(lines[i], replacements)
        i += 1
        payload: list[str] = []
        while i < len(lines) and lines[i].startswith("\t"):
            payload.append(_scrubbed(lines[i], replacements))
            i += 1
        if payload and _HAS_PAYLOAD.search(envelope):
            digest = hashlib.md5("\n".join(p[1:] for p in payload).encode("utf-8"), usedforsecurity=False)
            envelope = _HAS_PAYLOAD.sub(f'"has_payload": "{digest.hexdigest()}"', envelope)
        out.append(envelope)
        out.extend(payload)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                               compresslevel=9) as gz:
        gz.write("\n".join(out).encode("utf-8"))


def _stable_name(log: Path) -> str:
    """``dedicated_log_torch_trace_rank_1_ab12cd.log`` -> ``dedicated_log_torch_trace_rank_1.log.gz``."""
    m = re.match(r"(dedicated_log_torch_trace_(?:rank_\d+_)?)", log.name)
    stem = m.group(1).rstrip("_") if m else log.stem
    return f"{stem}.log.gz" if "rank_" in stem else f"{stem}_run.log.gz"


def make(case: LogCase, out_dir: Path) -> None:
    out_dir = out_dir.resolve()
    log_dir = case.log_dir(out_dir)
    with tempfile.TemporaryDirectory(prefix="ttrace_") as tmp:
        cache, raw_logs = Path(tmp) / "cache", Path(tmp) / "logs"
        env = {**os.environ, "TORCH_TRACE": str(raw_logs), "TORCH_LOGS": TORCH_LOGS,
               "TORCHINDUCTOR_CACHE_DIR": str(cache), "GLOO_SOCKET_IFNAME": "lo"}
        env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
        here = Path(__file__).resolve().parent
        if case.key == "ttrace_break_item":
            cmd = [sys.executable, str(here / "compile_traces.py"), "--case", "compile_break_item",
                   "--out", tmp]
        else:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--ranks", "--out", tmp]
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if result.returncode != 0:
            raise RuntimeError(f"{case.key} failed ({result.returncode}):\n{result.stderr[-4000:]}")
        replacements = _replacements(str(cache))
        for trace in Path(tmp).glob("*.pt.trace.json.gz"):
            name = trace.name.replace("cpu_compile_break_item", "cpu_ttrace_break_item")
            text = _scrubbed(gzip.decompress(trace.read_bytes()).decode("utf-8"), replacements)
            with open(out_dir / name, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                                                   compresslevel=9) as gz:
                gz.write(text.encode("utf-8"))
        if case.key == "ttrace_break_item":
            (out_dir / "cpu_ttrace_break_item.torch_logs.txt").write_text(
                _scrubbed(result.stderr, replacements), encoding="utf-8")
        for old in log_dir.glob("*.log.gz"):
            old.unlink()
        for log in sorted(raw_logs.glob("dedicated_log_torch_trace_*.log")):
            write_log(log, log_dir / _stable_name(log), replacements)


def _spawn_ranks(out_dir: Path) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port = int(s.getsockname()[1])
    context = mp.start_processes(_rank_main, args=(port, str(out_dir)), nprocs=WORLD_SIZE, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            raise TimeoutError(f"two-rank run did not finish within {RUN_TIMEOUT_S} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the logs and traces")
    parser.add_argument("--only", nargs="+", choices=sorted(BY_KEY), help="make only these")
    parser.add_argument("--ranks", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ranks:  # child mode, see make()
        _spawn_ranks(args.out)
        return 0
    for case in CASES:
        if not args.only or case.key in args.only:
            make(case, args.out)
            sizes = {p.name: p.stat().st_size for p in sorted(case.log_dir(args.out).iterdir())}
            print(f"{case.key}: {json.dumps(sizes)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
