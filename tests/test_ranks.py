"""Many ranks: exact answers on inline multi-rank traces with skewed clocks, the generated gloo
DDP pair with a planted straggler, and the HTA 128-rank pair against raw JSON and HTA."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import tracewhy
from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from tracewhy.analyses.rank_compare import RanksResult, compare_ranks
from tracewhy.analyses.ranks import rank_from_name
from tracewhy.cli import main
from tracewhy.errors import TraceError
from tracewhy.findings import thresholds as th
from tracewhy.findings.ranks import rank_findings
from tracewhy.reports.ranks import load_rank_summaries

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
COMPUTE_US = {0: 400, 1: 400, 2: 600}  # rank 2 computes 200 µs longer: the straggler
TRANSFER_US = 100
# Separate clocks: wildly different epochs, one with a fractional microsecond.
CLOCK_US = {0: 1_000_000_000.0, 1: 3_300_000_000.5, 2: 17.0}


def _rank(tmp_path: Path, rank: int, clock: float, *, extra_call_in_step: int | None = None,
          name: str | None = None, distributed: bool = True) -> Path:
    """Four 1000 µs steps. Per step, at offset o on this rank's clock: compute [o+100,
    o+100+c) on stream 7, then an all-reduce of 1024 floats on stream 20 that starts when the
    compute ends and ends, as a collective does, when the last rank's transfer is done: at
    o + 100 + max(c) + 100 µs on every rank. So its duration is 100 µs on the straggler and
    100 + (max(c) - c) µs on the others."""
    b = KinetoBuilder()
    if distributed:
        b.header["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 3}
    c, top = COMPUTE_US[rank], max(COMPUTE_US.values())
    for i in range(4):
        o = clock + 1000.0 * i
        b.annotation(f"ProfilerStep#{i}", o, 1000)
        b.launch("sm80_xmma_gemm", o + 10, 5, gpu_ts=o + 100, gpu_dur=c)
        calls = 2 if extra_call_in_step == i else 1
        for k in range(calls):
            t = o + 500 + 30 * k
            b.op("record_param_comms", t, 20, **{"Collective name": "allreduce", "Process Group Name": "0",
                                                 "In msg nelems": 1024, "Group size": 3, "dtype": "Float"})
            b.annotation("nccl:all_reduce", t + 5, 10)
            start = o + 100 + c + 5 * k
            b.launch(NCCL, t + 8, 2, gpu_ts=start, gpu_dur=o + 100 + top + TRANSFER_US - start, stream=20)
    path = b.write(tmp_path / (name or f"job_rank{rank}.json"))
    tracewhy.load(path).check()
    return path


def _job(tmp_path: Path, clocks: dict[int, float] | None = None, **kw: Any) -> RanksResult:
    clocks = clocks or CLOCK_US
    paths = [str(_rank(tmp_path, r, clocks[r], **kw)) for r in (0, 1, 2)]
    return compare_ranks(load_rank_summaries(paths))


def test_transfer_waits_and_straggler_by_hand(tmp_path: Path) -> None:
    r = _job(tmp_path)
    assert r.steps_compared == 3  # steps 1-3; step 0 is warm-up
    assert r.matched.height == 3
    cols = ("op", "ranks", "transfer_ns", "max_wait_ns", "last_rank", "late_ns")
    assert r.matched.select(*cols).unique().to_dicts() == [
        {"op": "all_reduce", "ranks": 3, "transfer_ns": 100_000, "max_wait_ns": 200_000, "last_rank": 2,
         "late_ns": 200_000.0}]
    assert (r.straggler, r.straggler_last_share) == (2, 1.0)
    rows = {row["rank"]: row for row in r.ranks.iter_rows(named=True)}
    assert {k: (v["wait_ns_per_step"], v["late_ns_per_step"], v["last_count"]) for k, v in rows.items()} == {
        0: (200_000.0, 0.0, 0), 1: (200_000.0, 0.0, 0), 2: (0.0, 200_000.0, 3)}
    assert rows[2]["compute_ns_per_step"] == 600_000 and rows[0]["compute_ns_per_step"] == 400_000
    assert rows[0]["step_p50_ns"] == 1_000_000
    assert r.mismatches.height == 0


def test_clock_offsets_change_nothing(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    skewed = _job(tmp_path / "a")
    same = _job(tmp_path / "b", clocks={0: 0.0, 1: 0.0, 2: 0.0})
    for attr in ("matched", "lateness", "mismatches"):
        assert getattr(skewed, attr).equals(getattr(same, attr))
    assert skewed.ranks.drop("source").equals(same.ranks.drop("source"))


def test_straggler_finding_says_what_it_did_instead(tmp_path: Path) -> None:
    found = {f.code: f for f in rank_findings(_job(tmp_path))}
    f = found["rank-straggler"]
    # The statement leads with the waiting the straggler caused (what picks it), the
    # count of calls it was last at is context. Device-timed calls: nothing is said about its
    # host thread in the wait window (the wait was on its GPU stream), so no "While they waited".
    assert f.statement == (
        "rank 2 is the straggler: the other ranks waited 0.20 ms/step for it (20% of the 1.00 ms mean step), "
        "100% of all waiting at matched collectives; it arrived last at 3 of 3 of them (100%). Over the whole step "
        "rank 2 spent 0.60 ms/step in GPU compute (other ranks: 0.40).")
    assert f.recoverable_ns_per_step == 200_000
    assert [x["late_ns"] for x in f.evidence["late_ns_by_step"]] == [200_000.0] * 3
    # 20% of the step is exactly EXPOSED_COMM_HIGH_SHARE: high severity.
    assert th.EXPOSED_COMM_HIGH_SHARE == 0.20 and f.severity.value == "high"
    imb = found["rank-imbalance"]
    assert imb.statement.startswith("GPU compute per step differs across ranks: rank 2 computes 0.60 ms/step, "
                                    "50% above the median 0.40 ms")


def test_no_straggler_when_all_arrive_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(COMPUTE_US, 2, 400)
    r = _job(tmp_path)
    assert r.straggler is None and r.matched.get_column("max_wait_ns").to_list() == [0, 0, 0]
    assert rank_findings(r) == []


def test_extra_collective_on_one_rank_is_a_hang_risk(tmp_path: Path) -> None:
    paths = [str(_rank(tmp_path, r, CLOCK_US[r], extra_call_in_step=2 if r == 1 else None)) for r in (0, 1, 2)]
    r = compare_ranks(load_rank_summaries(paths))
    assert r.mismatches.select("step", "process_group", "op", "kind", "detail").to_dicts() == [
        {"step": 2, "process_group": "0", "op": "all_reduce", "kind": "count",
         "detail": "rank 0: 1, rank 1: 2, rank 2: 1"}]
    f = {x.code: x for x in rank_findings(r)}["rank-collective-mismatch"]
    assert f.severity.value == "high" and "rank 0: 1, rank 1: 2, rank 2: 1" in f.statement


def test_ranks_without_common_steps(tmp_path: Path) -> None:
    # Rank 1's capture holds other step numbers (its profiler started later): nothing to match.
    a = _rank(tmp_path, 0, 0.0)
    text = _rank(tmp_path, 1, 0.0).read_text()
    for i in reversed(range(4)):
        text = text.replace(f"ProfilerStep#{i}", f"ProfilerStep#{i + 10}")
    b = tmp_path / "job_rank1.json"
    b.write_text(text)
    r = compare_ranks(load_rank_summaries([str(a), str(b)]))
    assert r.steps_compared == 0 and r.matched.height == 0 and r.straggler is None
    assert r.notes[0] == "the ranks' steady steps have no step number in common: nothing to match"
    assert r.ranks.get_column("wait_ns_per_step").to_list() == [0.0, 0.0]


def test_rank_from_file_name_and_errors(tmp_path: Path) -> None:
    assert [rank_from_name(n) for n in ("job_rank3.json.gz", "rank-12.Apr_03.pt.trace.json", "worker0.json",
                                        "sampled_128rank_job_rank1.json.gz")] == [3, 12, None, 1]
    a = _rank(tmp_path, 0, 0.0, distributed=False, name="trace_rank7.json")
    b = _rank(tmp_path, 1, 0.0, distributed=False, name="trace_rank4.json")
    assert [s.rank for s in load_rank_summaries([str(a), str(b)])] == [4, 7]
    assert {s.rank_from for s in load_rank_summaries([str(a)])} == {"file name"}
    nameless = _rank(tmp_path, 0, 0.0, distributed=False, name="trace.json")
    with pytest.raises(TraceError, match="cannot tell which rank this is"):
        load_rank_summaries([str(nameless)])
    twin = _rank(tmp_path, 0, 0.0, name="copy_of_rank0.json")
    with pytest.raises(TraceError, match="rank 0 again"):
        load_rank_summaries([str(_rank(tmp_path, 0, 0.0)), str(twin)])


def test_cli_process_pool_equals_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for r in (0, 1, 2):
        _rank(tmp_path, r, CLOCK_US[r])
    assert main(["ranks", str(tmp_path), "--json", "--workers", "0"]) == 0
    here = json.loads(capsys.readouterr().out)
    assert main(["ranks", str(tmp_path), "--json", "--workers", "2"]) == 0
    pool = json.loads(capsys.readouterr().out)
    assert main(["ranks", str(tmp_path), "--json"]) == 0  # small files: two threads here
    threads = json.loads(capsys.readouterr().out)
    assert (here.pop("executor"), pool.pop("executor"), threads.pop("executor")) == (
        "in-process", "2 worker processes", "in-process")
    assert here == pool == threads and here["straggler"] == 2
    assert main(["ranks", str(tmp_path)]) == 0
    assert "rank 2 is the straggler" in capsys.readouterr().out
    assert main(["ranks", str(tmp_path / "nope")]) == 3


# --- real traces ------------------------------------------------------------------------------


def _ns(us: float) -> int:
    return int((Decimal(repr(us)) * 1000).to_integral_value())


def _gloo_raw(rank: int) -> tuple[dict[int, int], dict[int, int]]:
    """Per step number: that rank's gloo:all_reduce duration and its forward->backward gap,
    both straight from the JSON."""
    ev = json.loads(gzip.decompress((GENERATED / f"ddp_gloo_rank{rank}.pt.trace.json.gz").read_bytes()))["traceEvents"]
    xs = [e for e in ev if e.get("ph") == "X"]
    steps = sorted((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), int(e["name"].split("#")[1]))
                   for e in xs if e["name"].startswith("ProfilerStep#"))
    durs, gaps = {}, {}
    for lo, hi, n in steps:
        durs[n] = next(_ns(e["dur"]) for e in xs if e["name"] == "gloo:all_reduce" and lo <= _ns(e["ts"]) < hi)
        fwd = next(e for e in xs if e["name"] == "forward" and lo <= _ns(e["ts"]) < hi)
        bwd = next(e for e in xs if e["name"] == "backward" and lo <= _ns(e["ts"]) < hi)
        gaps[n] = _ns(bwd["ts"]) - _ns(fwd["ts"]) - _ns(fwd["dur"])
    return durs, gaps


def test_gloo_pair_names_the_sleeping_rank() -> None:
    """Rank 1 sleeps 20 ms between forward and backward every step (MANIFEST.md): rank 0 waits
    for it in the gradient all-reduce. Checked against the raw gloo:all_reduce durations."""
    files = [str(GENERATED / f"ddp_gloo_rank{r}.pt.trace.json.gz") for r in (0, 1)]
    for f in files:
        tracewhy.load(f).check()
    summaries = load_rank_summaries(files)
    r = compare_ranks(summaries)
    d0, gaps0 = _gloo_raw(0)
    d1, gaps1 = _gloo_raw(1)
    # Which leading steps are warm-up is the steps analysis' call (tested there); the steps it
    # kept are the ones compared here.
    steady = sorted(set(summaries[0].steady_step_numbers) & set(summaries[1].steady_step_numbers))
    assert set(steady) <= set(d0) and r.steps_compared == len(steady) >= 5
    gap0, gap1 = (sum(g[s] for s in steady) / len(steady) for g in (gaps0, gaps1))
    assert r.straggler == 1 and r.straggler_last_share == 1.0
    # Per step the shorter all-reduce is rank 1's (it arrived last); rank 0 waited the difference.
    late = r.lateness.filter(pl.col("rank") == 1).sort("step")
    assert late.get_column("late_ns").to_list() == [float(d0[s] - d1[s]) for s in steady]
    assert all(d0[s] > d1[s] + 15_000_000 for s in steady)
    f = {x.code: x for x in rank_findings(r)}["rank-straggler"]
    assert "unrecorded gap between 'forward' and 'backward'" in f.statement
    # The sleep is unannotated: while rank 0 waited, rank 1's step thread had nothing open.
    assert f.evidence["while_waited"]["unrecorded"]["share"] > 0.8
    assert "step thread was in: nothing the profiler recorded" in f.statement
    assert f.evidence["instead"]["own_ns"] == pytest.approx(gap1, abs=1)  # the planted sleep, as recorded
    assert 20_000_000 <= gap1 < 22_000_000 and gap0 < 1_000_000


def test_128_rank_pair_agrees_with_hta_and_raw_json() -> None:
    """HTA's straggler pick for this pair is rank 1; ours too. The per-call durations we match
    are the NCCL kernels' own, read here from the raw JSON per (step, collective, order)."""
    hta = json.loads(shared_trace("hta/hta_reference_outputs.json").read_text())["pair:sampled_128rank_job"]
    files = [str(shared_trace(f"hta/sampled_128rank_job_rank{r}.json.gz")) for r in (0, 1)]
    for f in files:
        tracewhy.load(f).check()
    r = compare_ranks(load_rank_summaries(files))
    assert hta["potential_stragglers"] == [1] and r.straggler == 1
    assert r.notes == ("2 of 128 ranks: transfer and waits are relative to these ranks only",)
    raw = {rank: _nccl_calls(Path(f)) for rank, f in enumerate(files)}
    keys = sorted(set(raw[0]) & set(raw[1]))
    assert len(keys) == r.matched.height == 10
    last = [0 if raw[0][k] < raw[1][k] else 1 for k in keys]
    assert r.matched.sort("step", "op", "ordinal").get_column("last_rank").to_list() == last
    assert last.count(1) == 7
    transfer = [min(raw[0][k], raw[1][k]) for k in keys]
    assert r.matched.sort("step", "op", "ordinal").get_column("transfer_ns").to_list() == transfer


def _nccl_calls(path: Path) -> dict[tuple[int, str, int], int]:
    """(step, op, order) -> kernel duration: each NCCL kernel's launch, the nccl:<op> range on
    the launching thread around it, and the ProfilerStep around that."""
    xs = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in xs
             if e["name"].startswith("ProfilerStep#")]
    launches = {e["args"]["correlation"]: e for e in xs
                if e.get("cat") == "cuda_runtime" and "correlation" in e["args"]}
    ranges = [e for e in xs if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:")]
    found = []
    for k in (e for e in xs if e.get("cat") == "kernel" and "nccl" in e["name"]):
        call = launches[k["args"]["correlation"]]
        rng = next(g for g in ranges if g["tid"] == call["tid"] and g["ts"] <= call["ts"] <= g["ts"] + g["dur"])
        step = next(n for lo, hi, n in steps if lo <= rng["ts"] < hi)
        op = rng["name"].split(":")[1].strip("_").replace("_base", "").replace("allgather", "all_gather")
        found.append((step, rng["ts"], op, _ns(k["dur"])))
    out: dict[tuple[int, str, int], int] = {}
    for step, _, op, dur in sorted(found):
        order = sum(1 for key in out if key[0] == step and key[1] == op)
        out[(step, op, order)] = dur
    return out


def test_nsys_capture_of_two_processes_is_two_ranks() -> None:
    path = str(shared_trace("nsys/nsysai_mfu_2gpu_before.sqlite.gz"))
    summaries = load_rank_summaries([path])
    assert [(s.rank, s.rank_from) for s in summaries] == [(0, "nsys process (by GPU)"), (1, "nsys process (by GPU)")]
    r = compare_ranks(summaries)
    assert r.notes == ("not every rank has steps: calls are matched by order over the whole capture",)
    assert r.matched.height > 0
    # Each matched call's transfer is the shorter of the two ranks' durations of the call with
    # the same op and order (no steps: the whole capture).
    calls = {s.rank: s.collectives.filter(pl.col("timing") == "device").with_columns(
        pl.int_range(pl.len()).over("op").alias("ordinal")) for s in summaries}
    for m in r.matched.iter_rows(named=True):
        durs = [c.filter((pl.col("op") == m["op"]) & (pl.col("ordinal") == m["ordinal"])).row(0, named=True)["dur_ns"]
                for c in calls.values()]
        assert m["transfer_ns"] == min(durs) and m["max_wait_ns"] == max(durs) - min(durs)


def test_files_of_two_jobs_are_not_compared() -> None:
    """An A100 rank 3 of 8 and a V100 rank 1 of 2 (HTA's tracediff pair: two captures of one model,
    not one job) share step numbers 1009-1014, so today's matching pairs their collectives and
    blames one for the other's speed. Their own metadata says they are not ranks of one job."""
    a100 = str(shared_trace("hta/tracediff_control_a100_rank3of8.json.gz"))
    v100 = str(shared_trace("hta/tracediff_test_v100_rank1of2.json.gz"))
    r = compare_ranks(load_rank_summaries([a100, v100]))
    assert r.not_one_job == ("world sizes differ (rank 1: 2, rank 3: 8)",
                             "devices differ (rank 1: Tesla V100-SXM2-16GB, rank 3: NVIDIA A100-PG509-200)")
    assert r.matched.height == 0 and r.mismatches.height == 0 and r.straggler is None
    findings = rank_findings(r)
    assert [f.code for f in findings] == ["ranks-not-one-job"]
    assert "do not look like the ranks of one job" in findings[0].statement
    # The per-rank table stays: each file's own numbers are still right.
    assert r.ranks.get_column("rank").to_list() == [1, 3] and r.ranks.get_column("calls").to_list() == [0, 0]


def test_job_differences_each_refuse_the_comparison(tmp_path: Path) -> None:
    """Backend, process groups and steps each tell two jobs apart; one job's ranks pass."""
    same = [_rank(tmp_path, r, CLOCK_US[r]) for r in (0, 1)]
    assert compare_ranks(load_rank_summaries([str(p) for p in same])).not_one_job == ()
    other = tmp_path / "other"
    other.mkdir()
    p = _rank(other, 1, 5.0)
    doc = json.loads(p.read_text())
    doc["distributedInfo"]["backend"] = "gloo"
    for e in doc["traceEvents"]:
        if e.get("name") == "record_param_comms":
            e["args"]["Process Group Name"] = "7"
    p.write_text(json.dumps(doc))
    r = compare_ranks(load_rank_summaries([str(same[0]), str(p)]))
    assert r.not_one_job == ("backends differ (rank 0: nccl, rank 1: gloo)",
                             "no process group in common (rank 0: 0, rank 1: 7)")
    assert r.straggler is None and [f.code for f in rank_findings(r)] == ["ranks-not-one-job"]
