"""``ranks`` reads small rank files in its own process and starts a worker pool only when the
files are large in all: a spawned worker costs an interpreter that imports polars
and tracewhy before it reads a byte. ``--workers`` given always wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import shared_trace
from tracewhy.cli import main
from tracewhy.reports import ranks

PAIR = ("hta/sampled_128rank_job_rank0.json.gz", "hta/sampled_128rank_job_rank1.json.gz")


def _pair() -> list[str]:
    return [str(shared_trace(p)) for p in PAIR]


def test_small_files_are_read_here_unless_workers_are_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    files = _pair()  # 3.5 MB of JSON in all
    assert ranks.pool_size(None, files) == 0
    assert ranks.pool_size(2, files) == 2
    assert ranks.pool_size(5, files) == 2  # never more workers than files


def test_large_files_get_a_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    big = [tmp_path / f"job_rank{r}.json" for r in range(3)]
    for f in big:
        with open(f, "wb") as out:
            out.truncate(ranks.IN_PROCESS_MAX_BYTES // 3 + 1)  # sparse: the size is what counts
    assert ranks.pool_size(None, [str(f) for f in big]) == 3
    assert ranks.pool_size(None, [str(f) for f in big[:2]]) == 0
    assert ranks.pool_size(0, [str(f) for f in big]) == 0


def test_gzip_counts_inflated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gzip trace is parsed inflated: its size is what the choice weighs, not the bytes on disk."""
    files = _pair()
    on_disk = sum(Path(f).stat().st_size for f in files)
    inflated = 2 * 1_759_570  # rank 0's JSON, and rank 1's within a few KB
    assert on_disk < inflated // 4
    monkeypatch.setattr(ranks, "IN_PROCESS_MAX_BYTES", inflated // 2)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert ranks.pool_size(None, files) == 2


def test_cli_reads_small_rank_files_here(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ranks", *_pair(), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["executor"] == "in-process"
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
