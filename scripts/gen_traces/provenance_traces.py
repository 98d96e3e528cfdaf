"""A ``torch.compile`` (inductor, CPU C++ codegen) inference loop with one slow source line
planted among cheap ones, captured with ``with_stack=True`` and, from the same run, the
``TORCH_TRACE`` directory and the ``TORCH_LOGS=output_code`` stderr: what
``tracewhy lines TRACE --logs ...`` needs to put each compiled kernel's time on its lines.

    python scripts/gen_traces/provenance_traces.py --out tests/data/generated

The run happens in a fresh interpreter (Dynamo's caches and the log set-up are per process)
with inductor's caches off, so the graph compiles and its output code is logged. The forward
is compiled in the wait/warm-up steps, outside the trace. The planted line is
``PlantedNet.forward``'s broadcast ``sin``/``cos`` and sum over a [batch, TABLE_ROWS, WIDTH]
product (line ``SLOW_LINE`` of this file): about TABLE_ROWS times the elementwise work of every
other line; the matmuls between lines keep inductor from fusing it with its neighbours.
"""

from __future__ import annotations

import argparse
import gzip
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from capture import REPO_ROOT, export_trace, seed_everything
from compile_traces import _relative_log, _scrub_cache_dir
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

WIDTH = 64
TABLE_ROWS = 64
BATCH = 32
SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}
OPTIONS = "with_stack=True"
TRACE_FILE = "cpu_provenance.pt.trace.json.gz"
LOG_FILE = "cpu_provenance.output_code.txt.gz"
TORCH_TRACE_FILE = "cpu_provenance.torch_trace.log.gz"
warnings.filterwarnings("ignore", message="Profiler won't be using warmup")


class PlantedNet(nn.Module):
    """Matmuls between short lines; one line does TABLE_ROWS times the elementwise work."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH**0.5)
        self.w2 = nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH**0.5)
        self.table = nn.Parameter(torch.randn(1, TABLE_ROWS, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x @ self.w1) + 1.0
        s = (h.unsqueeze(1) * self.table).sin().cos().sum(1)  # the planted slow line
        t = torch.tanh(s @ self.w2)
        return t * 0.5 + torch.sigmoid(t)


SLOW_LINE = next(n for n, text in enumerate(inspect.getsource(PlantedNet).splitlines(),
                                              inspect.getsourcelines(PlantedNet)[1])
                 if "planted slow line" in text)
PLANTED = (f"PlantedNet.forward in scripts/gen_traces/provenance_traces.py, line {SLOW_LINE}: a "
           f"broadcast sin/cos and sum over [{BATCH}, {TABLE_ROWS}, {WIDTH}], {TABLE_ROWS}x the "
           "elementwise work of each other line; inference under torch.no_grad, compiled "
           "(inductor, C++) in the wait/warm-up steps, INDUCTOR_PROVENANCE=1. Beside it, from the same "
           f"run: `{LOG_FILE}` (TORCH_LOGS=output_code stderr) and `{TORCH_TRACE_FILE}` (the "
           "TORCH_TRACE directory's one log), paths made checkout-relative.")


def _run(dest: Path) -> None:
    """The inference loop under the profiler (runs in the child process)."""
    seed_everything()
    torch.use_deterministic_algorithms(False)
    model = torch.compile(PlantedNet())
    g = torch.Generator().manual_seed(0)
    skipped = SCHEDULE["wait"] + SCHEDULE["warmup"]
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], schedule=schedule(**SCHEDULE, repeat=1),
                                  with_stack=True) as prof:
        for _ in range(skipped + SCHEDULE["active"]):
            model(torch.randn(BATCH, WIDTH, generator=g))
            prof.step()
    export_trace(prof, dest)
    _scrub_cache_dir(dest)


def _scrubbed(text: str, cache: str, trace_dir: str) -> str:
    """No path of this machine: the cache, the trace directory, torch's and its site-packages'
    install paths (inductor's config dump names them) and the checkout become placeholders."""
    site_packages = str(Path(torch.__file__).resolve().parent.parent)
    text = _relative_log(text.replace(cache, "<inductor_cache>").replace(trace_dir, "<torch_trace>"))
    return text.replace(site_packages, "<site-packages>").replace(str(REPO_ROOT) + os.sep, "")


def _gz(text: str, dest: Path) -> None:
    with open(dest, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                                compresslevel=9) as gz:
        gz.write(text.encode("utf-8"))


def _pack_torch_trace(trace_dir: Path, cache: str, dest: Path) -> None:
    """The TORCH_TRACE directory's one log (one process ran), paths scrubbed, gzipped."""
    (log,) = sorted(trace_dir.iterdir())
    _gz(_scrubbed(log.read_text(encoding="utf-8"), cache, str(trace_dir)), dest)


def make(out_dir: Path) -> None:
    """Run the loop in a fresh interpreter with TORCH_LOGS=output_code and TORCH_TRACE on."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="provenance_") as tmp:
        cache, trace_dir = Path(tmp) / "cache", Path(tmp) / "torch_trace"
        # INDUCTOR_PROVENANCE=1: TORCH_TRACE then maps each kernel to the FX nodes it fuses (C++
        # kernels are named nowhere else); TORCH_LOGS=output_code is the plain-text route.
        env = {**os.environ, "TORCH_LOGS": "output_code", "TORCH_TRACE": str(trace_dir), "INDUCTOR_PROVENANCE": "1",
               "TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--out", str(out_dir)]
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            raise RuntimeError(f"provenance trace failed ({result.returncode}): {result.stderr[-2000:]}")
        _gz(_scrubbed(result.stderr, str(cache), str(trace_dir)), out_dir / LOG_FILE)
        _pack_torch_trace(trace_dir, str(cache), out_dir / TORCH_TRACE_FILE)
        shutil.rmtree(cache, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the files")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # see make()
        _run(args.out / TRACE_FILE)
        return 0
    make(args.out)
    print(f"{TRACE_FILE}: {PLANTED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
