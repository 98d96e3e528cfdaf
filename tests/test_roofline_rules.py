"""Which ncu rule leads a verdict, which clock the roofline uses, and the peak table's parts.

The rule a verdict leads with is checked against the rule results read straight from the
reports with ncu_report; the roofline's clock against the report's raw per-cycle metrics and
clocks (ncu's own roofline formula); the peak table against the datasheet figures cited in
``analyses/peaks.py``; the low-clock note against the clocks each report measured.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from conftest import shared_trace
from test_ncu_csv import DETAILS_HEADER, _row, _write
from test_ncu_report import REPORTS
from tracewhy.analyses.peaks import lookup_peaks
from tracewhy.analyses.roofline import RooflineOptions
from tracewhy.findings import thresholds as th
from tracewhy.findings.roofline import NcuRooflineResult, roofline
from tracewhy.model.ncu import NcuCol, NcuReport
from tracewhy.readers.ncu.csv_export import read_ncu_csv
from tracewhy.readers.ncu.reader import read_ncu


@functools.cache
def _report(name: str) -> NcuReport:
    return read_ncu(shared_trace(f"ncu/{name}.ncu-rep"))


@functools.cache
def _result(name: str) -> NcuRooflineResult:
    return roofline(_report(name))


@functools.cache
def _raw_actions(name: str) -> tuple[Any, ...]:
    # The [ncu] extra: the reader of every .ncu-rep test here needs it too.
    ncu_report = importlib.import_module("ncu_report")
    context = ncu_report.load_report(str(shared_trace(f"ncu/{name}.ncu-rep")))
    rng = context.range_by_idx(0)
    return (context, *(rng.action_by_idx(i) for i in range(rng.num_actions())))


def _metric(action: Any, name: str) -> float | None:
    m = action.metric_by_name(name)
    return None if m is None else float(m.as_double())


def _launch(name: str, launch_id: int) -> dict[str, Any]:
    return _result(name).launches.filter(pl.col(NcuCol.LAUNCH) == launch_id).row(0, named=True)


# --- (a) the top rule: largest *global* estimated speedup ----------------------------------------


def _raw_rules(action: Any) -> list[tuple[str, str, float]]:
    """(rule id, speedup type, speedup) of every rule result with an estimate, in report order."""
    ncu_report = importlib.import_module("ncu_report")
    out = []
    for d in action.rule_results_as_dicts():
        est = d.get("speedup_estimation")
        if est is None:
            continue
        kind = {ncu_report.SpeedupType.GLOBAL: "global", ncu_report.SpeedupType.LOCAL: "local"}.get(
            est["type"], "unknown")
        out.append((d["rule_identifier"], kind, float(est["speedup"])))
    return out


def test_memory_bound_launch_leads_with_global_rule_not_a_larger_local_one() -> None:
    # The RTX 3060 Ti AdamW update is memory-bound (DRAM 92%). ncu's HighPipeUtilization rule
    # estimates a *local* 92% (the pipes are idle, which in isolation is 92% inefficiency); the
    # largest *global* estimate (a share of the kernel's runtime) is 7.8%.
    name = "rtx3060ti_llmc_adamw"
    for launch_id, action in enumerate(_raw_actions(name)[1:]):
        raw = _raw_rules(action)
        local = max(s for _, kind, s in raw if kind == "local")
        best_global = max(s for _, kind, s in raw if kind == "global")
        assert local > 90 and best_global < 10  # the case: a large local over a small global
        row = _launch(name, launch_id)
        assert row["bound"] == "memory-bound"
        assert not row["top_rule"].startswith("HighPipeUtilization")
        assert row["top_rule_speedup_type"] == "global"
        assert row["top_rule_speedup_pct"] == pytest.approx(best_global)


def test_top_rule_is_the_first_largest_global_estimate_in_every_report() -> None:
    # Expected from ncu_report directly: among rule results with a GLOBAL estimate, the largest,
    # the first in the report's order on a tie. Launches without one fall back to local ones.
    checked = 0
    for name in REPORTS:
        for launch_id, action in enumerate(_raw_actions(name)[1:]):
            raw = _raw_rules(action)
            if not raw:
                continue
            pool = [r for r in raw if r[1] == "global"] or [r for r in raw if r[1] != "local"] or raw
            best = max(s for _, _, s in pool)
            rule_id = next(r for r, _, s in pool if s == best)
            row = _launch(name, launch_id)
            assert row["top_rule"].split(":")[0] == rule_id, (name, launch_id, raw)
            assert row["top_rule_speedup_pct"] == pytest.approx(best), (name, launch_id)
            checked += 1
    assert checked == 20  # launches with estimates; the 2020.3 and basic-set reports have none


def test_h100_small_grid_launch_ranks_occupancy_over_local_pipe_estimate() -> None:
    # H100 size sweep, first (smallest) launch: local HighPipeUtilization 96.8% versus the
    # largest global, AchievedOccupancy 56.3%.
    row = _launch("h100_appliedai_stochround_sizesweep", 0)
    assert row["top_rule"].startswith("AchievedOccupancy")
    assert row["top_rule_speedup_pct"] == pytest.approx(56.33, abs=0.01)


def _rule_row(kernel: str, rule: str, kind: str, speedup: str) -> str:
    return (f'"0","42","app","127.0.0.1","{kernel}","1","7","(256, 1, 1)","(1024, 1, 1)","0","8.6",'
            f'"Section","","","","{rule}","OPT","{rule} message.","{kind}","{speedup}"')


def test_inline_local_98_9_loses_to_global_74(tmp_path: Path) -> None:
    # As a details-page CSV: a memory-bound copy with a local 98.9%
    # HighPipeUtilization and a global 74% UncoalescedGlobalAccess. The terminal lists the
    # rules in the same order.
    kernel = "copy_kernel"
    text = "\n".join([
        DETAILS_HEADER,
        _row(0, kernel, "GPU Speed Of Light Throughput", "Duration", "usecond", "100"),
        _row(0, kernel, "GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "12"),
        _row(0, kernel, "GPU Speed Of Light Throughput", "Memory Throughput", "%", "91"),
        _rule_row(kernel, "HighPipeUtilization", "local", "98.9"),
        _rule_row(kernel, "UncoalescedGlobalAccess", "global", "74"),
        _rule_row(kernel, "SOLBottleneck", "", ""),
    ])
    result = roofline(read_ncu_csv(_write(tmp_path, text)))
    row = result.launches.row(0, named=True)
    assert row["bound"] == "memory-bound"
    assert row["top_rule"].startswith("UncoalescedGlobalAccess")
    assert (row["top_rule_speedup_pct"], row["top_rule_speedup_type"]) == (74.0, "global")

    from rich.console import Console

    from tracewhy.renderers.roofline import render_ncu_roofline

    console = Console(width=200, record=True)
    console.print(render_ncu_roofline(result, 5))
    out = console.export_text()
    assert out.index("ncu UncoalescedGlobalAccess") < out.index("ncu HighPipeUtilization")


# --- (b) one clock for the roof and the achieved point --------------------------------------------


def test_achieved_and_ceiling_use_the_same_sm_clock() -> None:
    # ncu's roofline (SpeedOfLight_RooflineChart section): peak work = 2 x FFMA peak/cycle x
    # sm__cycles_elapsed.avg.per_second; achieved = (FADD + FMUL + 2 FFMA)/cycle x
    # smsp__cycles_elapsed.avg.per_second. So achieved/peak is a ratio of per-cycle counts.
    compared = 0
    for name in REPORTS:
        for launch_id, action in enumerate(_raw_actions(name)[1:]):
            row = _launch(name, launch_id)
            if row["precision"] != "fp32" or not row["peak_flop_per_s"]:
                continue
            op = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum.per_cycle_elapsed"
            per_cycle = sum((_metric(action, op.format(k)) or 0.0) * (2 if k == "ffma" else 1)
                            for k in ("fadd", "fmul", "ffma"))
            peak_per_cycle = 2 * (_metric(action, "sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained")
                                  or 0.0)
            sm_clock = _metric(action, "sm__cycles_elapsed.avg.per_second")
            assert row["flop_per_s"] / row["peak_flop_per_s"] == pytest.approx(per_cycle / peak_per_cycle,
                                                                               rel=1e-9), (name, launch_id)
            assert row["peak_flop_per_s"] == pytest.approx(peak_per_cycle * (sm_clock or 0), rel=1e-9)
            compared += 1
    assert compared >= 8


def test_gpc_clock_differs_from_the_roofline_clock_where_it_matters() -> None:
    # Why the previous GPC-clock roof was wrong: the GPC clock of the SOL header is 1.1-4.9%
    # above ncu's roofline SM clock on the RTX 3060 Ti (+4.4% in launch 0) and 4.6-8.2% below
    # it on the H100 base2 report (up to 10.9% below in the size sweep).
    def ratios(name: str) -> list[float]:
        return [(_metric(a, "gpc__cycles_elapsed.avg.per_second") or 0)
                / (_metric(a, "sm__cycles_elapsed.avg.per_second") or 1) for a in _raw_actions(name)[1:]]

    rtx = ratios("rtx3060ti_llmc_adamw")
    assert rtx[0] == pytest.approx(1.044, abs=0.001) and min(rtx) > 1.01 and max(rtx) < 1.05
    h100 = ratios("h100_appliedai_stochround_base2")
    assert min(h100) == pytest.approx(0.918, abs=0.001) and max(h100) == pytest.approx(0.954, abs=0.001)
    # And the result's SM clock is ncu's roofline clock, not the GPC one.
    for launch_id, action in enumerate(_raw_actions("rtx3060ti_llmc_adamw")[1:]):
        assert _launch("rtx3060ti_llmc_adamw", launch_id)["sm_clock_hz"] == pytest.approx(
            _metric(action, "sm__cycles_elapsed.avg.per_second"))


# --- (c) the peak table's parts, each as profilers name it ---------------------------------------

# (name as nvidia-smi / ncu / rocm-smi write it, table entry, FP32 TFLOP/s, dense FP16 tensor
# TFLOP/s, memory TB/s): the figures of the datasheet cited beside each entry.
ADDED_PARTS = [
    ("Tesla T4", "T4", 8.1, 65, 0.32),
    ("NVIDIA L40S", "L40S", 91.6, 362.05, 0.864),
    ("NVIDIA L40", "L40", 90.5, 181.05, 0.864),
    ("NVIDIA H200 NVL", "H200 NVL", 60, 835.5, 4.8),
    # GH200 used to match the H200 entry ("gh200" contains "h200"): 4.8 TB/s instead of 4.0.
    ("NVIDIA GH200 480GB", "GH200 (HBM3)", 67, 989.5, 4.0),
    ("NVIDIA GH200 144G HBM3e", "GH200 (HBM3e)", 67, 989.5, 4.9),
]
#: Widely used parts the table already held before ADDED_PARTS joined it.
LISTED_PARTS = [
    ("NVIDIA L4", "L4", 30.3, 121, 0.3),
    ("NVIDIA A10", "A10", 31.2, 125, 0.6),
    ("NVIDIA A10G", "A10G", 35.0, 140.1, 0.6),
    ("Tesla V100-SXM2-32GB", "Tesla V100 SXM2", 15.7, 125, 0.9),
    ("Tesla V100-PCIE-16GB", "Tesla V100 PCIe", 14.0, 112, 0.9),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB", 19.5, 312, 1.555),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB", 19.5, 312, 1.555),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 19.5, 312, 2.039),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 19.5, 312, 1.935),
    ("NVIDIA H100 PCIe", "H100 PCIe", 51, 756.5, 2.0),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 67, 989.5, 3.35),
    ("NVIDIA H200", "H200 SXM", 67, 989.5, 4.8),
    ("NVIDIA B200", "B200", 74.4, 2250, 8.0),
    ("AMD Instinct MI250X", "Instinct MI250X", 47.9, 383, 3.2768),
    ("AMD Instinct MI300X", "Instinct MI300X", 163.4, 1307.4, 5.3),
]


def _assert_part(device: str, entry: str, fp32: float, fp16_tensor: float, dram_tb_s: float) -> None:
    peaks = lookup_peaks(device)
    assert peaks is not None and peaks.name == entry and peaks.source, device
    assert peaks.flops("fp32") == pytest.approx(fp32 * 1e12), device
    assert peaks.flops("fp16_tensor") == pytest.approx(fp16_tensor * 1e12), device
    assert peaks.dram_bytes_per_s == pytest.approx(dram_tb_s * 1e12), device


@pytest.mark.parametrize(("device", "entry", "fp32", "fp16_tensor", "dram_tb_s"), ADDED_PARTS)
def test_peak_table_holds_the_added_part(device: str, entry: str, fp32: float, fp16_tensor: float,
                                         dram_tb_s: float) -> None:
    _assert_part(device, entry, fp32, fp16_tensor, dram_tb_s)


def test_peak_table_holds_every_widely_used_part() -> None:
    # T4, L4, L40S, A10/A10G, V100, A100 40/80, H100 PCIe/SXM, H200, B200, MI250X, MI300X.
    for part in LISTED_PARTS + ADDED_PARTS[:2]:
        _assert_part(*part)


def test_new_parts_agree_with_their_own_sm_arithmetic() -> None:
    # FP32 = SMs x 128 lanes (64 on Turing) x 2 FLOP x boost: the datasheet figure within 1%.
    for device, lanes in (("Tesla T4", 64), ("NVIDIA L40S", 128), ("NVIDIA L40", 128)):
        p = lookup_peaks(device)
        assert p is not None
        assert p.sm_count * lanes * 2 * p.boost_clock_hz == pytest.approx(p.flops("fp32"), rel=0.01), device


# --- (c) an SM clock far below boost ---------------------------------------------------------------


def _longest(name: str) -> tuple[int, Any]:
    actions = _raw_actions(name)[1:]
    durations = [_metric(a, "gpu__time_duration.sum") or 0 for a in actions]
    i = max(range(len(actions)), key=lambda k: durations[k])
    return i, actions[i]


def test_low_clock_note_on_the_real_report_that_has_one() -> None:
    # Of the reports here, two A100 PCIe ones are the only ones whose longest launch ran far
    # below boost: ncu locked them at the 765 MHz base of a 1410 MHz part. (There is no T4
    # report here; the inline T4 case below stands in for it.) Basic-set reports carry only
    # the GPC clock.
    low = []
    for name in REPORTS:
        _, action = _longest(name)
        clock = (_metric(action, "sm__cycles_elapsed.avg.per_second")
                 or _metric(action, "gpc__cycles_elapsed.avg.per_second") or 0)
        ratio = clock / (
            (_metric(action, "device__attribute_max_gpu_frequency_khz") or 1) * 1e3)
        note = [n for n in _result(name).notes if "of the" in n and "GHz boost" in n]
        if ratio < th.LOW_CLOCK_RATIO:
            low.append(name)
            assert note and f"{ratio:.0%} of the 1.41 GHz boost" in note[0], (name, _result(name).notes)
            assert "clocks were locked" in note[0]
        else:
            assert not note, name
    assert sorted(low) == ["a100pcie_mistic_multikernel_basic", "a100pcie_mistic_nodecalc_full"]


def test_low_clock_note_when_ncu_did_not_lock_the_clocks() -> None:
    # The same A100 report with ncu's ClockStatus saying "not locked": the GPU ran at 54% of
    # boost on its own (throttling), which the note must say rather than stay silent.
    report = _report("a100pcie_mistic_nodecalc_full")
    unlocked = dataclasses.replace(
        report, launches=report.launches.with_columns(pl.lit(False).alias(NcuCol.CLOCKS_LOCKED)))
    result = roofline(unlocked)
    assert result.clocks_locked is False
    note = [n for n in result.notes if "GHz boost" in n]
    assert note and "did not lock" in note[0] and "54%" in note[0]


def test_t4_at_585_mhz_is_37_percent_of_boost(tmp_path: Path) -> None:
    # A details export from a T4 (its device is named with --device; CSV pages carry no device
    # name or maximum clock): the boost clock comes from the peak table's T4 entry.
    kernel = "gemm_kernel"
    text = "\n".join([
        DETAILS_HEADER,
        _row(0, kernel, "GPU Speed Of Light Throughput", "Duration", "usecond", "500"),
        _row(0, kernel, "GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "80"),
        _row(0, kernel, "GPU Speed Of Light Throughput", "Memory Throughput", "%", "30"),
        _row(0, kernel, "GPU Speed Of Light Throughput", "SM Frequency", "Mhz", "585"),
    ])
    result = roofline(read_ncu_csv(_write(tmp_path, text)), RooflineOptions(device="Tesla T4"))
    row = result.launches.row(0, named=True)
    assert row["clock_ratio"] == pytest.approx(585 / 1590)
    note = [n for n in result.notes if "GHz boost" in n]
    assert note and "SM clock 0.58 GHz during the capture, 37% of the 1.59 GHz boost" in note[0]
    assert "2.7x" in note[0]
