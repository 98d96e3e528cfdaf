"""Every .ncu-rep in ../shared/traces/ncu loads, and agrees with what the folder's MANIFEST (read
with NVIDIA's module by the collector, written by hand) says is inside; bad reports fail in one line."""

from __future__ import annotations

import importlib
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import shared_trace
from tracewhy.errors import TraceError
from tracewhy.model.ncu import NcuCol
from tracewhy.readers.ncu import rep as ncu_rep
from tracewhy.readers.ncu.reader import read_ncu

REPORTS = [
    "v100_ncar_miniweather_baseline", "v100_ncar_miniweather_divtomult", "a100pcie_mistic_nodecalc_full",
    "a100pcie_mistic_multikernel_basic", "a100pcie_mistic_searchkernel_ncu2020",
    "h100_appliedai_stochround_sizesweep", "h100_appliedai_stochround_base2",
    "h800_sglang_pytorch_randn_flashattn", "a10g_esmm_sgemm_progression_basic", "a40_indexspaces_julia",
    "rtx3060ti_llmc_adamw",
]


@pytest.fixture(scope="module", autouse=True)
def _needs_ncu_report() -> None:
    try:
        importlib.import_module("ncu_report")
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI must install the [ncu] extra: pip install ncu-report")
        pytest.skip("ncu_report is not installed (pip install 'tracewhy[ncu]')")


def _manifest() -> dict[str, dict[str, object]]:
    """Per report: GPU, CC, ncu version (table row) and kernel launch counts (notes)."""
    text = shared_trace("ncu/MANIFEST.md").read_text()
    facts: dict[str, dict[str, object]] = {}
    for m in re.finditer(r"^\| `(\w+)\.ncu-rep` \| (.+?) \((\d+\.\d+)\) \| ([\d.]+) \| (\d+) / (\d+) \|", text, re.M):
        facts[m.group(1)] = {"gpu": m.group(2), "cc": m.group(3), "ncu": m.group(4),
                             "launches": int(m.group(5)), "kernels": int(m.group(6))}
    for m in re.finditer(r"^\*\*`(\w+)\.ncu-rep`\*\*.*?^- kernels \(name: launches\): ([^\n]+)$", text, re.M | re.S):
        facts[m.group(1)]["by_name"] = {k: int(v) for k, v in re.findall(r"`([^`]+)`: (\d+)", m.group(2))}
    return facts


@pytest.fixture(scope="module")
def manifest() -> dict[str, dict[str, object]]:
    return _manifest()


@pytest.mark.parametrize("name", REPORTS)
def test_report_loads_and_matches_manifest(name: str, manifest: dict[str, dict[str, object]]) -> None:
    report = read_ncu(shared_trace(f"ncu/{name}.ncu-rep"))
    report.check()
    facts = manifest[name]
    launches = report.launches
    assert launches.height == facts["launches"]
    counts = launches.group_by(NcuCol.NAME).len()
    assert dict(zip(counts[NcuCol.NAME], counts["len"], strict=True)) == facts["by_name"]
    assert set(launches.get_column(NcuCol.DEVICE_NAME).to_list()) == {facts["gpu"]}
    assert set(launches.get_column(NcuCol.CC).to_list()) == {facts["cc"]}
    assert report.tool_version is not None and report.tool_version.startswith(str(facts["ncu"]))
    assert report.rules.height > 0  # every report here carries rule results (MANIFEST: "rule results n/n")


def test_manifest_was_parsed(manifest: dict[str, dict[str, object]]) -> None:
    assert set(manifest) == set(REPORTS) and all("by_name" in f for f in manifest.values())


def _launch(name: str, kernel: str, index: int = 0) -> dict[str, object]:
    report = read_ncu(shared_trace(f"ncu/{name}.ncu-rep"))
    rows = report.launches.filter(report.launches[NcuCol.NAME] == kernel).rows(named=True)
    return rows[index]


def test_metric_values_agree_with_manifest_notes() -> None:
    # MANIFEST: "compute_tendencies_x_279_gpu: SM 70% / DRAM 45%" and, after div->mult,
    # "6.19 ms -> 3.48 ms, Compute(SM) throughput 70% -> 52%, Memory throughput 45% -> 81%".
    before = _launch("v100_ncar_miniweather_baseline", "compute_tendencies_x_279_gpu")
    after = _launch("v100_ncar_miniweather_divtomult", "compute_tendencies_x_279_gpu")
    assert round(before[NcuCol.DUR] / 1e6, 2) == 6.19 and round(after[NcuCol.DUR] / 1e6, 2) == 3.48
    assert round(before[NcuCol.SM_PCT]) == 70 and round(after[NcuCol.SM_PCT]) == 52
    assert round(before[NcuCol.MEM_PCT]) == 45 and round(after[NcuCol.MEM_PCT]) == 81
    # "basic: Memory 97% vs SM 12%" (A10G SGEMM ladder); "adamw ... DRAM 92%" (RTX 3060 Ti).
    basic = _launch("a10g_esmm_sgemm_progression_basic", "basic")
    assert round(basic[NcuCol.MEM_PCT]) == 97 and round(basic[NcuCol.SM_PCT]) == 12
    adamw = _launch("rtx3060ti_llmc_adamw", "adamw_kernel2")
    assert round(adamw[NcuCol.DRAM_PCT]) == 92
    # "nodeCalculationsKernel ... occupancy 93%"; "searchKernelCOSStree ... theoretical 50%, 64 regs".
    assert round(_launch("a100pcie_mistic_nodecalc_full", "nodeCalculationsKernel")[NcuCol.OCC_ACHIEVED]) == 93
    search = _launch("a100pcie_mistic_searchkernel_ncu2020", "searchKernelCOSStree")
    assert search[NcuCol.OCC_THEORETICAL] == 50 and search[NcuCol.REGISTERS] == 64


def test_clock_lock_flags_agree_with_measured_clocks() -> None:
    # Two independent records in each file: ncu's per-launch ClockStatus (read from the file's
    # framing) and the SM clock it measured against the device's maximum. Locked launches ran
    # well below the maximum (base clock); the one unlocked report (ncu 2020.3) ran near it.
    for name in REPORTS:
        report = read_ncu(shared_trace(f"ncu/{name}.ncu-rep"))
        longest = report.launches.sort(NcuCol.DUR, descending=True, nulls_last=True).row(0, named=True)
        ratio = longest[NcuCol.SM_CLOCK] / longest[NcuCol.MAX_SM_CLOCK]
        if longest[NcuCol.CLOCKS_LOCKED]:
            assert ratio < 0.9, (name, ratio)
        else:
            assert name == "a100pcie_mistic_searchkernel_ncu2020" and ratio > 0.9


def test_stall_breakdown_matches_ncu_rule_text() -> None:
    # ncu's CPIStall rule on the A100 nodeCalc report: "each warp of this kernel spends 18.6
    # cycles being stalled waiting for a scoreboard dependency on a L1TEX ... operation".
    report = read_ncu(shared_trace("ncu/a100pcie_mistic_nodecalc_full.ncu-rep"))
    rule = report.rules.filter((report.rules["launch_id"] == 0) & (report.rules["rule_id"] == "CPIStall")
                               & (report.rules["message"].str.contains("spends"))).row(0, named=True)
    cycles = float(re.search(r"spends ([\d.]+) cycles", rule["message"]).group(1))  # type: ignore[union-attr]
    stalls = report.breakdowns.filter((report.breakdowns["launch_id"] == 0)
                                      & (report.breakdowns["group"] == "stall_cycles"))
    value = stalls.filter(stalls["key"] == "long_scoreboard").get_column("value")[0]
    assert round(value, 1) == cycles


# --- bad reports ----------------------------------------------------------------------------------


def _copy(tmp_path: Path, name: str = "v100_ncar_miniweather_baseline") -> Path:
    dst = tmp_path / f"{name}.ncu-rep"
    shutil.copyfile(shared_trace(f"ncu/{name}.ncu-rep"), dst)
    return dst


@pytest.mark.parametrize("fraction", [0.001, 0.3, 0.9, 0.999])
def test_truncated_report_is_refused(tmp_path: Path, fraction: float) -> None:
    # ncu_report itself loads a cut file silently with fewer launches; the framing walk must not.
    path = _copy(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: max(8, int(len(data) * fraction))])
    with pytest.raises(TraceError) as e:
        read_ncu(path)
    assert str(path) in str(e.value) and "truncated" in str(e.value)


def test_corrupt_length_prefix_is_refused(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    data = bytearray(path.read_bytes())
    # The first block header's length sits after "NVR\0", the 4-byte file-header length and the
    # file header itself; make it claim more bytes than the file has.
    header_len = int.from_bytes(data[4:8], "little")
    offset = 8 + header_len
    data[offset:offset + 4] = (len(data) * 2).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError) as e:
        read_ncu(path)
    assert "truncated" in str(e.value) or "corrupt" in str(e.value)


@pytest.mark.parametrize("content", [b"", b"NVR", b"PK\x03\x04 a zip, not a report"])
def test_foreign_file_named_ncu_rep_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.ncu-rep"
    path.write_bytes(content)
    with pytest.raises(TraceError) as e:
        read_ncu(path)
    assert str(path) in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_module_says_how_to_install_or_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _copy(tmp_path)

    def no_module(name: str) -> object:
        raise ImportError(name)

    monkeypatch.setattr(ncu_rep.importlib, "import_module", no_module)
    with pytest.raises(TraceError) as e:
        read_ncu(path)
    message = str(e.value)
    assert "pip install" in message and "ncu --import" in message and "--csv" in message
    assert path.name in message and "\n" not in message
