"""Every real Kineto trace in ../shared/traces loads, and its numbers match sums computed here,
independently, from the raw JSON with the standard library (exact decimals, no msgspec)."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import tracewhy
from conftest import TRACES, shared_trace
from tracewhy.analyses.kernels import kernels
from tracewhy.analyses.steps import MARKED, steps
from tracewhy.model import Col, Kind

# Files in the Kineto folders that are not Kineto profiler traces (their MANIFESTs say so).
NOT_KINETO = {
    "hta/a100_torch_add_chakra_execution_trace_et.json.gz",  # Chakra execution trace
    "hta/torch_memory_timeline_raw.json.gz",  # export_memory_timeline rows
    "hta/hta_reference_outputs.json",
    "kineto/tbplugin_test_gpu_metrics_expected.json.gz",  # tb_plugin's output, not a trace
}
FOLDERS = ("hta", "kineto", "tracelens", "perfdigest")


def _kineto_files() -> list[str]:
    if not TRACES.is_dir():
        return ["hta/legacy_2022_inference_rank1_tiny.json.gz"]  # shared_trace() skips or fails
    out = []
    for folder in FOLDERS:
        for p in sorted((TRACES / folder).glob("*.json*")):
            rel = f"{folder}/{p.name}"
            if rel not in NOT_KINETO and "reference_outputs" not in p.name:
                out.append(rel)
    return out


def _raw(path: Path) -> dict[str, Any]:
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    doc = json.loads(data, parse_float=Decimal)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


def _us_to_ns(value: Any) -> int:
    return int((Decimal(value) * 1000).to_integral_value())


def _number(value: Any) -> int:
    """A pid or tid as a number: Kineto wrote some as text ("stream 7" in 2021 traces)."""
    if isinstance(value, int):
        return value
    last = str(value).split(" ")[-1]
    return int(last) if last.isdigit() else -1


STEP = re.compile(r"^ProfilerStep#\d+$")
#: A flow's kind by its category, as PyTorch versions wrote it (any other category: "other").
FLOW_KIND = {"ac2g": "correlation", "async": "correlation", "async_gpu": "correlation",
             "async_cpu_to_gpu": "correlation", "fwdbwd": "fwdbwd"}


@pytest.mark.parametrize("rel", _kineto_files())
def test_real_trace_matches_raw_sums(rel: str) -> None:
    path = shared_trace(rel)
    raw = _raw(path)
    events = [e for e in raw["traceEvents"] if isinstance(e, dict)]
    kernel_events = [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"]
    expected_time = sum(_us_to_ns(e["dur"]) for e in kernel_events)
    step_names = {
        e["name"] for e in events
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in ("cpu_op", "operator", "user_annotation")
        and STEP.match(str(e.get("name", "")))
    }
    launch_corr = {
        e["args"]["correlation"] for e in events
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in ("cuda_runtime", "runtime", "cuda_driver")
        and isinstance(e.get("args"), dict) and "correlation" in e["args"]
    }
    linkable = sum(1 for e in kernel_events if (e.get("args") or {}).get("correlation") in launch_corr)
    memory = sum(1 for e in events if e.get("ph") in ("i", "I") and e.get("name") == "[memory]")
    flow_events = [e for e in events if e.get("ph") in ("s", "t", "f")]
    flows = Counter((FLOW_KIND.get(e.get("cat") or "", "other"), e["ph"], e["id"], _number(e["pid"]), _number(e["tid"]))
                    for e in flow_events)
    flow_starts = sorted(_us_to_ns(e["ts"]) for e in flow_events)

    trace = tracewhy.load(path)
    trace.check()
    k = kernels(trace)
    assert k.total_count == len(kernel_events)
    assert k.total_time_ns == expected_time
    found = steps(trace)
    if found.source == MARKED:  # (without markers, the loop's iterations: tests/test_loop_iterations.py)
        assert found.table.height == len(step_names)
    else:
        assert not step_names and found.table.height >= 1
    linked = trace.of_kind(Kind.KERNEL).get_column(Col.LAUNCH).is_not_null().sum()
    assert linked == linkable
    assert trace.memory.height == memory
    # Every flow arrow with its kind, phase, id and thread; their starts (sorted, each within the
    # float64 step the reader reports for fractional epoch times, else exact).
    assert Counter(trace.flows.select(pl.col("kind").cast(pl.String), pl.col("phase").cast(pl.String), "flow_id",
                                      "pid", "tid").iter_rows()) == flows
    starts = sorted(trace.flows.get_column("ts_ns").to_list())
    assert all(abs(a - b) <= trace.meta.ts_step_ns for a, b in zip(starts, flow_starts, strict=True))
    assert not trace.meta.warnings or all("open when the profiler stopped" in w for w in trace.meta.warnings)


def test_display_time_unit_ns_still_means_microseconds() -> None:
    # The file says displayTimeUnit "ns" but its values are microseconds (hta MANIFEST). Were
    # they nanoseconds, five ResNet training steps with 4350 kernels would last under a
    # millisecond in total; as microseconds each ProfilerStep lasts tens of milliseconds, and
    # the 1.28 "unit" DtoD copy of 256 bytes takes 1.28 µs, a plausible V100 figure.
    trace = tracewhy.load(shared_trace("hta/v100_rank0_displayTimeUnit_ns_fractional_us.json.gz"))
    assert trace.meta.display_time_unit == "ns"
    steps_table = steps(trace).table
    assert steps_table.height == 5
    assert steps_table.get_column("dur_ns").min() > 10_000_000  # > 10 ms per step
    copies = trace.of_kind(Kind.MEMCPY).join(trace.copy_attrs, on=Col.ID)
    small = copies.filter((pl.col("bytes") == 256) & (pl.col(Col.DUR) == 1280))
    assert small.height >= 1


def test_fractional_epoch_microseconds_keep_submicrosecond_digits() -> None:
    # 1712195495505543.2 µs: float64 holds ...543.25 at this magnitude, so the first kernel
    # launch must land within 0.25 µs of the text and keep a sub-microsecond part; a naive
    # ts * 1000 in float64 would be off by up to 128 ns in a different way.
    path = shared_trace("hta/v100_rank0_displayTimeUnit_ns_fractional_us.json.gz")
    raw = _raw(path)
    first = next(e for e in raw["traceEvents"] if e.get("cat") == "cuda_runtime")
    trace = tracewhy.load(path)
    row = trace.slices.filter(
        (pl.col(Col.CORRELATION) == first["args"]["correlation"]) & (pl.col(Col.KIND) == "runtime")
    ).row(0, named=True)
    assert abs(row[Col.TS] - _us_to_ns(first["ts"])) <= 250
    assert row[Col.DUR] == _us_to_ns(first["dur"])


def test_legacy_integer_epoch_microseconds_are_exact() -> None:
    # PyTorch <= 2.3 wrote integer epoch microseconds: conversion must be exact to the ns.
    path = shared_trace("hta/legacy_2022_inference_rank1_tiny.json.gz")
    raw = _raw(path)
    kernel = next(e for e in raw["traceEvents"] if e.get("cat") == "Kernel")
    trace = tracewhy.load(path)
    k = trace.of_kind(Kind.KERNEL).filter(pl.col(Col.CORRELATION) == kernel["args"]["correlation"])
    assert k.get_column(Col.TS).item() == int(kernel["ts"]) * 1000
    assert trace.meta.distributed == {"rank": 1}
    assert trace.meta.rank == 1 and trace.meta.world_size is None


def test_rocm_runtime_string_args_still_link() -> None:
    # roctracer writes "stream": "0x0" and "size": "2560" as strings on hip* runtime calls;
    # the launch must still link by correlation (14 kernels, each launched by a hip call).
    trace = tracewhy.load(shared_trace("hta/mi250_minitoy_train_rocm6.2.json.gz"))
    k = trace.of_kind(Kind.KERNEL)
    assert k.height == 14 and k.get_column(Col.LAUNCH).is_not_null().all()
    launch_names = trace.slices.get_column(Col.NAME).gather(k.get_column(Col.LAUNCH)).cast(pl.String)
    assert all(n.startswith("hip") for n in launch_names.to_list())


def test_cpu_only_trace_has_no_gpu_rows() -> None:
    trace = tracewhy.load(shared_trace("hta/cpu_only_gloo_rank34of300.json.gz"))
    kinds = set(trace.slices.get_column(Col.KIND).cast(pl.String).to_list())
    assert kinds <= {"cpu_op", "annotation"}
    assert trace.devices.height == 0
    assert (trace.meta.rank, trace.meta.world_size) == (34, 300)


def test_cupti_range_profiler_counters_are_not_kernels() -> None:
    # Range-profiler mode records cuda_profiler_range rows (77) and no kernel activity: kernel
    # time is genuinely unknown there, not zero work.
    trace = tracewhy.load(shared_trace("hta/a100_cupti_profiler_counters.json.gz"))
    assert trace.of_kind(Kind.KERNEL).height == 0
    assert trace.of_kind(Kind.PROFILER_RANGE).height == 77


def test_header_capture_flags_and_versions() -> None:
    trace = tracewhy.load(shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz"))
    c = trace.meta.capture
    assert c.source == "header"
    assert (c.record_shapes, c.profile_memory, c.with_stack, c.with_flops, c.with_modules) == (True,) * 5
    assert trace.meta.versions["cuda_runtime_version"] == "12040"
    assert trace.meta.base_time_ns == 1751410836000000000
    assert trace.devices.get_column("name").to_list() == ["NVIDIA H100 80GB HBM3"]


def test_legacy_capture_flags_are_inferred() -> None:
    # 2021 tb_plugin sample: no header flags; shapes ("Input Dims"), memory events and the
    # legacy "Call stack" strings are in the events.
    trace = tracewhy.load(shared_trace("kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"))
    c = trace.meta.capture
    assert c.source == "inferred"
    assert (c.record_shapes, c.profile_memory, c.with_stack) == (True, True, True)


def test_copy_attributes_parsed_from_names() -> None:
    trace = tracewhy.load(shared_trace("kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"))
    copies = trace.copy_attrs.join(trace.slices.select(Col.ID, Col.NAME, Col.KIND), on=Col.ID)
    htod = copies.filter(pl.col(Col.NAME).cast(pl.String) == "Memcpy HtoD (Pageable -> Device)")
    assert htod.height > 0
    assert set(htod.get_column("copy_kind").cast(pl.String)) == {"HtoD"}
    assert set(htod.get_column("src_mem").cast(pl.String)) == {"Pageable"}
    assert set(htod.get_column("dst_mem").cast(pl.String)) == {"Device"}
