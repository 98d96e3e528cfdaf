"""The tables the --json payloads declare by their polars schemas (beyond test_result_schemas'
modules) have exactly those schemas on real inputs: names, order and dtypes. The JSON Schema
check sees only JSON types; here an Int32 declared Int64, or a column in another place, fails."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Final

import polars as pl
import pytest

import tracewhy
from conftest import GENERATED, shared_trace
from test_memory import build_snapshot

GPU: Final = "hta/a100_ddp2_rank0_nccl2.17.json.gz"


@cache
def _gpu() -> tracewhy.Trace:
    return tracewhy.load(shared_trace(GPU))


def _nvtx() -> tuple[pl.DataFrame, pl.Schema]:
    from tracewhy.analyses.nvtx_ranges import NVTX_RANGES_SCHEMA, nvtx_ranges

    return nvtx_ranges(_gpu()).table, NVTX_RANGES_SCHEMA


def _utilization() -> list[tuple[pl.DataFrame, pl.Schema]]:
    from tracewhy.analyses.utilization import UTILIZATION_DEVICES_SCHEMA, UTILIZATION_SERIES_SCHEMA, utilization

    u = utilization(_gpu())
    return [(u.devices, UTILIZATION_DEVICES_SCHEMA), (u.series, UTILIZATION_SERIES_SCHEMA)]


def _diff() -> list[tuple[pl.DataFrame, pl.Schema]]:
    from tracewhy.analyses.diff import DELTAS_SCHEMA, OP_DELTAS_SCHEMA, diff

    trace = tracewhy.load(GENERATED / "cpu_slow_step_base.pt.trace.json.gz")
    d = diff(trace, tracewhy.load(GENERATED / "cpu_slow_step_planted.pt.trace.json.gz"))
    return [(d.ops, OP_DELTAS_SCHEMA), (d.annotations, DELTAS_SCHEMA), (d.kernels, DELTAS_SCHEMA)]


def _log_blocks() -> tuple[pl.DataFrame, pl.Schema]:
    from tracewhy.analyses.log_blocks import LOG_BLOCKS_TABLE_SCHEMA, log_blocks
    from tracewhy.readers.registry import read_stage_logs

    return log_blocks(read_stage_logs([GENERATED / "pipeline" / "d1"])).table, LOG_BLOCKS_TABLE_SCHEMA


def _memory() -> list[tuple[pl.DataFrame, pl.Schema]]:
    from tracewhy.analyses.memory import CHURN_SCHEMA, TOP_OPS_SCHEMA, analyze_memory

    r = analyze_memory(tracewhy.load(GENERATED / "cpu_adam_memory.pt.trace.json.gz"))
    return [(r.top_ops, TOP_OPS_SCHEMA), *((d.steps, CHURN_SCHEMA) for d in r.devices)]


def _snapshot(tmp: Path) -> list[tuple[pl.DataFrame, pl.Schema]]:
    from tracewhy.analyses.memory_snapshot import LIVE_SCHEMA, OOMS_SCHEMA, analyze_snapshot
    from tracewhy.readers.registry import read_memory_snapshot

    path = tmp / "snap.pickle"
    path.write_bytes(pickle.dumps(build_snapshot(oom=True), protocol=4))
    r = analyze_snapshot(read_memory_snapshot(path))
    return [t for d in r.devices for t in ((d.live_at_peak, LIVE_SCHEMA), (d.ooms, OOMS_SCHEMA))]


def _compile() -> list[tuple[pl.DataFrame, pl.Schema]]:
    from tracewhy.analyses.compile import (
        BREAKS_SCHEMA,
        COMPILE_STEPS_SCHEMA,
        RECOMPILES_SCHEMA,
        REGIONS_SCHEMA,
        compile_analysis,
    )
    from tracewhy.analyses.steps import steps
    from tracewhy.analyses.torch_logs import JOIN_SCHEMA, join_regions
    from tracewhy.model.torch_logs import BREAK_SCHEMA, RECOMPILE_SCHEMA
    from tracewhy.readers.registry import read_compile_logs

    stem = GENERATED / "cpu_compile_recompile"
    trace = tracewhy.load(Path(f"{stem}.pt.trace.json.gz"))
    r = compile_analysis(trace, steps(trace))
    logs = read_compile_logs(Path(f"{stem}.torch_logs.txt"))
    return [(r.per_step, COMPILE_STEPS_SCHEMA), (r.regions, REGIONS_SCHEMA), (r.recompiles, RECOMPILES_SCHEMA),
            (r.breaks, BREAKS_SCHEMA), (logs.breaks, BREAK_SCHEMA), (logs.recompiles, RECOMPILE_SCHEMA),
            (join_regions(r.regions, logs), pl.Schema({**REGIONS_SCHEMA, **JOIN_SCHEMA}))]


def _ranks() -> list[tuple[pl.DataFrame, pl.Schema]]:
    from tracewhy.analyses.rank_compare import (
        DOING_SCHEMA,
        LATENESS_SCHEMA,
        MATCHED_SCHEMA,
        MISMATCHES_SCHEMA,
        RANKS_SCHEMA,
    )
    from tracewhy.reports.ranks import ranks_report

    files = [str(GENERATED / f"ddp_gloo_rank{r}.pt.trace.json.gz") for r in (0, 1)]
    r = ranks_report(files, workers=0).result
    return [(r.ranks, RANKS_SCHEMA), (r.matched, MATCHED_SCHEMA), (r.lateness, LATENESS_SCHEMA),
            (r.mismatches, MISMATCHES_SCHEMA), (r.doing, DOING_SCHEMA)]


def _roofline() -> list[tuple[pl.DataFrame, pl.Schema]]:
    from tracewhy.analyses.roofline import RULES_SCHEMA, STALLS_SCHEMA
    from tracewhy.findings.roofline import KERNEL_VERDICTS_SCHEMA, LAUNCH_VERDICTS_SCHEMA, roofline
    from tracewhy.findings.roofline_ops import OP_ROOFLINE_SCHEMA, op_roofline
    from tracewhy.readers.registry import read_kernel_metrics

    r = roofline(read_kernel_metrics(shared_trace("ncu/csv_rtx5070_olajide/gemm_naive.csv")))
    ops = op_roofline(tracewhy.load(shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz")))
    return [(r.launches, LAUNCH_VERDICTS_SCHEMA), (r.kernels, KERNEL_VERDICTS_SCHEMA), (r.rules, RULES_SCHEMA),
            (r.stalls, STALLS_SCHEMA), (ops.ops, OP_ROOFLINE_SCHEMA)]


def _pipeline() -> tuple[pl.DataFrame, pl.Schema]:
    from tracewhy.analyses.pipeline import CHUNKS_SCHEMA, DEFAULT_SPEC, pipeline
    from tracewhy.readers.registry import read_stage_logs

    chunks = pipeline(read_stage_logs([GENERATED / "pipeline" / "d1"]), DEFAULT_SPEC, 2).chunks
    stages = {f"{s.name}_ns": pl.Int64() for s in DEFAULT_SPEC.stages}  # the stage columns follow the period
    names = list(CHUNKS_SCHEMA)
    return chunks, pl.Schema({**{c: CHUNKS_SCHEMA[c] for c in names[:2]}, **stages,
                              **{c: CHUNKS_SCHEMA[c] for c in names[2:]}})


CASES: Final[dict[str, Callable[[Path], list[tuple[pl.DataFrame, pl.Schema]]]]] = {
    "nvtx ranges": lambda _: [_nvtx()],
    "utilization": lambda _: _utilization(),
    "diff": lambda _: _diff(),
    "log blocks": lambda _: [_log_blocks()],
    "memory": lambda _: _memory(),
    "snapshot": _snapshot,
    "compile": lambda _: _compile(),
    "ranks": lambda _: _ranks(),
    "roofline": lambda _: _roofline(),
    "pipeline": lambda _: [_pipeline()],
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_declared_table_has_its_schema(name: str, tmp_path: Path) -> None:
    tables = CASES[name](tmp_path)
    assert tables
    for table, declared in tables:
        assert table.schema == declared, (name, [c for c in table.columns if table.schema.get(c) != declared.get(c)])
    assert any(t.height for t, _ in tables), f"{name}: every table empty, the check would be vacuous"
