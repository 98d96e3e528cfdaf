"""What the Python API tests share: a command's ``--json`` document (run in process, once per
arguments), an API table as the command's JSON writes it (its times back on the trace's clock),
and one result of every API function on real inputs (made once per test session)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
from collections.abc import Callable
from typing import Any

import polars as pl

import tracewhy as tw
from conftest import GENERATED, shared_trace
from tracewhy.api import RAW_SUFFIX

A100 = "hta/a100_ddp2_rank0_nccl2.17.json.gz"  # 8 A100s, NCCL, 3 ProfilerSteps, annotations
NCU_CSV = "ncu/csv_rtx5070_olajide/saxpy.csv"  # an ncu CSV export (no optional extra needed)
LINES = GENERATED / "cpu_lines_sleep.pt.trace.json.gz"
COMPILE = GENERATED / "cpu_compile_break_loop"
MEMORY = GENERATED / "cpu_adam_memory.pt.trace.json.gz"
TIMELINE = GENERATED / "memory_timeline" / "cpu_adam_memory_timeline.json.gz"
DIFF = (GENERATED / "cpu_slow_step_base.pt.trace.json.gz", GENERATED / "cpu_slow_step_planted.pt.trace.json.gz")
RANKS = (GENERATED / "ddp_gloo_rank0.pt.trace.json.gz", GENERATED / "ddp_gloo_rank1.pt.trace.json.gz")
LOGS = GENERATED / "pipeline" / "d1"


@functools.cache
def cli_json(*argv: str) -> dict[str, Any]:
    """``tracewhy ARGV --json``'s document, run in this process (status 0 or 1, a failed gate)."""
    from tracewhy.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--json"])
    assert code in (0, 1), f"tracewhy {' '.join(argv)} exited {code}"
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def as_cli(table: pl.DataFrame) -> list[dict[str, Any]]:
    """``table``'s rows as the command's JSON writes them: each time column back on the trace's
    clock (its ``*_raw_ns`` twin's values), the twins dropped, keys sorted."""
    raw = [c for c in table.columns if c.endswith(RAW_SUFFIX)]
    back = table.with_columns(pl.col(c).alias(c.removesuffix(RAW_SUFFIX) + "_ns") for c in raw).drop(raw)
    rows: list[dict[str, Any]] = json.loads(back.write_json())
    return [dict(sorted(r.items())) for r in rows]


def same_rows(api: list[dict[str, Any]], cli: list[dict[str, Any]], *, must_share: tuple[str, ...]) -> None:
    """The rows agree on every key both have, and both have ``must_share``."""
    assert len(api) == len(cli) > 0
    for a, c in zip(api, cli, strict=True):
        shared = set(a) & set(c)
        assert set(must_share) <= shared, set(must_share) - shared
        assert {k: a[k] for k in shared} == {k: c[k] for k in shared}


@functools.cache
def a100() -> tw.Trace:
    return tw.load(shared_trace(A100))


#: One call of every API function that returns a result with rows, on an input where it has rows.
CALLS: dict[str, Callable[[], Any]] = {
    "diagnose": lambda: tw.diagnose(a100()),
    "steps": lambda: tw.steps(a100()),
    "gaps": lambda: tw.gaps(a100()),
    "kernels": lambda: tw.kernels(a100()),
    "ops": lambda: tw.ops(a100()),
    "overlap": lambda: tw.overlap(a100()),
    "blocks": lambda: tw.blocks(a100()),
    "blocks log": lambda: tw.blocks(LOGS),
    "nvtx": lambda: tw.nvtx(a100()),
    "info": lambda: tw.info(a100()),
    "lines": lambda: tw.lines(LINES),
    "critical_path": lambda: tw.critical_path(a100()),
    "compile": lambda: tw.compile(f"{COMPILE}.pt.trace.json.gz", logs=f"{COMPILE}.torch_logs.txt"),
    "memory trace": lambda: tw.memory(MEMORY),
    "memory timeline": lambda: tw.memory(TIMELINE),
    "nsys_stats": lambda: tw.nsys_stats(a100()),
    "diff": lambda: tw.diff(*DIFF),
    "check": lambda: tw.check(a100(), max_gpu_idle="50%", max_step_p50="1s"),
    "ranks": lambda: tw.ranks(*RANKS, workers=0),
    "pipeline": lambda: tw.pipeline(LOGS),
    "roofline": lambda: tw.roofline(shared_trace(NCU_CSV)),
    "which": lambda: tw.which(),
}


@functools.cache
def result(name: str) -> Any:
    return CALLS[name]()
