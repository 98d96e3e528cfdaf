"""Profiler set-up shared by every generator: seeding, the step schedule, and writing a
trace as a reproducible, path-free ``.json.gz``."""

from __future__ import annotations

import gzip
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, schedule

REPO_ROOT = Path(__file__).resolve().parents[2]
SEED = 1234
# One intra-op thread: op order and thread ids stay the same run to run, and the two DDP
# ranks do not fight over the machine's cores.
NUM_THREADS = 1


def seed_everything(seed: int = SEED) -> None:
    """Seed every RNG a training loop here touches and pin the thread count."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(NUM_THREADS)
    torch.use_deterministic_algorithms(True)


def step_schedule(*, wait: int = 1, warmup: int = 1, active: int = 5) -> schedule:
    """One profiling cycle (``repeat=1``): the trace holds exactly ``active`` ProfilerSteps."""
    return schedule(wait=wait, warmup=warmup, active=active, repeat=1)


def total_steps(*, wait: int = 1, warmup: int = 1, active: int = 5) -> int:
    """Loop iterations needed to run one whole cycle of ``step_schedule``."""
    return wait + warmup + active


def cpu_profile(**options: object) -> profile:
    """A CPU-only ``torch.profiler.profile`` with the given keyword options."""
    return profile(activities=[ProfilerActivity.CPU], **options)  # type: ignore[arg-type]


def export_trace(prof: profile, dest: Path) -> Path:
    """Write ``prof``'s trace to ``dest`` (``*.json.gz``), byte-reproducible in its framing.

    torch 2.13 can gzip by itself (``export_chrome_trace("x.json.gz")``), but it stamps the
    gzip header with the current time and records the temporary file's absolute path as
    ``traceName``. So the JSON is exported plain, then two strings are rewritten before
    gzipping with mtime 0: ``traceName`` becomes the file's own name, and the absolute path of
    this checkout (in Python frame names of ``with_stack`` traces) becomes repo-relative.
    Nothing else in the exported text is touched.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(plain))
        text = plain.read_text(encoding="utf-8")
        tmp_name = str(plain)
    text = text.replace(f'"traceName": "{tmp_name}"', f'"traceName": "{dest.name}"')
    text = text.replace(str(REPO_ROOT) + os.sep, "")
    with open(dest, "wb") as raw, gzip.GzipFile(
        filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9
    ) as gz:
        gz.write(text.encode("utf-8"))
    return dest
