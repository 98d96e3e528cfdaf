"""The README's Speed section is generated from the benchmarks' own result pages (bench/speed_section.py).

The section must equal what the pages say now, so a benchmark rerun without regenerating it, or a
figure typed into the README by hand, fails here. The readers are also checked on small pages
built here, against figures worked out by hand, so a parser that reads the wrong column or gets a
target's direction wrong fails too.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conftest import ROOT


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("speed_section", ROOT / "bench" / "speed_section.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["speed_section"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


speed = _bench()


def test_readme_speed_section_is_what_the_result_pages_say() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start, end = speed.MARKERS
    shown = readme.split(start, 1)[1].split(end, 1)[0].strip("\n").splitlines()
    assert shown == speed.section(), "README's Speed section is stale: run python bench/speed_section.py"


def test_every_page_the_section_names_exists_and_gives_a_row() -> None:
    for page, read in speed.SOURCES:
        assert list(read(ROOT / "bench" / page)), page


_READ_PAGE = """\
# Reading

| file | uncompressed MB | tool | wall s | peak RSS MB | runs ok | notes |
| --- | ---: | --- | ---: | ---: | ---: | --- |
| big.json | 1,000 | tracewhy | 4.00 | 1,400 | 3/3 | |
| big.json | 1,000 | json.loads | 16.00 | 4,000 | 3/3 | |
| fast.json | 300 | tracewhy | 1.49 | 600 | 3/3 | |
| small.json | 56 | tracewhy | 0.10 | 100 | 3/3 | |
"""


def test_read_rate_is_size_over_whole_process_wall_with_both_targets(tmp_path: Path) -> None:
    page = tmp_path / "results_x.md"
    page.write_text(_READ_PAGE, encoding="utf-8")
    lines = list(speed.kineto_read(page))
    # 56 MB is under the size a whole process's rate speaks for: no row.
    assert ["1,000 MB JSON" in lines[0].workload, "300 MB JSON" in lines[1].workload] == [True, True]
    assert len(lines) == 2
    big, fast = lines
    assert "250 MB/s" in big.tracewhy and "1.40x" in big.tracewhy and big.met  # 1000/4; 1400/1000
    assert "json.loads 16.00 s" in big.peer
    assert "201 MB/s" in fast.tracewhy and "2.00x" in fast.tracewhy  # 300/1.49; 600/300
    assert not fast.met  # fast enough, but twice the file in memory


def test_small_trace_row_fails_on_any_command_over_half_a_second(tmp_path: Path) -> None:
    page = tmp_path / "results_s.md"
    page.write_text("Trace: t.json.gz decompressed (1.00 MB).\n\n"
                    "- floors (wall / CPU s): `python -c pass` 0.030 / 0.030; "
                    "`python -c 'import polars, numpy'` 0.250 / 0.300\n\n"
                    "| command | text wall s | text CPU s | --json wall s | --json CPU s |\n"
                    "| --- | ---: | ---: | ---: | ---: |\n"
                    "| info | 0.30 | 0.40 | 0.31 | 0.40 |\n"
                    "| export | 0.49 | 0.60 |  |  |\n"
                    "| diff | 0.45 | 0.60 | 0.52 | 0.70 |\n"
                    "| roofline | 0.90 (rc 3) | 0.20 | 0.80 (rc 3) | 0.20 |\n", encoding="utf-8")
    (row,) = speed.small_trace(page)
    assert not row.met and "1 over" in row.tracewhy and "diff 0.52 s" in row.tracewhy
    # A command that refused the bench's input did no work to time: named, not counted.
    assert row.tracewhy.startswith("3 commands") and "roofline: input refused" in row.tracewhy
    assert "0.25 s" in row.peer and "t.json.gz (1.00 MB)" in row.workload


def test_a_page_without_the_expected_table_is_an_error_not_a_skip(tmp_path: Path) -> None:
    page = tmp_path / "results_y.md"
    page.write_text("| a | b |\n| --- | --- |\n| 1 | 2 |\n", encoding="utf-8")
    with pytest.raises(LookupError, match=r"results_y\.md"):
        list(speed.nsys_large(page))


def test_nsys_rows_kept_from_an_earlier_run_are_read_and_said_so(tmp_path: Path) -> None:
    """bench_nsys_scale.py keeps nsys's rows from the page it replaces when nsys is not installed,
    marking their label; the section reads them under their plain label and says the peer's figure
    is from an earlier run, while a row of this run is shown plain."""
    page = tmp_path / "results_nsys_scale.md"
    kept = " (earlier run, kept: nsys not installed)"
    page.write_text(
        "Export: x 250: 606 MB\n\n"
        "| what | median wall s | best wall s | median CPU s (user+sys) | peak RSS MB (max) | RSS / file |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: |\n"
        f"| nsys stats --report cuda_gpu_kern_sum{kept} | 3.00 | 3.00 | 3.00 | 341 | 0.56 |\n"
        "| tracewhy kernels --json | 1.50 | 1.50 | 2.00 | 437 | 0.72 |\n"
        "| nsys analyze (6 rules) | 100.00 | 100.00 | 100.00 | 392 | 0.65 |\n"
        "| tracewhy diagnose --json | 10.00 | 10.00 | 12.00 | 1000 | 1.65 |\n", encoding="utf-8")
    kernels, diagnose = speed.nsys_large(page)
    assert kernels.met and "3.00 s (an earlier run" in kernels.peer and "606 MB" in kernels.workload
    assert diagnose.met and diagnose.peer == "`nsys analyze` 100.0 s"
