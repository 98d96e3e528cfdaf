"""``torch.compile`` traces with known graph breaks and recompiles, each with the
``TORCH_LOGS="graph_breaks,recompiles"`` stderr of the same run captured beside it.

    python scripts/gen_traces/compile_traces.py --out tests/data/generated [--only KEY ...]

Each case runs in a fresh interpreter (Dynamo's caches and the log set-up are per process)
with inductor's caches off, so every run compiles. The device is chosen at run time: on a
CUDA machine the same cases are captured with CUDA activity (Triton kernels) and files are
named ``cuda_*``; ``reduce-overhead`` (CUDA graphs) is made only there, since the CPU build
has no CUDA graphs to replay. What each case plants (graph breaks per forward, the steps that
recompile) is declared here, from the code below, not measured from the trace.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from capture import export_trace, seed_everything
from torch import nn
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile, schedule

WIDTH = 32
N_BLOCKS = 3
BATCH = 16
SMALL_LAST_BATCH = 12  # the dynamic-shape case's last batch: a new size, so a recompile
NUM_CLASSES = 10
TORCH_LOGS = "graph_breaks,recompiles"
# Cold cases: wait=0, warmup=0, so step 0 of the trace holds the whole compilation.
COLD = {"wait": 0, "warmup": 0, "active": 5}
# Cases captured with the Python tracer: compile first (wait + warmup steps outside the
# trace), else step 0's tens of thousands of Dynamo frames would make the file megabytes.
WARM = {"wait": 1, "warmup": 1, "active": 4}
warnings.filterwarnings("ignore", message="Profiler won't be using warmup")


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def file_prefix() -> str:
    return device().type


class Block(nn.Module):
    """Linear + ReLU with a residual; ``break_inside`` puts one graph break in the middle."""

    def __init__(self, break_inside: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.break_inside = break_inside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(x))
        if self.break_inside:
            torch._dynamo.graph_break()
        return x + 0.5 * h


class TinyNet(nn.Module):
    """Blocks then a head. ``top_break``: a graph break between the blocks and the head;
    ``item_break``: a ``.item()`` read there (Dynamo breaks on it by default)."""

    def __init__(self, *, top_break: bool = False, item_break: bool = False,
                 block_break: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(block_break) for _ in range(N_BLOCKS))
        self.head = nn.Linear(WIDTH, NUM_CLASSES)
        self.top_break = top_break
        self.item_break = item_break

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        if self.top_break:
            torch._dynamo.graph_break()
        if self.item_break:
            x = x / (1.0 + x.abs().mean().item())
        return self.head(x)


class LoopBreakNet(nn.Module):
    """A graph break inside a ``for`` loop of the compiled function: Dynamo cannot resume in a
    loop, so it skips the whole frame and ``forward`` runs eagerly. Only tensor functions are
    called (no submodule frames Dynamo could compile on their own)."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH**0.5)
                                        for _ in range(N_BLOCKS))
        self.head = nn.Parameter(torch.randn(WIDTH, NUM_CLASSES) / WIDTH**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.weights:
            x = x + torch.relu(x @ w)
            torch._dynamo.graph_break()
        return x @ self.head


class ScaledNet(TinyNet):
    """TinyNet whose forward takes a Python int: compiled with ``dynamic=False`` each new
    value fails the guard ``n == value`` and recompiles the frame."""

    def forward(self, x: torch.Tensor, n: int = 1) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x) * n


class BranchNet(TinyNet):
    """TinyNet that takes one of two paths by the sign of the batch's mean: a data-dependent
    branch, so Dynamo breaks the graph there and compiles the rest of forward once per branch
    target (a resume function each), the first time that branch is taken."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.mean() > 0:  # noqa: SIM108 (a statement per branch, as the captured run had: its log names the lines)
            x = x * 2.0
        else:
            x = x - 1.0
        return super().forward(x)


class PerBlockNet(TinyNet):
    """Each block compiled on its own (the model's forward stays eager), with an eager
    layer norm between blocks: compiled regions separated by eager aten ops."""

    def __init__(self) -> None:
        super().__init__(block_break=True)
        self.compiled = [torch.compile(b) for b in self.blocks]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.compiled:
            x = nn.functional.layer_norm(block(x), (WIDTH,))
        return self.head(x)


@dataclass(frozen=True)
class Case:
    key: str
    build: Callable[[], nn.Module]  # returns the model, already compiled where it should be
    sched: dict[str, int]
    with_stack: bool
    breaks_per_step: int  # graph breaks per forward, in every captured step
    recompile_steps: tuple[int, ...]  # 0-based trace steps in which a recompile happens
    planted: str
    small_batch_step: int | None = None  # 0-based trace step fed SMALL_LAST_BATCH
    cuda_only: bool = False
    small_batch_from: int | None = None  # 0-based trace step from which every batch is SMALL_LAST_BATCH
    int_argument: bool = False  # forward(x, n) with n = the trace step + 2, a new int every step
    dynamo_config: tuple[tuple[str, int], ...] = ()  # torch._dynamo.config values set first
    negative_from: int | None = None  # 0-based trace step from which the inputs' mean is negative

    def trace_name(self) -> str:
        return f"{file_prefix()}_{self.key}.pt.trace.json.gz"

    def log_name(self) -> str:
        return f"{file_prefix()}_{self.key}.torch_logs.txt"

    def batch_size(self, step: int) -> int:
        """The dynamic-shape cases feed a smaller batch in one step or from one step on."""
        if step == self.small_batch_step or (self.small_batch_from is not None and step >= self.small_batch_from):
            return SMALL_LAST_BATCH
        return BATCH

    def options(self) -> str:
        """The profiler options, for the manifest."""
        return "with_stack=True" if self.with_stack else "defaults (no record_shapes, no stacks)"

    def manifest_planted(self) -> str:
        return (f"{self.summary()} The TORCH_LOGS=\"{TORCH_LOGS}\" stderr of the same run is "
                f"`{self.log_name()}` (paths made checkout-relative).")

    def summary(self) -> str:
        """The planted counts in one line, for the manifest."""
        steps = self.sched["active"]
        breaks = [self.breaks_per_step] * steps
        recompiles = [int(s in self.recompile_steps) for s in range(steps)]
        return (f"graph breaks per step {breaks}, recompiles per step {recompiles} "
                f"(trace steps 0..{steps - 1}); {self.planted}")


def _compiled(model: nn.Module, **options: str) -> nn.Module:
    return torch.compile(model, **options)  # type: ignore[return-value]


CASES: tuple[Case, ...] = (
    Case("compile_nobreak", lambda: _compiled(TinyNet()), COLD, False, 0, (),
         "one graph for the whole forward (torch.compile(model)); step 0 holds the cold "
         "compile (Dynamo, AOT autograd, inductor forward and backward)."),
    Case("compile_break_top", lambda: _compiled(TinyNet(top_break=True)), COLD, False, 1, (),
         "torch._dynamo.graph_break() in TinyNet.forward between the blocks and the head: "
         "two graphs per forward, the second in the resume function "
         "torch_dynamo_resume_in_forward_at_<line>."),
    Case("compile_break_item", lambda: _compiled(TinyNet(item_break=True)), COLD, False, 1, (1,),
         "x.abs().mean().item() in TinyNet.forward before the head: Dynamo breaks on "
         "Tensor.item (capture_scalar_outputs is off by default). The Python float goes into "
         "the resume function, which Dynamo first specializes on (guard `== value`); step 1's "
         "new value fails that guard and recompiles it (1/1) with the float dynamic, so "
         "no later step recompiles."),
    Case("compile_break_loop", PerBlockNet, WARM, True, N_BLOCKS, (),
         f"per-block compile: each of the {N_BLOCKS} blocks is torch.compile'd alone and "
         "calls torch._dynamo.graph_break() in its forward, with an eager layer_norm between "
         "blocks (eager aten ops between regions); compiled in the wait/warm-up steps, "
         "captured with with_stack=True (Python frames incl. resume functions)."),
    Case("compile_recompile", lambda: _compiled(TinyNet()), COLD, False, 0,
         (COLD["active"] - 1,),
         f"dynamic-shape recompile: batches of {BATCH}, then a last batch of "
         f"{SMALL_LAST_BATCH} in the last step (steady part), so Dynamo recompiles the "
         "forward with a dynamic batch dimension (compile id 0/1).",
         small_batch_step=COLD["active"] - 1),
    Case("compile_reduce_overhead",
         lambda: _compiled(TinyNet(), mode="reduce-overhead"), COLD, False, 0, (),
         "mode='reduce-overhead' (CUDA graph trees): the compiled forward and backward "
         "replay CUDA graphs (cudaGraphLaunch) after the first steps.", cuda_only=True),
)
# Steps for the recompile cases: enough steady steps after the recompiles for a median.
LONG = {"wait": 0, "warmup": 0, "active": 7}
RECOMPILE_LIMIT = 2
CASES += (
    Case("compile_loop_skip", lambda: _compiled(LoopBreakNet()), COLD, False, 0, (),
         f"torch._dynamo.graph_break() inside the for loop over {N_BLOCKS} weights in "
         "LoopBreakNet.forward (torch.compile(model)): Dynamo skips the frame (graph break in "
         "a loop), so forward runs eagerly in every step and no Torch-Compiled Region runs; "
         "step 0 holds the compile attempt."),
    Case("compile_recompile_limit", lambda: _compiled(ScaledNet(), dynamic=False), LONG, False, 0, (1,),  # type: ignore[arg-type]
         f"forward(x, n) with a new Python int n every step, compiled with dynamic=False and "
         f"torch._dynamo.config.recompile_limit={RECOMPILE_LIMIT}: step 0 compiles 0/0, step 1 "
         "recompiles (0/1, guard on n), step 2 hits the recompile limit (the log's 'hit "
         "config.recompile_limit') and forward runs eagerly from then on.",
         int_argument=True, dynamo_config=(("recompile_limit", RECOMPILE_LIMIT),)),
    Case("compile_recompile_every", lambda: _compiled(ScaledNet(), dynamic=False), LONG, False, 0,  # type: ignore[arg-type]
         tuple(range(1, LONG["active"])),
         "forward(x, n) with a new Python int n every step, compiled with dynamic=False and "
         "recompile_limit=16: every step recompiles forward (compile ids 0/1..0/6, each after "
         "the guard on n fails).",
         int_argument=True, dynamo_config=(("recompile_limit", 16),)),
    Case("compile_recompile_once", lambda: _compiled(TinyNet()), LONG, False, 0, (2,),
         f"a one-time recompile: batches of {BATCH} in steps 0-1, then {SMALL_LAST_BATCH} from "
         "step 2 on; Dynamo recompiles forward once (0/1, tensor size guard on x) with a "
         "dynamic batch dimension and every later step reuses it.", small_batch_from=2),
    Case("compile_branch_once", lambda: _compiled(BranchNet()), LONG, False, 1, (),
         "`if x.mean() > 0` at the top of BranchNet.forward, inputs shifted by +1 in steps 0-2 and "
         "by -1 from step 3 on: a data-dependent branch, so a graph break every step; step 3 takes "
         "the other branch for the first time and compiles its resume function (a new compile "
         "id, not a recompile of one), once: the later steps reuse it.", negative_from=3),
    Case("compile_item_every", lambda: _compiled(TinyNet(item_break=True), dynamic=False), LONG, False, 1,  # type: ignore[arg-type]
         tuple(range(1, LONG["active"])),
         "x.abs().mean().item() in TinyNet.forward before the head, compiled with dynamic=False: "
         "the float goes into the resume function, whose guard `== value` fails with every "
         "step's new value, so the graph break recompiles the resume function every step "
         "(1/1..1/6; recompile_limit=16).", dynamo_config=(("recompile_limit", 16),)),
)
BY_KEY = {case.key: case for case in CASES}


def available(case: Case) -> bool:
    return not case.cuda_only or device().type == "cuda"


def _train(case: Case, dest: Path) -> None:
    """The case's training loop under the profiler (runs in the child process)."""
    seed_everything()
    torch.use_deterministic_algorithms(False)  # inductor's fallbacks need not be deterministic
    for option, value in case.dynamo_config:
        setattr(torch._dynamo.config, option, value)
    dev = device()
    model = case.build().to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    activities = [ProfilerActivity.CPU]
    if dev.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    sched = case.sched
    skipped = sched["wait"] + sched["warmup"]
    with profile(activities=activities, schedule=schedule(**sched, repeat=1),
                 with_stack=case.with_stack) as prof:
        for i in range(skipped + sched["active"]):
            n = case.batch_size(i - skipped)
            x = torch.randn(n, WIDTH, generator=g).to(dev)
            if case.negative_from is not None:
                x = x + (-1.0 if i - skipped >= case.negative_from else 1.0)
            y = torch.randint(0, NUM_CLASSES, (n,), generator=g).to(dev)
            with record_function("forward"):
                out = model(x, i - skipped + 2) if case.int_argument else model(x)
                loss = nn.functional.cross_entropy(out, y)
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            prof.step()
    export_trace(prof, dest)
    _scrub_cache_dir(dest)


def _relative_log(text: str) -> str:
    """Log lines name user code by absolute path (sometimes cut to a column: ``ork/main/...``)
    and torch by its install path: keep ``scripts/...`` and ``<torch>/...`` so no machine's
    layout is committed."""
    torch_dir = str(Path(torch.__file__).resolve().parent)
    text = text.replace(torch_dir, "<torch>")
    return re.sub(r"[^\s\"']*(?=scripts/gen_traces/)", "", text)


def _scrub_cache_dir(dest: Path) -> None:
    """Python frames of inductor's generated code name the temporary cache directory this
    run used: written as ``<inductor_cache>`` (the only text changed besides export_trace's)."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not cache:
        return
    text = gzip.decompress(dest.read_bytes()).decode("utf-8").replace(cache, "<inductor_cache>")
    with open(dest, "wb") as raw, gzip.GzipFile(
        filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9
    ) as gz:
        gz.write(text.encode("utf-8"))


def make(case: Case, out_dir: Path) -> None:
    """Run ``case`` in a fresh interpreter with TORCH_LOGS on; keep its stderr as the log."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / case.log_name()
    with tempfile.TemporaryDirectory(prefix="compile_traces_") as cache:
        env = {**os.environ, "TORCH_LOGS": TORCH_LOGS, "TORCHINDUCTOR_CACHE_DIR": cache,
               "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--case", case.key,
               "--out", str(out_dir)]
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    log_path.write_text(_relative_log(result.stderr), encoding="utf-8")
    if result.returncode != 0:
        raise RuntimeError(f"{case.key} failed ({result.returncode}); stderr in {log_path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the traces")
    parser.add_argument("--only", nargs="+", choices=sorted(BY_KEY), help="make only these")
    parser.add_argument("--case", choices=sorted(BY_KEY), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:  # child mode, see make()
        case = BY_KEY[args.case]
        _train(case, args.out / case.trace_name())
        return 0
    for case in CASES:
        if args.only and case.key not in args.only:
            continue
        if not available(case):
            print(f"{case.key:<26} skipped: needs CUDA graphs (no GPU here)")
            continue
        make(case, args.out)
        print(f"{case.key:<26} {case.trace_name()}: {case.summary()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
