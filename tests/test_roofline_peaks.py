"""The device peak table: name matching, partitions, and its datasheet figures checked against
the peaks ncu itself stores in real reports (instructions per cycle x maximum clock)."""

from __future__ import annotations

import importlib
import os

import pytest

from conftest import shared_trace
from test_ncu_report import REPORTS
from tracewhy.analyses.peaks import known_devices, lookup_peaks


@pytest.mark.parametrize(
    ("name", "sms", "expected"),
    [
        ("Tesla V100-SXM2-32GB", 80, "Tesla V100 SXM2"),
        ("Tesla V100S-PCIE-32GB", 80, "Tesla V100S PCIe"),
        ("NVIDIA A100-SXM4-80GB", 108, "A100 80GB SXM"),
        ("NVIDIA A100 80GB PCIe", 108, "A100 80GB PCIe"),
        ("NVIDIA A100-PCIE-40GB", 108, "A100 40GB"),
        ("NVIDIA H100 80GB HBM3", 132, "H100 SXM"),  # how Kineto names the SXM part
        ("NVIDIA H100 PCIe", 114, "H100 PCIe"),
        ("NVIDIA H200", 132, "H200 SXM"),
        ("NVIDIA B200", 148, "B200"),
        ("NVIDIA L4", 58, "L4"),
        ("NVIDIA A10", 72, "A10"),
        ("NVIDIA A10G", 80, "A10G"),
        ("NVIDIA GeForce RTX 3090", 82, "GeForce RTX 3090"),
        ("NVIDIA GeForce RTX 4090", 128, "GeForce RTX 4090"),
        ("NVIDIA GeForce RTX 5070", 48, "GeForce RTX 5070"),
        ("AMD Instinct MI300X VF", 304, "Instinct MI300X"),
        ("AMD Instinct MI250X", 220, "Instinct MI250X"),
    ],
)
def test_device_names_as_profilers_write_them(name: str, sms: int, expected: str) -> None:
    peaks = lookup_peaks(name, sms)
    assert peaks is not None and peaks.name == expected and peaks.scaled_note is None


def test_unknown_device_has_no_peaks() -> None:
    # (This was the L40S until the L40S was added to the table.)
    assert lookup_peaks("NVIDIA RTX A2000", 26) is None and lookup_peaks(None) is None


def test_one_mi250_die_gets_half_the_package() -> None:
    # A trace shows each MI250X die (GCD) as a device with 110 of the package's 220 CUs.
    full = lookup_peaks("AMD Instinct MI250X", 220)
    half = lookup_peaks("AMD Instinct MI250X / MI250", 110)
    assert full is not None and half is not None and half.scaled_note
    assert half.flops("fp16_tensor") == pytest.approx(full.flops("fp16_tensor") / 2)  # type: ignore[operator]
    assert half.dram_bytes_per_s == pytest.approx(full.dram_bytes_per_s / 2)


def test_dense_tensor_figures_are_half_the_sparse_datasheet_numbers() -> None:
    # H100 SXM datasheet: BF16 1,979 TFLOPS and FP8 3,958 "with sparsity"; dense is half.
    h100 = lookup_peaks("NVIDIA H100 80GB HBM3", 132)
    assert h100 is not None
    assert h100.flops("fp16_tensor") == pytest.approx(1979e12 / 2, rel=1e-3)
    assert h100.flops("fp8_tensor") == pytest.approx(3958e12 / 2, rel=1e-3)


def test_every_required_family_is_in_the_table() -> None:
    names = " ".join(known_devices())
    for family in ("V100", "A100 40GB", "A100 80GB", "H100 SXM", "H100 PCIe", "H200", "B200", "L4", "A10",
                   "A10G", "RTX 30", "RTX 40", "RTX 50", "MI250", "MI300X"):
        assert family in names, family


def test_table_agrees_with_peaks_stored_in_real_reports() -> None:
    # ncu stores per-cycle peaks (FFMA/DFMA instructions per cycle for the whole GPU, DRAM bytes
    # per cycle) and the device's maximum clocks. 2 x FMA/cycle x max clock is the FP peak; it
    # must match the datasheet figure in the table within 2% (boost clocks of shipped boards vary).
    try:
        ncu_report = importlib.import_module("ncu_report")
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI must install the [ncu] extra: pip install ncu-report")
        pytest.skip("ncu_report not installed")
    compared = 0
    for name in REPORTS:
        action = ncu_report.load_report(str(shared_trace(f"ncu/{name}.ncu-rep"))).range_by_idx(0).action_by_idx(0)

        def metric(n: str, action: object = action) -> float | None:
            m = action.metric_by_name(n)  # type: ignore[attr-defined]
            return None if m is None else float(m.as_double())

        device = action.metric_by_name("device__attribute_display_name").as_string()
        table = lookup_peaks(device, int(metric("device__attribute_multiprocessor_count") or 0))
        assert table is not None, device
        clock = (metric("device__attribute_max_gpu_frequency_khz") or 0) * 1e3
        for key, counter in (("fp32", "sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained"),
                             ("fp64", "sm__sass_thread_inst_executed_op_dfma_pred_on.sum.peak_sustained")):
            per_cycle = metric(counter)
            if per_cycle is None or table.flops(key) is None:
                continue
            assert 2 * per_cycle * clock == pytest.approx(table.flops(key), rel=0.02), (name, key)
            compared += 1
        dram_per_cycle = metric("dram__bytes.sum.peak_sustained")
        mem_clock = (metric("device__attribute_max_mem_frequency_khz") or 0) * 1e3
        # The "NVIDIA H100" of the applied-ai reports has a 6144-bit, 102 GB memory system at
        # 1593 MHz (2.45 TB/s), not the 80 GB SXM5 of the datasheet entry; its own peak is used.
        if dram_per_cycle and not name.startswith("h100_"):
            assert dram_per_cycle * mem_clock == pytest.approx(table.dram_bytes_per_s, rel=0.01), name
            compared += 1
    assert compared >= 15
