"""``diagnose`` on Nsight Systems exports makes one finding per ``nsys analyze`` rule that
fires, and the same number of rows as NVIDIA's own output (golden_nsys-2023.4.4)."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import pytest

import tracewhy
from conftest import TRACES, shared_trace
from tracewhy.reports.diagnose import diagnose

RULE_CODE = {
    "cuda_memcpy_async": "nsys-async-memcpy-pageable",
    "cuda_memcpy_sync": "nsys-sync-memcpy",
    "cuda_memset_sync": "nsys-sync-memset",
    "cuda_api_sync": "nsys-sync-api",
    "gpu_gaps": "nsys-gpu-gaps",
    "gpu_time_util": "nsys-gpu-low-utilization",
}
NSYS_ROWS_SHOWN = 50  # nsys analyze prints at most 50 rows per rule (golden README)
# nsys skipped these rules on pipit: its export lacks ENUM_CUDA_MEM_KIND / ENUM_CUDA_MEMCPY_OPER
# (golden README, "SKIPPED"); tracewhy knows the enum values and measures them anyway, so the
# golden output has nothing to compare against there.
SKIPPED_BY_NSYS = {("pipit_saxpy_mpi_cuda_a100_2022.2", r)
                   for r in ("cuda_memcpy_async", "cuda_memcpy_sync", "cuda_memset_sync")}


def _exports() -> list[str]:
    if not TRACES.is_dir():
        return ["nsysai_mock_rtx3080"]
    return sorted(p.name.removesuffix(".sqlite.gz") for p in (TRACES / "nsys").glob("*.sqlite.gz"))


def _golden_rows(name: str, rule: str) -> int:
    folder = TRACES / "nsys" / "golden_nsys-2023.4.4" / name
    for candidate in (folder / f"analyze_{rule}.csv", folder / f"analyze_{rule}.csv.gz"):
        if candidate.exists():
            data = candidate.read_bytes()
            text = (gzip.decompress(data) if candidate.suffix == ".gz" else data).decode()
            return sum(1 for _ in csv.DictReader(text.splitlines()))
    return 0


@pytest.mark.parametrize("name", _exports())
def test_nsys_rule_findings_match_nsys_analyze(name: str) -> None:
    path: Path = shared_trace(f"nsys/{name}.sqlite.gz")
    report = diagnose(tracewhy.load(path))
    by_code = {f.code: f for f in report.findings}
    for rule, code in RULE_CODE.items():
        if (name, rule) in SKIPPED_BY_NSYS:
            continue
        expected = _golden_rows(name, rule)
        if expected == 0:
            assert code not in by_code, f"{name}: nsys found nothing for {rule}"
            assert not any(rule in f.evidence.get("nsys_rules", {}) for f in report.findings)
            continue
        # diagnose folds a rule into tracewhy's own finding of the same cause (one finding per
        # cause, findings/consolidate.py), keeping the rule's evidence under nsys_rules.
        folded = [f.evidence["nsys_rules"][rule] for f in report.findings
                  if rule in f.evidence.get("nsys_rules", {})]
        assert code in by_code or folded, f"{name}: nsys reports {expected} rows for {rule}"
        evidence = by_code[code].evidence if code in by_code else folded[0]
        if rule == "gpu_time_util":
            assert evidence["runs"]
        else:
            assert min(int(evidence["count"]), NSYS_ROWS_SHOWN) == expected


def test_gaps_blame_the_same_host_thread_on_every_run() -> None:
    """Two ranks' kernels in this 2-GPU export start at the same instant. The activity that ends
    a gap (and so the host thread it is blamed on) must not depend on how a parallel sort broke
    that tie: before the sort was made stable, about one run in ten named the other rank."""
    from polars.testing import assert_frame_equal

    from tracewhy.analyses.gaps import gaps
    from tracewhy.analyses.steps import steps

    trace = tracewhy.load(shared_trace("nsys/nsysai_mfu_2gpu_after.sqlite.gz"))
    steps_result = steps(trace)
    first = gaps(trace, steps_result).gaps
    assert first.height
    for _ in range(40):  # (the unstable sort flipped about one run in ten)
        assert_frame_equal(gaps(trace, steps_result).gaps, first)
