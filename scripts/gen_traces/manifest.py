"""Facts read back from the written traces (independently of tracewhy) and the
MANIFEST.md that records how each file was made."""

from __future__ import annotations

import gzip
import json
import platform
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from specs import TraceSpec

_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")


@dataclass(frozen=True)
class TraceFacts:
    size_bytes: int
    events: int
    profiler_steps: int
    categories: dict[str, int]
    distributed_info: dict[str, object] | None


def read_facts(path: Path) -> TraceFacts:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    steps = {
        e["name"] for e in events
        if e.get("ph") == "X" and _PROFILER_STEP.match(str(e.get("name", "")))
    }
    categories = Counter(str(e.get("cat", "(none)")) for e in events)
    info = doc.get("distributedInfo")
    return TraceFacts(
        size_bytes=path.stat().st_size,
        events=len(events),
        profiler_steps=len(steps),
        categories=dict(sorted(categories.items())),
        distributed_info=info if isinstance(info, dict) else None,
    )


def _section(spec: TraceSpec, rel_dir: str, out_dir: Path, torch_version: str) -> list[str]:
    lines = [f"## {', '.join(f'`{name}`' for name in spec.files)}", ""]
    lines += [
        f"- made by: `scripts/gen_traces/{spec.function.replace('.', '.py:', 1)}`",
        f"- torch: {torch_version} (CPU build), `torch.profiler`, activities=[CPU]",
        f"- profiler options: {spec.options}",
        f"- schedule: {spec.schedule}",
        f"- planted: {spec.planted}",
    ]
    for name in spec.files:
        path = out_dir / name
        if not path.exists():
            lines.append(f"- `{rel_dir}/{name}`: not generated")
            continue
        facts = read_facts(path)
        cats = ", ".join(f"{c} {n}" for c, n in facts.categories.items())
        lines.append(
            f"- `{name}`: {facts.size_bytes / 1024:.0f} KiB gz, {facts.events} events, "
            f"{facts.profiler_steps} ProfilerSteps; categories: {cats}"
        )
        if facts.distributed_info is not None:
            keys = {k: facts.distributed_info.get(k) for k in ("backend", "rank", "world_size")}
            lines.append(f"  - distributedInfo: {json.dumps(keys, sort_keys=True)}")
    return [*lines, ""]


def write_manifest(
    out_dir: Path, rel_out: str, specs: tuple[TraceSpec, ...], demo: TraceSpec,
    demo_dir: Path | None, rel_demo: str, torch_version: str,
) -> Path:
    lines = [
        "# Generated CPU traces",
        "",
        "Genuine PyTorch profiler (Kineto) traces, written by `torch.profiler` running real "
        "training loops on CPU with the CPU-only build of torch "
        f"{torch_version} (Python {platform.python_version()}). There is no GPU: the files "
        "hold CPU ops, user annotations, Python frames and memory events, but no kernels, "
        "memcpy or CUDA runtime events.",
        "",
        f"Regenerate with `python scripts/gen_traces/make_all.py --out {rel_out} "
        f"--demo {rel_demo}` (each trace is made in its own fresh Python process). Every "
        "loop is seeded and runs on one intra-op thread, so the structure (op names, order, "
        "step count, shapes) repeats run to run; timings do not.",
        "",
        "Post-processing is limited to the framing: the plain JSON that "
        "`prof.export_chrome_trace` writes has its `traceName` (the temporary file's absolute "
        "path) replaced by the file name and any absolute path of the generating checkout "
        "made repo-relative (torch 2.13 already writes Python frames relative to sys.path, so "
        "in practice only `traceName` changes), then is gzipped with mtime 0. No event is "
        "added, dropped or edited; one file's ops get an arg the profiler computed and its "
        "export leaves out (`cpu_flops_attention`: `flops`, as its section says).",
        "",
        "Shared model: `SmallCNN` in `scripts/gen_traces/workloads.py` (Conv2d 3->8, ReLU, "
        "MaxPool, Linear 512->64, ReLU, Linear 64->10), SGD with momentum, batch 16 of "
        "3x16x16 images; each step has `record_function` blocks `forward`, `backward`, "
        "`optimizer`. With `schedule(wait, warmup, active)` the trace holds only the "
        "`active` steps (`ProfilerStep#N` numbering starts at wait + warmup).",
        "",
    ]
    for spec in specs:
        lines += _section(spec, rel_out, out_dir, torch_version)
    if demo_dir is not None:
        lines += _section(demo, rel_demo, demo_dir, torch_version)
    path = out_dir / "MANIFEST.md"
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return path
