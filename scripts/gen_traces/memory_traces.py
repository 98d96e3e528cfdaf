"""Memory inputs: a ``profile_memory=True`` trace of an Adam loop and the same run's
``export_memory_timeline`` in both formats, on CPU; and, on a CUDA machine, real allocator
snapshots (``torch.cuda.memory._dump_snapshot``).

    python scripts/gen_traces/memory_traces.py --out tests/data/generated
    python scripts/gen_traces/memory_traces.py --out DIR --snapshots   # needs a GPU; skips otherwise

Adam keeps two state tensors (exp_avg, exp_avg_sq) per parameter, so the export's
OPTIMIZER_STATE category is twice its PARAMETER category once the first step has run.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import tempfile
from pathlib import Path

import torch
from capture import cpu_profile, export_trace, seed_everything, step_schedule, total_steps
from torch import nn
from workloads import SmallCNN, synthetic_batch, train_step

MEMORY_TRACE = "cpu_adam_memory.pt.trace.json.gz"
#: The timeline exports sit in a folder of their own: they are not profiler traces, and the
#: generated-trace tests read every ``*.json.gz`` beside the traces as one.
TIMELINE = "memory_timeline/cpu_adam_memory_timeline.json.gz"
TIMELINE_RAW = "memory_timeline/cpu_adam_memory_timeline.raw.json.gz"
FILES = (MEMORY_TRACE, TIMELINE, TIMELINE_RAW)
SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}
#: For the TraceSpec in specs.py (the manifest's "profiler options" and "planted" lines).
OPTIONS = ("profile_memory=True, record_shapes=True, with_stack=True; the same profile exported by "
           "export_chrome_trace and export_memory_timeline(device='cpu') as .json.gz and .raw.json.gz")
PLANTED = ("SmallCNN with torch.optim.Adam: the optimizer's state (exp_avg, exp_avg_sq) is created in the "
           "first (wait) step, before the trace, and lives on, so OPTIMIZER_STATE is 2x PARAMETER in the "
           "timeline exports; "
           "activations are freed in backward every step. The same profile's export_memory_timeline(device='cpu') "
           f"is beside it as {TIMELINE} ([times, sizes]) and {TIMELINE_RAW} ((ts, action, bytes, category) rows).")


def make_memory_traces(out_dir: Path) -> None:
    """Profile the Adam loop once and write the trace and both timeline exports."""
    seed_everything()
    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with cpu_profile(schedule=step_schedule(**SCHEDULE), profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
        for _ in range(total_steps(**SCHEDULE)):
            x, y = synthetic_batch(g)
            train_step(model, optimizer, x, y)
            prof.step()
    out_dir.mkdir(parents=True, exist_ok=True)
    export_trace(prof, out_dir / MEMORY_TRACE)
    for name in (TIMELINE, TIMELINE_RAW):
        _export_timeline(prof, out_dir / name)


def _export_timeline(prof: torch.profiler.profile, dest: Path) -> None:
    """``export_memory_timeline`` to a temporary ``.json.gz`` (torch picks the format from the
    suffix), re-gzipped with mtime 0 so the committed bytes do not carry the time of the run."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / dest.name
        prof.export_memory_timeline(str(path), device="cpu")
        data = json.loads(gzip.decompress(path.read_bytes()))
    with open(dest, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                                compresslevel=9) as gz:
        gz.write(json.dumps(data).encode("utf-8"))


def record_cuda_snapshots(out_dir: Path) -> list[Path]:
    """Real allocator snapshots on a CUDA machine: a training step, the same with
    ``expandable_segments``, and an out-of-memory error. Each runs in a fresh process (the
    allocator setting is read once per process). Returns nothing when there is no GPU."""
    if not torch.cuda.is_available():
        print("no CUDA device: snapshots skipped")
        return []
    import subprocess
    import sys
    written = []
    for kind, env in (("train", {}), ("expandable", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
                      ("oom", {})):
        dest = out_dir / f"cuda_snapshot_{kind}.pickle"
        subprocess.run([sys.executable, __file__, "--snapshot-child", kind, "--out", str(dest)],
                       env={**os.environ, **env}, check=True, timeout=300)
        written.append(dest)
    return written


def _snapshot_child(kind: str, dest: Path) -> None:
    """One recorded run: a few Adam steps of an MLP on the GPU; ``oom`` then asks for more
    memory than the device has, so the snapshot holds an OOM event."""
    seed_everything()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        x = torch.randn(256, 1024, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if kind == "oom":
        with contextlib.suppress(torch.OutOfMemoryError):
            torch.empty(torch.cuda.get_device_properties(0).total_memory * 2, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(str(dest))
    torch.cuda.memory._record_memory_history(enabled=None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory (or snapshot file, child mode)")
    parser.add_argument("--snapshots", action="store_true", help="record CUDA snapshots instead (needs a GPU)")
    parser.add_argument("--snapshot-child", choices=("train", "expandable", "oom"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.snapshot_child:
        _snapshot_child(args.snapshot_child, args.out)
    elif args.snapshots:
        args.out.mkdir(parents=True, exist_ok=True)
        record_cuda_snapshots(args.out)
    else:
        make_memory_traces(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
