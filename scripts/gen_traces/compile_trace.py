"""A ``torch.compile`` (inductor, CPU C++ codegen) training loop whose first profiled
steps include the compilation itself."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from workloads import make_model, synthetic_batch, train_step

# wait=0, warmup=0: the first call (Dynamo tracing + inductor codegen + gcc) lands in the
# first recorded step, which is what a steady-window analysis must learn to exclude.
SCHEDULE = {"wait": 0, "warmup": 0, "active": 8}
BACKEND = "inductor"
# torch warns that warmup=0 skews the first step; here that skew is part of what is recorded.
warnings.filterwarnings("ignore", message="Profiler won't be using warmup")


def make_compile(dest: Path) -> None:
    seed_everything()
    torch.use_deterministic_algorithms(False)  # inductor's fallbacks need not be deterministic
    torch._dynamo.reset()
    model, optimizer = make_model()
    compiled = torch.compile(model, backend=BACKEND)
    g = torch.Generator().manual_seed(0)
    with cpu_profile(schedule=step_schedule(**SCHEDULE), record_shapes=True) as prof:
        for _ in range(total_steps(**SCHEDULE)):
            x, y = synthetic_batch(g)
            train_step(compiled, optimizer, x, y)
            prof.step()
    export_trace(prof, dest)
