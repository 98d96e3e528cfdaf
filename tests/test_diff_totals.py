"""diff without step markers on either side: a verdict from the captures'
totals, with the caveat that totals hold only if both captured the same work. The nsys-ai MFU
pair has no step ranges; its kernel time is summed here straight from the SQLite exports."""

from __future__ import annotations

import gzip
import sqlite3
from pathlib import Path

import pytest

from conftest import shared_trace
from tracewhy.findings.compare import FASTER, SLOWER, WITHIN_NOISE
from tracewhy.readers import read_trace
from tracewhy.reports.diff import compare

BEFORE = "nsys/nsysai_mfu_2gpu_before.sqlite.gz"
AFTER = "nsys/nsysai_mfu_2gpu_after.sqlite.gz"


def _kernel_ns(name: str, tmp_path: Path) -> int:
    db = tmp_path / Path(name).name.removesuffix(".gz")
    db.write_bytes(gzip.decompress(shared_trace(name).read_bytes()))
    with sqlite3.connect(db) as conn:
        (total,) = conn.execute("SELECT sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    return int(total)


def test_no_steps_on_either_side_compares_totals(tmp_path: Path) -> None:
    a, b = _kernel_ns(BEFORE, tmp_path), _kernel_ns(AFTER, tmp_path)
    c = compare(read_trace(shared_trace(BEFORE)), read_trace(shared_trace(AFTER)), with_findings=False)
    assert c.relative_change == pytest.approx((b - a) / a, rel=1e-9)
    expected = SLOWER if (b - a) / a >= 0.10 else FASTER if (b - a) / a <= -0.10 else WITHIN_NOISE
    assert c.verdict == expected
    assert "GPU kernel time" in c.statement and "no step markers in either run" in c.statement
    assert "the verdict holds only if both captured the same work" in c.statement


def test_one_side_without_steps_is_still_not_measured() -> None:
    from conftest import GENERATED

    c = compare(read_trace(GENERATED / "cpu_eager_schedule.pt.trace.json.gz"),
                read_trace(shared_trace(BEFORE)), with_findings=False)
    assert c.verdict == "not measured" and "run B has no steady steps" in c.statement
