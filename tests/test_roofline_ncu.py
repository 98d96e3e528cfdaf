"""Per-kernel verdicts from Nsight Compute data, checked against what ncu's own rules wrote into
the same reports, against the before/after and size-sweep pairs, and on tiny inline exports."""

from __future__ import annotations

import functools
import importlib
import os
import re
from pathlib import Path

import polars as pl
import pytest

from conftest import shared_trace
from test_ncu_report import REPORTS
from tracewhy.analyses.roofline import RooflineOptions
from tracewhy.findings import thresholds as th
from tracewhy.findings.roofline import (
    COMPUTE_BOUND,
    LATENCY_BOUND,
    MEMORY_BOUND,
    UNKNOWN,
    NcuRooflineResult,
    roofline,
)
from tracewhy.readers.ncu.reader import read_ncu


def _have_ncu_report() -> bool:
    try:
        importlib.import_module("ncu_report")
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI must install the [ncu] extra: pip install ncu-report")
        return False
    return True


needs_rep = pytest.mark.skipif(not _have_ncu_report(), reason="ncu_report not installed")


@functools.cache
def _result(name: str) -> NcuRooflineResult:
    return roofline(read_ncu(shared_trace(f"ncu/{name}.ncu-rep")))


def ncu_says(title: str | None, message: str) -> set[str]:
    """The bounds compatible with ncu's SOLBottleneck rule, from its title (reports) or its text
    (CSV exports, ncu 2020.3 without titles). Written from ncu's rule wording, not from our code."""
    text = f"{title or ''} {message}"
    if "High Memory Throughput" in text or "Memory is more heavily utilized than Compute" in text:
        return {MEMORY_BOUND}
    if "High Compute Throughput" in text or "Compute is more heavily utilized than Memory" in text:
        return {COMPUTE_BOUND}
    if ("Latency Issue" in text or "low compute throughput and memory bandwidth utilization" in text
            or "Small Grid" in text or "grid is too small" in text):
        return {LATENCY_BOUND}
    if ("High Throughput" in text or "greater than 80.0% of the available compute or memory" in text
            or "Balanced Throughput" in text or "well-balanced" in text):
        return {MEMORY_BOUND, COMPUTE_BOUND}
    if "could not be found" in text or "returned an error" in text or "exception" in text:
        return {UNKNOWN}
    raise AssertionError(f"unrecognized SOLBottleneck text: {text[:120]}")


def _check_against_rules(result: NcuRooflineResult) -> int:
    sol = result.rules.filter(pl.col("rule_id") == "SOLBottleneck")
    checked = 0
    for launch_id, group in sol.group_by("launch_id"):
        allowed: set[str] = set()
        for rule in group.iter_rows(named=True):
            allowed |= ncu_says(rule["title"], rule["message"])
        bound = result.launches.filter(pl.col("launch_id") == launch_id[0]).get_column("bound")[0]
        assert bound in allowed, (result.path, launch_id, bound, allowed)
        checked += 1
    return checked


@needs_rep
def test_every_verdict_agrees_with_ncu_bottleneck_rule() -> None:
    checked = sum(_check_against_rules(_result(name)) for name in REPORTS)
    # Every launch of every report has a SOLBottleneck result (MANIFEST: "rule results n/n"), and
    # the MANIFEST table lists 5+5+4+154+1+7+5+5+11+5+4 = 206 launches.
    assert checked == 206


def test_b200_csv_verdict_agrees_with_ncu_rule() -> None:
    result = roofline(read_ncu(shared_trace("ncu/csv_b200_superbench/cublaslt_ncu.log")))
    assert _check_against_rules(result) == 1
    assert result.launches.get_column("bound")[0] == LATENCY_BOUND


@needs_rep
def test_v100_div_to_mult_moves_the_hot_kernel_from_compute_to_memory() -> None:
    # The workshop's point: replacing divisions by multiplications frees the FP64 pipe, the
    # kernel gets 1.8x faster, and DRAM becomes the limit. ncu: "High Compute Throughput" before,
    # "High Throughput" (memory 81%) after.
    before = _result("v100_ncar_miniweather_baseline").launches.filter(pl.col("name") == "compute_tendencies_x_279_gpu")
    after = _result("v100_ncar_miniweather_divtomult").launches.filter(pl.col("name") == "compute_tendencies_x_279_gpu")
    b, a = before.row(0, named=True), after.row(0, named=True)
    assert (b["bound"], a["bound"]) == (COMPUTE_BOUND, MEMORY_BOUND)
    assert a["dur_ns"] < 0.6 * b["dur_ns"]
    assert "DRAM" in a["reason"]
    # The other kernels did not change class.
    for name in ("semi_discrete_step_232_gpu", "compute_tendencies_x_309_gpu", "set_halo_values_x_396_gpu"):
        classes = {_result(r).launches.filter(pl.col("name") == name).get_column("bound")[0]
                   for r in ("v100_ncar_miniweather_baseline", "v100_ncar_miniweather_divtomult")}
        assert len(classes) == 1, name


@needs_rep
def test_h100_size_sweep_moves_from_latency_to_memory_bound() -> None:
    # One bf16 stochastic-rounding kernel at growing sizes: tiny grids cannot fill 132 SMs,
    # large ones stream at DRAM speed (MANIFEST: 4.3 us at 0.5 waves ... 91% memory throughput).
    launches = _result("h100_appliedai_stochround_sizesweep").launches.sort("dur_ns")
    bounds = launches.get_column("bound").to_list()
    first_memory = bounds.index(MEMORY_BOUND)
    assert set(bounds[:first_memory]) == {LATENCY_BOUND} and set(bounds[first_memory:]) == {MEMORY_BOUND}
    assert first_memory >= 3
    smallest, largest = launches.row(0, named=True), launches.row(-1, named=True)
    assert smallest["grid_note"] == "small grid" and smallest["waves_per_sm"] < 1
    assert largest["dram_pct"] > 90 and largest["roof_fraction"] > 0.9  # the DRAM roof: no FLOPs


@needs_rep
def test_fp_roofline_percentages_match_ncu_roofline_rule() -> None:
    # ncu's SOLFPRoofline rule prints "achieved X% of this device's fp32 peak ... and Y% of its
    # fp64 peak". Our achieved FLOP/s over our peak, computed from the raw per-cycle counters,
    # must round to the same numbers (ncu rounds to whole percent).
    pattern = re.compile(r"achieved (close to )?(\d+)% of this device's fp32 peak performance and "
                         r"(close to )?(\d+)% of its fp64 peak")
    compared = 0
    for name in REPORTS:
        result = _result(name)
        for rule in result.rules.filter(pl.col("rule_id") == "SOLFPRoofline").iter_rows(named=True):
            m = pattern.search(rule["message"])
            if not m:
                continue
            row = result.launches.filter(pl.col("launch_id") == rule["launch_id"]).row(0, named=True)
            ncu_pct = {"fp32": (m.group(1), int(m.group(2))), "fp64": (m.group(3), int(m.group(4)))}
            if row["precision"] is None:
                assert ncu_pct["fp32"][1] == ncu_pct["fp64"][1] == 0
                continue
            close_to, pct = ncu_pct[row["precision"]]
            if close_to:
                continue  # "close to N%": ncu's own rounding of tiny values
            ours = 100 * row["flop_per_s"] / row["peak_flop_per_s"]
            assert abs(ours - pct) <= 1.0, (name, rule["launch_id"], ours, pct)
            compared += 1
    assert compared >= 12


@needs_rep
def test_uncoalesced_share_matches_ncu_rule_text() -> None:
    # UncoalescedGlobalAccess: "... a total of 16384 excessive sectors (33% of the total 49152 sectors)".
    pattern = re.compile(r"total of (\d+) excessive sectors \((\d+)% of the total (\d+) sectors\)")
    compared = 0
    for name in ("v100_ncar_miniweather_baseline", "a40_indexspaces_julia", "h100_appliedai_stochround_base2"):
        result = _result(name)
        for rule in result.rules.filter(pl.col("rule_id") == "UncoalescedGlobalAccess").iter_rows(named=True):
            m = pattern.search(rule["message"])
            if not m:
                continue
            row = result.launches.filter(pl.col("launch_id") == rule["launch_id"]).row(0, named=True)
            assert round(100 * row["excess_sector_share"]) == int(m.group(2))
            if int(m.group(2)) >= 100 * th.EXCESS_SECTORS_SHARE:
                assert row["uncoalesced"] is True
            compared += 1
    assert compared >= 5


@needs_rep
def test_occupancy_limiter_matches_ncu_occupancy_rule() -> None:
    compared = 0
    for name in REPORTS:
        result = _result(name)
        for rule in result.rules.filter(pl.col("rule_id") == "Occupancy").iter_rows(named=True):
            row = result.launches.filter(pl.col("launch_id") == rule["launch_id"]).row(0, named=True)
            text = rule["message"]
            if "not impacted by any block limit" in text:
                assert row["occupancy_limiter"] is None
            elif "limited by the number of required registers" in text:
                assert "registers" in (row["occupancy_limiter"] or "")
            elif "required amount of shared memory" in text:
                assert "shared memory" in (row["occupancy_limiter"] or "")
            else:
                continue
            compared += 1
    assert compared >= 150


@needs_rep
def test_clock_locked_note_and_report_peaks() -> None:
    result = _result("v100_ncar_miniweather_baseline")
    assert result.clocks_locked is True
    assert any("clocks were locked" in n for n in result.notes)
    # Peaks from the report itself: the V100 DRAM roof is 1024 B/cycle at the measured
    # ~877 MHz memory clock, i.e. within 1% of the 900 GB/s datasheet figure.
    assert result.ceilings.dram_bytes_per_s == pytest.approx(900e9, rel=0.01)
    unlocked = _result("a100pcie_mistic_searchkernel_ncu2020")
    assert unlocked.clocks_locked is False and not any("locked" in n for n in unlocked.notes)


@needs_rep
def test_failed_collection_is_unknown_not_a_guess() -> None:
    # The H800 report's flash_fwd_kernel has no metrics (ncu's own rule says a metric is missing).
    result = _result("h800_sglang_pytorch_randn_flashattn")
    flash = result.launches.filter(pl.col("name") == "flash_fwd_kernel").row(0, named=True)
    assert flash["bound"] == UNKNOWN and "no metrics" in flash["reason"]


# --- inline exports: each verdict branch, on numbers chosen around the thresholds ------------

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _export(tmp_path: Path, launches: dict[str, dict[str, tuple[str, str]]]) -> Path:
    lines = [HEADER]
    for i, (kernel, metrics) in enumerate(launches.items()):
        for label, (unit, value) in metrics.items():
            lines.append(f'"{i}","1","app","h","{kernel}","1","7","(128, 1, 1)","(64, 1, 1)","0","8.0",'
                         f'"Section","{label}","{unit}","{value}"')
    path = tmp_path / "inline.csv"
    path.write_text("\n".join(lines))
    return path


def _bounds(tmp_path: Path, launches: dict[str, dict[str, tuple[str, str]]]) -> dict[str, dict[str, object]]:
    result = roofline(read_ncu(_export(tmp_path, launches)), RooflineOptions(device="A100-SXM4-40GB"))
    return {r["name"]: r for r in result.launches.iter_rows(named=True)}


def test_inline_verdicts_at_the_thresholds(tmp_path: Path) -> None:
    hi, lo = f"{th.SATURATED_PCT + 1:.1f}", f"{th.SATURATED_PCT - 1:.1f}"
    rows = _bounds(tmp_path, {
        "compute": {"Duration": ("ns", "1000"), "Compute (SM) Throughput": ("%", hi),
                    "Memory Throughput": ("%", "20"), "DRAM Throughput": ("%", "20")},
        "dram": {"Duration": ("ns", "1000"), "Compute (SM) Throughput": ("%", "20"),
                 "Memory Throughput": ("%", hi), "DRAM Throughput": ("%", hi)},
        "onchip": {"Duration": ("ns", "1000"), "Compute (SM) Throughput": ("%", "15"),
                   "Memory Throughput": ("%", "95"), "L1/TEX Cache Throughput": ("%", "95"),
                   "DRAM Throughput": ("%", "3")},
        "latency": {"Duration": ("ns", "1000"), "Compute (SM) Throughput": ("%", lo),
                    "Memory Throughput": ("%", lo), "Waves Per SM": ("", "0.25"), "Grid Size": ("", "27"),
                    "# SMs": ("SM", "108")},
        "tail": {"Duration": ("ns", "1000"), "Compute (SM) Throughput": ("%", "90"),
                 "Memory Throughput": ("%", "30"), "Waves Per SM": ("", "1.2")},
    })
    assert rows["compute"]["bound"] == COMPUTE_BOUND
    assert rows["dram"]["bound"] == MEMORY_BOUND and str(rows["dram"]["reason"]).startswith("DRAM")
    assert rows["onchip"]["bound"] == MEMORY_BOUND and "on-chip" in str(rows["onchip"]["reason"])
    assert rows["latency"]["bound"] == LATENCY_BOUND
    assert rows["latency"]["grid_note"] == "small grid" and "27 blocks for 108 SMs" in str(rows["latency"]["details"])
    assert rows["tail"]["grid_note"] == "tail" and "20% full" in str(rows["tail"]["details"])


def test_inline_occupancy_limiter_and_spills_from_raw_metrics(tmp_path: Path) -> None:
    # Raw metric names (--metrics): registers allow 2 blocks/SM, shared memory 4, warps 8, so
    # registers limit theoretical occupancy; 40 local loads + 10 stores mean spilled registers.
    text = "\n".join([
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed",'
        '"gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",'
        '"sm__maximum_warps_per_active_cycle_pct","sm__warps_active.avg.pct_of_peak_sustained_active",'
        '"launch__occupancy_limit_registers","launch__occupancy_limit_shared_mem","launch__occupancy_limit_warps",'
        '"launch__occupancy_limit_blocks","sass__inst_executed_local_loads","sass__inst_executed_local_stores",'
        '"l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum","l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"',
        '"","","","","","","","ns","%","%","%","%","block","block","block","block","inst","inst","sector",""',
        '"0","1","app","h","spilly","1","7","5000","30","40","25","12","2","4","8","32","40","10","4194304","131072"',
    ])
    path = tmp_path / "raw.csv"
    path.write_text(text)
    row = roofline(read_ncu(path)).launches.row(0, named=True)
    assert row["occupancy_limiter"] == "registers"
    assert "limited by registers" in str(row["details"])
    assert row["local_memory_inst"] == 50 and "spills" in str(row["details"])
    # 4194304 / 131072 = 32 sectors per store request: every thread its own sector.
    assert row["sectors_per_store"] == 32 and row["uncoalesced"] is True
    assert "well below the theoretical" in str(row["details"])  # 12% achieved of 25% theoretical


@needs_rep
def test_kernel_reason_figures_are_its_longest_launch() -> None:
    # A sweep found the per-kernel row showing time-weighted SM 45% / memory 47% while its
    # reason said "SM 41% ... memory (51%)" with no hint that those were one launch's figures.
    # The reason is the longest launch's (of the bound that takes most time), and says so.
    r = _result("a100pcie_mistic_multikernel_basic")
    multi = r.kernels.filter(pl.col("launches") > 1)
    assert multi.height
    for row in multi.iter_rows(named=True):
        assert row["reason"].startswith("in its longest launch, "), row["reason"]
        longest = (r.launches.filter((pl.col("name") == row["name"]) & (pl.col("bound") == row["bound"]))
                   .sort("dur_ns", descending=True, nulls_last=True).row(0, named=True))
        sm = re.search(r"SM (?:at )?(\d+)%", row["reason"])
        if sm:
            assert int(sm.group(1)) == round(longest["sm_pct"])
    for row in r.kernels.filter(pl.col("launches") == 1).iter_rows(named=True):
        assert not row["reason"].startswith("in its longest launch")


def test_missing_memory_throughput_is_not_zero_percent() -> None:
    # This export (ncu --csv without the memory section) has SM throughput but no memory
    # throughput: the reason must say the figure is missing, not print "memory 0%".
    r = roofline(read_ncu(shared_trace("ncu/csv_rtx5070_olajide/gemm_naive.csv")))
    row = r.kernels.row(0, named=True)
    assert row["memory_pct"] is None
    assert "memory not in the export" in row["reason"] and "0%" not in row["reason"]
