"""Across ranks: each matched collective call's arrival skew, the waits it caused on the early
ranks, and its bus bandwidth over the transfer alone (the shortest duration across ranks), on an
inline three-rank NCCL job worked by hand and on the generated two-rank gloo DDP pair against
its raw JSON."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import polars as pl
import pytest

import tracewhy
from builders import KinetoBuilder
from conftest import GENERATED
from tracewhy.analyses.rank_compare import RanksResult, compare_ranks
from tracewhy.findings.codes import Code
from tracewhy.findings.ranks import rank_findings
from tracewhy.reports.ranks import load_rank_summaries

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
STEP_US = 40_000.0
TRANSFER_US = 10_000.0
LATE_US = 5_000.0  # rank 2 reaches every all-reduce this much after ranks 0 and 1
CLOCK_US = {0: 1_000_000_000.0, 1: 3_300_000_000.5, 2: 17.0}


def _rank(tmp_path: Path, rank: int, nelems: int) -> Path:
    """Four steps; per step one all-reduce of ``nelems`` floats over 3 ranks on 8-GPU A100 SXM
    nodes. Its kernel ends when the last rank has arrived and the transfer is done, so it lasts
    TRANSFER_US on rank 2 and TRANSFER_US + LATE_US on the others."""
    b = KinetoBuilder()
    b.header["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 3}
    b.header["deviceProperties"] = [{"id": i, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_000_000_000}
                                    for i in range(8)]
    for i in range(4):
        o = CLOCK_US[rank] + STEP_US * i
        b.annotation(f"ProfilerStep#{i}", o, STEP_US)
        b.launch("sm80_xmma_gemm", o + 10, 5, gpu_ts=o + 100, gpu_dur=1000)
        t = o + 2000
        b.op("record_param_comms", t, 20, **{"Collective name": "allreduce", "Process Group Name": "0",
                                             "In msg nelems": nelems, "Out msg nelems": nelems, "Group size": 3,
                                             "dtype": "Float"})
        b.annotation("nccl:all_reduce", t + 5, 10)
        start = o + 2000 + (LATE_US if rank == 2 else 0.0)
        b.launch(NCCL, t + 8, 2, gpu_ts=start, gpu_dur=o + 2000 + LATE_US + TRANSFER_US - start, stream=20)
    return b.write(tmp_path / f"job_rank{rank}.json")


def _job(tmp_path: Path, nelems: int) -> RanksResult:
    return compare_ranks(load_rank_summaries([str(_rank(tmp_path, r, nelems)) for r in (0, 1, 2)]))


def test_skew_waits_and_transfer_bandwidth_by_hand(tmp_path: Path) -> None:
    r = _job(tmp_path, 16 * 1024**2)  # 64 MiB of floats
    assert r.matched.height == 3  # steps 1-3
    cols = ("transfer_ns", "max_wait_ns", "last_rank", "wait_ns", "msg_bytes", "group_size", "link")
    assert r.matched.select(*cols).unique().to_dicts() == [
        {"transfer_ns": 10_000_000, "max_wait_ns": 5_000_000, "last_rank": 2, "wait_ns": 10_000_000,
         "msg_bytes": 64 * 1024**2, "group_size": 3, "link": "NVLink 3"}]
    # NCCL's all-reduce bus bandwidth over the transfer alone: S / t * 2(n-1)/n.
    expected = 64 * 1024**2 / 0.010 * 4 / 3
    assert r.matched.get_column("busbw_bytes_per_s").to_list() == pytest.approx([expected] * 3)
    assert r.matched.get_column("link_share").to_list() == pytest.approx([expected / 300e9] * 3)
    [f] = [f for f in rank_findings(r) if f.code == Code.COLLECTIVE_SLOW_BUS]
    assert f.evidence["transfer_only"] is True and f.evidence["calls"] == 3
    assert f.evidence["busbw_bytes_per_s"] == round(expected)
    assert "over their transfer time" in f.statement and "waiting for the ranks" not in f.statement


def test_small_messages_across_ranks_are_no_finding(tmp_path: Path) -> None:
    r = _job(tmp_path, 1024)  # 4 KiB: latency, whatever its bandwidth
    assert r.matched.get_column("link_share").max() < 0.01
    assert Code.COLLECTIVE_SLOW_BUS not in {f.code for f in rank_findings(r)}


# --- the generated gloo pair against its raw JSON ---------------------------------------------

_STEP = re.compile(r"ProfilerStep#(\d+)")


def _raw_call_durations(path: Path) -> dict[tuple[int, str, int], float]:
    """(step, op, order within step and op) -> duration in µs of each gloo:<op> range."""
    with gzip.open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"], int(m.group(1))) for e in events
                   if (m := _STEP.fullmatch(e["name"])))
    out: dict[tuple[int, str, int], float] = {}
    seen: dict[tuple[int, str], int] = {}
    for e in sorted((e for e in events if e["name"].startswith("gloo:")), key=lambda e: e["ts"]):
        step = next((n for lo, hi, n in steps if lo <= e["ts"] < hi), None)
        if step is None:
            continue
        op = e["name"].split(":", 1)[1]
        k = seen[(step, op)] = seen.get((step, op), -1) + 1
        out[(step, op, k)] = e["dur"]
    return out


def test_waits_on_the_early_ranks_match_the_raw_ranges() -> None:
    paths = [GENERATED / f"ddp_gloo_bcast_rank{r}.pt.trace.json.gz" for r in (0, 1)]
    r = compare_ranks(load_rank_summaries([str(p) for p in paths]))
    raw = [_raw_call_durations(p) for p in paths]
    assert r.matched.height > 0
    for row in r.matched.iter_rows(named=True):
        durs = [d[(row["step"], row["op"], row["ordinal"])] for d in raw]
        # Two ranks: the early one waited the difference, which is also the arrival skew.
        assert row["wait_ns"] == pytest.approx(1000 * (max(durs) - min(durs)), abs=2)
        assert row["max_wait_ns"] == row["wait_ns"]
    assert r.matched.get_column("busbw_bytes_per_s").null_count() == r.matched.height  # gloo records no size


def test_ranks_shows_the_calls_by_waiting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tracewhy.cli import main

    paths = [str(_rank(tmp_path, r, 16 * 1024**2)) for r in (0, 1, 2)]
    assert main(["ranks", *paths, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {m["wait_ns"] for m in doc["matched"]} == {10_000_000}
    assert pl.DataFrame(doc["matched"]).get_column("link").unique().to_list() == ["NVLink 3"]
    assert main(["ranks", *paths, "--wide"]) == 0
    text = capsys.readouterr().out
    assert "matched collectives, most waiting first" in text and "64.0 MiB" in text
    tracewhy.load(paths[0]).check()
