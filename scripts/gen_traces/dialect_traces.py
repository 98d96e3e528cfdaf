"""Traces in the other dialects torch writes: ``export_chrome_trace(path, use_python_export=True)``.

torch 2.13's Python exporter (``torch/profiler/_chrome_trace_export.py``) writes every activity
as a ``"ph": "X"`` slice, the ``[memory]`` instants (cat ``cpu_instant_event``) included, with a
meaningless ``dur`` and ``"finished": false`` in their args.

    python scripts/gen_traces/dialect_traces.py --out tests/data/generated
"""

from __future__ import annotations

import argparse
import gzip
import os
import tempfile
from pathlib import Path

import torch
from capture import REPO_ROOT, cpu_profile, seed_everything, step_schedule, total_steps
from workloads import make_model, synthetic_batch, train_step

PYTHON_EXPORT_MEMORY = "cpu_python_export_memory.pt.trace.json.gz"
SCHEDULE = {"wait": 1, "warmup": 1, "active": 2}
#: For the TraceSpec in specs.py (the manifest's "profiler options" and "planted" lines).
OPTIONS = "profile_memory=True; written by export_chrome_trace(path, use_python_export=True)"
PLANTED = ("the Python exporter's dialect: every activity is a \"ph\": \"X\" slice, the [memory] instants "
           "(cat cpu_instant_event) included, each with a meaningless dur and \"finished\": false. They are "
           "instants: a reader must give one memory event each and no open slice.")


def make_python_export_memory(dest: Path) -> None:
    """The SmallCNN loop with profile_memory=True, exported by the Python exporter."""
    seed_everything()
    model, optimizer = make_model()
    g = torch.Generator().manual_seed(0)
    with cpu_profile(schedule=step_schedule(**SCHEDULE), profile_memory=True) as prof:
        for _ in range(total_steps(**SCHEDULE)):
            x, y = synthetic_batch(g)
            train_step(model, optimizer, x, y)
            prof.step()
    _export_python(prof, dest)


def _export_python(prof: torch.profiler.profile, dest: Path) -> Path:
    """As ``capture.export_trace``, through ``use_python_export=True``: the temporary file's
    name in ``traceName`` and this checkout's absolute path become relative; gzip mtime 0."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(plain), use_python_export=True)
        text = plain.read_text(encoding="utf-8")
        tmp_name = str(plain)
    for quoted in (f'"traceName": "{tmp_name}"', f'"traceName":"{tmp_name}"'):
        text = text.replace(quoted, f'"traceName": "{dest.name}"')
    text = text.replace(str(REPO_ROOT) + os.sep, "")
    assert tmp_name not in text and str(REPO_ROOT) not in text, "an absolute path is left in the trace"
    with open(dest, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                                compresslevel=9) as gz:
        gz.write(text.encode("utf-8"))
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the traces")
    args = parser.parse_args(argv)
    make_python_export_memory(args.out / PYTHON_EXPORT_MEMORY)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
