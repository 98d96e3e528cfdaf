"""ncu CSV exports: inline specimens of every quirk the reader claims to handle, then the real
CSVs in ../shared/traces/ncu, checked against the raw text read by the test's own simple parse."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from conftest import shared_trace
from tracewhy.errors import TraceError
from tracewhy.model.ncu import NcuCol, RuleCol
from tracewhy.readers.ncu.csv_export import read_ncu_csv
from tracewhy.readers.ncu.reader import read_ncu
from tracewhy.readers.ncu.units import COUNT, FREQ, PCT, RATE, TIME, normalize, parse_number

DETAILS_HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
                  '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
                  '"Metric Value","Rule Name","Rule Type","Rule Description","Estimated Speedup Type",'
                  '"Estimated Speedup"')


def _row(launch: int, kernel: str, section: str, metric: str, unit: str, value: str) -> str:
    # ncu 2025.x writes metric rows without the five rule fields (16 fields under 20 headers).
    return (f'"{launch}","42","app","127.0.0.1","{kernel}","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0",'
            f'"{section}","{metric}","{unit}","{value}",')


def _write(tmp_path: Path, text: str, name: str = "k.csv", bom: bool = True) -> Path:
    path = tmp_path / name
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode())
    return path


# --- numbers and units --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"134,221,568"', 134_221_568.0),  # en-US grouping, as the 2026.2 CSVs here print it
        ("1.234.567", 1_234_567.0),  # de-DE grouping
        ("1.234,5", 1234.5),  # de-DE decimal comma with grouping
        ("0,74", 0.74),  # decimal comma alone
        ("1\u202f234,5", 1234.5),  # fr-FR narrow no-break space grouping
        ("95.5%", 95.5),
        ("n/a", None),
        ("", None),
        ("PolicySpread", None),
    ],
)
def test_parse_number_in_any_locale(text: str, expected: float | None) -> None:
    assert parse_number(text) == expected


@pytest.mark.parametrize(
    ("value", "unit", "base", "dimension"),
    [
        (4.26, "usecond", 4260.0, TIME),  # ncu <= 2022 spelling
        (4.26, "us", 4260.0, TIME),  # ncu >= 2023 spelling
        (1.51, "cycle/nsecond", 1.51e9, FREQ),
        (1.51, "Ghz", 1.51e9, FREQ),
        (700.5, "Gbyte/second", 700.5e9, RATE),
        (1.4, "Tbyte/s", 1.4e12, RATE),
        (12.5, "Mbyte", 12.5e6, "bytes"),
        (2.0, "KiB", 2048.0, "bytes"),
        (97.5, "%", 97.5, PCT),
        (168.0, "register/thread", 168.0, COUNT),
        (1.5, "Kbyte/cycle", 1500.0, "per_cycle"),
    ],
)
def test_units_normalize_to_base(value: float, unit: str, base: float, dimension: str) -> None:
    got, dim = normalize(value, unit)
    assert got == pytest.approx(base) and dim == dimension


# --- details page -------------------------------------------------------------------------------


def test_details_page_with_prof_lines_bom_scaled_units_and_rules(tmp_path: Path) -> None:
    text = "\n".join([
        "==PROF== Connected to process 42 (/usr/bin/app)",
        "program output: step 1 loss 0.5",
        DETAILS_HEADER,
        _row(0, "gemm_kernel(float *)", "GPU Speed Of Light Throughput", "Duration", "usecond", "1,234.50"),
        _row(0, "gemm_kernel(float *)", "GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "81.20"),
        _row(0, "gemm_kernel(float *)", "GPU Speed Of Light Throughput", "Memory Throughput", "%", "40.00"),
        _row(0, "gemm_kernel(float *)", "GPU Speed Of Light Throughput", "SM Frequency", "cycle/nsecond", "1.41"),
        _row(0, "gemm_kernel(float *)", "Memory Workload Analysis", "Memory Throughput", "Gbyte/second", "700.50"),
        _row(0, "gemm_kernel(float *)", "Launch Statistics", "Registers Per Thread", "register/thread", "168"),
        '"0","42","app","127.0.0.1","gemm_kernel(float *)","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0",'
        '"SpeedOfLight","","","","SOLBottleneck","OPT","Compute is more heavily utilized than Memory: look at '
        '@section:ComputeWorkloadAnalysis:Compute Workload Analysis@.","global","12.5"',
        "==PROF== Disconnected from process 42",
    ])
    report = read_ncu_csv(_write(tmp_path, text))
    report.check()
    assert report.format == "ncu-csv-details"
    row = report.launches.row(0, named=True)
    assert row[NcuCol.NAME] == "gemm_kernel(float *)"
    assert row[NcuCol.DUR] == 1_234_500  # 1,234.50 us in ns
    assert row[NcuCol.SM_PCT] == 81.2 and row[NcuCol.MEM_PCT] == 40.0  # "%" label, not the byte/s one
    assert row[NcuCol.DRAM_BYTES_PER_S] == pytest.approx(700.5e9)  # same label, byte/s dimension
    assert row[NcuCol.SM_CLOCK] == pytest.approx(1.41e9)
    assert row[NcuCol.REGISTERS] == 168
    assert (row[NcuCol.BLOCK_X], row[NcuCol.GRID_X], row[NcuCol.CC]) == (256, 1024, "9.0")
    rule = report.rules.row(0, named=True)
    assert rule[RuleCol.RULE] == "SOLBottleneck" and rule[RuleCol.SEVERITY] == "optimization"
    assert rule[RuleCol.SPEEDUP_TYPE] == "global" and rule[RuleCol.SPEEDUP_PCT] == 12.5
    assert "@" not in rule[RuleCol.MESSAGE] and "Compute Workload Analysis" in rule[RuleCol.MESSAGE]


def test_old_header_with_kernel_time_and_old_labels(tmp_path: Path) -> None:
    # ncu 2020: "Kernel Time" (a timestamp) after Kernel Name, no launch-shape columns, and
    # Speed-of-Light labels "SOL SM" / "SOL FB" / "Memory Frequency".
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Kernel Time","Context","Stream",'
              '"Section Name","Metric Name","Metric Unit","Metric Value"')
    rows = [
        '"3","21524","cfd","127.0.0.1","step_factor","2020-Apr-07 17:01:05","1","7","GPU Speed Of Light",'
        f'"{label}","{unit}","{value}"'
        for label, unit, value in (("SOL SM", "%", "12.5"), ("SOL FB", "%", "39.60"),
                                   ("Memory Frequency", "cycle/second", "772656250"),
                                   ("Duration", "nsecond", "11733"))
    ]
    report = read_ncu_csv(_write(tmp_path, "\n".join([header, *rows]), bom=False))
    row = report.launches.row(0, named=True)
    assert row[NcuCol.LAUNCH] == 3 and row[NcuCol.NAME] == "step_factor"
    assert row[NcuCol.SM_PCT] == 12.5 and row[NcuCol.DRAM_PCT] == 39.6
    assert row[NcuCol.DRAM_CLOCK] == 772_656_250 and row[NcuCol.DUR] == 11_733


def test_metric_name_rows_from_metrics_flag(tmp_path: Path) -> None:
    # --metrics exports put metric names (not labels) in "Metric Name" under the section
    # "Command line profiler metrics"; counts have an empty unit.
    rows = [
        _row(0, "saxpy", "Command line profiler metrics", "dram__bytes_read.sum", "Mbyte", "134.22"),
        _row(0, "saxpy", "Command line profiler metrics", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "",
             "524,288"),
    ]
    report = read_ncu_csv(_write(tmp_path, "\n".join([DETAILS_HEADER, *rows])))
    row = report.launches.row(0, named=True)
    assert row[NcuCol.DRAM_READ] == pytest.approx(134.22e6)
    assert row[NcuCol.GLOBAL_ST_REQUESTS] == 524_288


def test_program_output_inside_the_table_is_skipped_and_counted(tmp_path: Path) -> None:
    rows = [_row(0, "k", "GPU Speed Of Light Throughput", "Duration", "ns", "100"),
            "loss 0.25 at step 9",
            _row(1, "k", "GPU Speed Of Light Throughput", "Duration", "ns", "200")]
    report = read_ncu_csv(_write(tmp_path, "\n".join([DETAILS_HEADER, *rows])))
    assert report.launches.get_column(NcuCol.DUR).to_list() == [100, 200]
    assert any("1 lines" in w for w in report.warnings)


# --- raw page -----------------------------------------------------------------------------------


def test_raw_page_units_in_second_row(tmp_path: Path) -> None:
    # The raw page as ncu 2021 prints it: one column per metric name, units in row two.
    text = "\n".join([
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Kernel Time","Context","Stream",'
        '"gpu__time_duration.sum","dram__bytes.sum.per_second","sm__throughput.avg.pct_of_peak_sustained_elapsed",'
        '"launch__grid_size"',
        '"","","","","","","","","usecond","Gbyte/second","%",""',
        '"0","12440","vectorAdd.exe","127.0.0.1","vectorAdd(const float *, const float *, float *, int)",'
        '"2021-Nov-08 19:56:53","1","7","2.50","1,200.00","77.97","196"',
        '"1","12440","vectorAdd.exe","127.0.0.1","vectorAdd(const float *, const float *, float *, int)",'
        '"2021-Nov-08 19:56:54","1","7","3.00","900.00","60.00","196"',
    ])
    report = read_ncu_csv(_write(tmp_path, text))
    assert report.format == "ncu-csv-raw"
    assert report.launches.get_column(NcuCol.DUR).to_list() == [2500, 3000]
    assert report.launches.get_column(NcuCol.DRAM_BYTES_PER_S).to_list() == pytest.approx([1.2e12, 9e11])
    assert report.launches.get_column(NcuCol.GRID_SIZE).to_list() == [196, 196]


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "empty"),
        (b"just some program output\nno table here\n", 'header line starting with "ID"'),
        (b"\x00\x01\x02binary", "binary"),
        (b'"ID","Process ID","Kernel Name","Invocations","Metric Name","Metric Value"\n', "summary"),
        (b'"ID","Process ID","Process Name"\n"0","1","x"\n', "not an ncu details or raw page"),
    ],
)
def test_bad_csv_is_one_trace_error_naming_the_file(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(TraceError) as e:
        read_ncu(path)
    assert str(path) in str(e.value) and fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_truncated_csv_keeps_complete_rows(tmp_path: Path) -> None:
    good = [_row(0, "k", "GPU Speed Of Light Throughput", "Duration", "ns", "100"),
            _row(1, "k", "GPU Speed Of Light Throughput", "Duration", "ns", "200")]
    text = "\n".join([DETAILS_HEADER, *good])
    cut = text[: text.rindex('"200"') - 30]  # the second launch's row ends mid-field
    report = read_ncu_csv(_write(tmp_path, cut))
    assert report.launches.get_column(NcuCol.DUR).to_list()[0] == 100


# --- the real CSVs --------------------------------------------------------------------------------

RTX5070 = ["gemm_naive", "gemm_register_blocked", "gemm_tiled", "gemm_vectorized", "saxpy",
           "transpose_naive", "transpose_tiled"]


def _plain_rows(path: Path) -> list[dict[str, str]]:
    """The test's own reading: drop the BOM and every line before the header, then csv.DictReader."""
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
    return list(csv.DictReader(ln for ln in lines[start:] if not ln.startswith("==")))


@pytest.mark.parametrize("name", RTX5070)
def test_rtx5070_metric_exports(name: str) -> None:
    path = shared_trace(f"ncu/csv_rtx5070_olajide/{name}.csv")
    report = read_ncu(path)
    report.check()
    raw = {r["Metric Name"]: r["Metric Value"] for r in _plain_rows(path)}
    row = report.launches.row(0, named=True)
    assert report.launches.height == 1
    # Values carry thousands separators in the file ("9,589,248"); units are ns and byte.
    assert row[NcuCol.DUR] == int(raw["gpu__time_duration.sum"].replace(",", ""))
    assert row[NcuCol.DRAM_READ] == float(raw["dram__bytes_op_read.sum"].replace(",", ""))
    assert row[NcuCol.DRAM_WRITE] == float(raw["dram__bytes_op_write.sum"].replace(",", ""))
    assert row[NcuCol.SM_PCT] == float(raw["sm__throughput.avg.pct_of_peak_sustained_elapsed"])
    assert row[NcuCol.GLOBAL_LD_SECTORS] == float(raw["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"].replace(",",
                                                                                                                ""))
    assert row[NcuCol.CC] == "12.0"


def test_b200_details_log_with_rules() -> None:
    path = shared_trace("ncu/csv_b200_superbench/cublaslt_ncu.log")
    report = read_ncu(path)
    report.check()
    rows = _plain_rows(path)
    labels = {r["Metric Name"]: r["Metric Value"] for r in rows if r["Metric Name"]}
    rule_rows = [r for r in rows if r.get("Rule Name")]
    row = report.launches.row(0, named=True)
    assert report.launches.height == 1
    assert row[NcuCol.DUR] == int(labels["Duration"])  # "ns", no separators in this file
    assert row[NcuCol.SM_PCT] == float(labels["Compute (SM) Throughput"])
    assert row[NcuCol.MEM_PCT] == float(labels["Memory Throughput"])
    assert row[NcuCol.SM_COUNT] == int(labels["# SMs"]) == 152
    assert row[NcuCol.OCC_THEORETICAL] == float(labels["Theoretical Occupancy"])
    assert report.rules.height == len(rule_rows) == 8
    speedups = sorted(float(r["Estimated Speedup"]) for r in rule_rows if r["Estimated Speedup"])
    assert sorted(report.rules.get_column(RuleCol.SPEEDUP_PCT).drop_nulls().to_list()) == speedups
