"""Block attribution on an inline trace worked out by hand, and on real traces against sums
taken straight from the raw JSON."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import tracewhy
from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from tracewhy.analyses import blocks as blocks_module
from tracewhy.analyses.blocks import BlocksOptions, blocks
from tracewhy.analyses.nvtx import gpu_projection
from tracewhy.analyses.nvtx_work import gpu_work
from tracewhy.cli import main
from tracewhy.findings import thresholds as th
from tracewhy.findings.blocks import attribution, synchronized_blocks


def _pipeline(tmp_path: Path, sync_every_block: bool = False) -> tracewhy.Trace:
    """Three 1000 µs steps. In each, at offset o (µs):

    main thread:  denoise [o+10, o+400) launches k1 at o+20 (GPU [o+100, o+300)) and, inside
                  attn [o+25, o+35), k2 at o+30 (GPU [o+300, o+350));
                  decode [o+400, o+600) launches k3 at o+410 (GPU [o+450, o+550)), then
                  cudaDeviceSynchronize at o+420.
    thread 200:   launches k4 at o+500 (GPU [o+600, o+650)) while decode is open.
    sync_every_block adds a cudaDeviceSynchronize at o+36, right after attn and inside denoise.
    """
    b = KinetoBuilder()
    for i in range(3):
        o = 1000.0 * i
        b.annotation(f"ProfilerStep#{i}", o, 1000)
        b.annotation("denoise", o + 10, 390)
        b.launch("k1_gemm", o + 20, 2, gpu_ts=o + 100, gpu_dur=200)
        b.annotation("attn", o + 25, 10)
        b.launch("k2_flash_attn", o + 30, 2, gpu_ts=o + 300, gpu_dur=50)
        if sync_every_block:
            b.op("cudaDeviceSynchronize", o + 36, 300, cat="cuda_runtime")
        b.annotation("decode", o + 400, 200)
        b.launch("k3_decode", o + 410, 2, gpu_ts=o + 450, gpu_dur=100)
        b.op("cudaDeviceSynchronize", o + 420, 150, cat="cuda_runtime")
        b.launch("k4_other_thread", o + 500, 2, gpu_ts=o + 600, gpu_dur=50, tid=200)
    trace = tracewhy.load(b.write(tmp_path / "pipeline.json"))
    trace.check()
    return trace


def test_block_table_by_hand(tmp_path: Path) -> None:
    r = blocks(_pipeline(tmp_path), BlocksOptions(warmup=0))
    assert r.steps == 3 and r.gpu_time_ns_per_step == 400_000  # k1 200 + k2 50 + k3 100 + k4 50
    rows = {row["name"]: row for row in r.table.iter_rows(named=True)}
    assert list(rows) == ["denoise", "decode", "attn"]  # most GPU time first
    d, a, c = rows["denoise"], rows["attn"], rows["decode"]
    # denoise owns k1 and k2 (k2 through attn, which is on the same stack): 250 µs of 400.
    assert (d["gpu_time_ns_per_step"], d["gpu_share"], d["gpu_span_ns_per_step"]) == (250_000, 0.625, 250_000)
    assert (a["gpu_time_ns_per_step"], a["gpu_share"], a["level"], d["level"]) == (50_000, 0.125, 2, 1)
    # decode owns k3; k4 ran from another thread while decode was open: counted apart.
    assert (c["gpu_time_ns_per_step"], c["other_threads_gpu_ns_per_step"]) == (100_000, 50_000)
    assert (d["cpu_ns_per_step"], c["cpu_ns_per_step"], c["instances"]) == (390_000, 200_000, 3)
    # Only decode's last launch is followed by a synchronize.
    assert {n: (row["synced_instances"], row["gpu_instances"]) for n, row in rows.items()} == {
        "denoise": (0, 3), "attn": (0, 3), "decode": (3, 3)}
    assert r.synced_share == pytest.approx(3 / 9)
    assert synchronized_blocks(r) is None


def test_sync_after_every_block_is_said(tmp_path: Path) -> None:
    r = blocks(_pipeline(tmp_path, sync_every_block=True), BlocksOptions(warmup=0))
    assert r.synced_share == 1.0
    f = synchronized_blocks(r)
    assert f is not None and f.code == "blocks-synchronized"
    # attn and denoise end at the same synchronize (two per step, six over the three steps).
    assert r.ending_syncs == 6
    assert f.statement.startswith("A synchronize ends 9 of 9 annotated blocks that launched GPU work "
                                  "(100%; 2 synchronizes per step)")
    assert th.BLOCKS_SYNCED_MIN_SHARE <= 1.0


def test_attribution_statement(tmp_path: Path) -> None:
    f = attribution(blocks(_pipeline(tmp_path), BlocksOptions(warmup=0)))
    assert f is not None
    # The outermost blocks only (attn is inside denoise).
    assert f.statement.startswith(
        "GPU time per step by annotated block (the top 2 of 2 tabled): denoise leads with 250.0 µs (62.5%).")
    assert [(b["name"], b["gpu_share"]) for b in f.evidence["blocks"]] == [("denoise", 0.625), ("decode", 0.25)]


def test_names_filter(tmp_path: Path) -> None:
    r = blocks(_pipeline(tmp_path), BlocksOptions(names=("de*",), warmup=0))
    assert r.table.get_column("name").to_list() == ["denoise", "decode"]
    assert r.gpu_time_ns_per_step == 400_000  # shares stay shares of all GPU time


def test_cli_blocks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _pipeline(tmp_path, sync_every_block=True)
    path = str(tmp_path / "pipeline.json")
    assert main(["blocks", path, "--warmup", "0", "--names", "denoise,decode"]) == 0
    out = capsys.readouterr().out
    assert "denoise leads with 250.0 µs (62.5%)" in out
    assert "attribution, not throughput" in out
    assert main(["blocks", path, "--warmup", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "blocks" and doc["synced_share"] == 1.0
    assert [b["name"] for b in doc["blocks"]] == ["denoise", "decode", "attn"]
    assert {f["code"] for f in doc["findings"]} == {"blocks-synchronized", "block-attribution"}


def _ns(us: float) -> int:
    return int((Decimal(repr(us)) * 1000).to_integral_value())


def test_a100_blocks_match_raw_json_sums() -> None:
    """GPU time per step of '## forward ##' and '## optimizer ##' recomputed from the raw
    events: runtime calls on the range's thread inside the range, their GPU events by
    correlation; steady steps 4, 5 and 6. Step 4 is not warm-up: the capture's first step is
    iteration 4 of the run, and it lasts what the others do (analyses/warmup.default_warmup)."""
    path = shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz")
    r = blocks(tracewhy.load(path))
    assert r.steps == 3
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    xs = [e for e in ev if e.get("ph") == "X"]
    steps = {e["name"]: (_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))
             for e in xs if e["name"].startswith("ProfilerStep#")}
    lo, hi = steps["ProfilerStep#4"][0], steps["ProfilerStep#6"][1]
    gpu = {e["args"]["correlation"]: _ns(e["dur"]) for e in xs
           if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "correlation" in e["args"]}
    calls = [(e["tid"], _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), e["args"]["correlation"]) for e in xs
             if e.get("cat") == "cuda_runtime" and "correlation" in e["args"]]
    rows = {row["name"]: row for row in r.table.iter_rows(named=True)}
    for name in ("## forward ##", "## optimizer ##"):
        total = 0
        for e in xs:
            if e["name"] != name or not lo <= _ns(e["ts"]) < hi:
                continue
            s, t = _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])
            total += sum(gpu.get(c, 0) for tid, cs, ce, c in calls if tid == e["tid"] and s <= cs and ce <= t)
        assert total > 0
        assert rows[name]["gpu_time_ns_per_step"] == pytest.approx(total / 3)
    # The backward block launches nearly nothing itself: autograd's thread does it while it is open.
    bwd = rows["## backward ##"]
    assert bwd["other_threads_gpu_ns_per_step"] > 100 * bwd["gpu_time_ns_per_step"]


def test_cpu_blocks_match_raw_annotation_sums() -> None:
    path = GENERATED / "cpu_eager_schedule.pt.trace.json.gz"
    r = blocks(tracewhy.load(path))
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    ann = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    steps = sorted((_ns(e["ts"]), e["name"]) for e in ann if e["name"].startswith("ProfilerStep#"))
    # All 5 steps are steady: under schedule(wait=1, warmup=1) the first recorded step is
    # ProfilerStep#2, two iterations into the run, and in line with the others.
    steady_from = steps[0][0]
    rows = {row["name"]: row for row in r.table.iter_rows(named=True)}
    assert r.steps == 5 and r.gpu_time_ns_per_step == 0
    for name in ("forward", "backward", "optimizer"):
        total = sum(_ns(e["dur"]) for e in ann if e["name"] == name and _ns(e["ts"]) >= steady_from)
        assert rows[name]["cpu_ns_per_step"] == pytest.approx(total / 5)
        assert rows[name]["gpu_share"] is None and rows[name]["gpu_instances"] == 0
    assert attribution(r) is None


def test_nsys_emit_nvtx_names_are_blocks_not_instances() -> None:
    # emit_nvtx names every op range "name, seq = N, op_id = N": one block per name, not per call.
    r = blocks(tracewhy.load(shared_trace("nsys/nsysai_mfu_2gpu_before.sqlite.gz")))
    names = r.table.get_column("name").to_list()
    assert "FlashAttnFunc" in names and not any("op_id =" in n for n in names)
    assert r.table.filter(pl.col("name") == "FlashAttnFunc").row(0, named=True)["instances"] > 1


def test_blocks_without_instances_and_in_small_sync_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """diagnose asks for the table alone; ``_sync_ends`` walks the ranges a chunk at a time, and
    the instances' columns are made and summed per name a chunk at a time (``_chunks``). With
    every chunk 7 ranges (ranges of one thread split across chunks, a name's sums added over
    hundreds of chunks), and without the per-range instances, the table is the same as from one
    chunk, and the synced flags and steps of a real export are too."""
    trace = tracewhy.load(shared_trace("nsys/nsysai_mfu_2gpu_before.sqlite.gz"))
    whole = blocks(trace)
    assert whole.instances.get_column("synced").sum() > 0
    stepped = tracewhy.load(shared_trace("hta/v100_ddp2_rank1_memprofile.json.gz"))
    one_chunk = blocks(stepped)
    with_steps, stepped_table = one_chunk.instances, one_chunk.table
    assert with_steps.get_column("step").n_unique() > 2 and with_steps.get_column("steady").any()
    monkeypatch.setattr(blocks_module, "_SYNC_CHUNK", 7)
    monkeypatch.setattr(blocks_module, "_CHUNK", 7)
    chunked = blocks(stepped)
    assert_frame_equal(chunked.instances, with_steps)
    assert_frame_equal(chunked.table, stepped_table)
    lean = blocks(trace, BlocksOptions(instances=False))
    assert lean.instances.height == 0 and lean.instances.schema == whole.instances.schema
    assert_frame_equal(lean.table, whole.table)
    assert_frame_equal(blocks(trace).instances, whole.instances)


def test_gpu_work_shared_by_blocks_and_projection() -> None:
    """Given the GPU work already measured, blocks and the full projection come out the same as
    when each measures it itself (diagnose and the report share one)."""
    trace = tracewhy.load(shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz"))
    work = gpu_work(trace)
    assert_frame_equal(blocks(trace, work=work).instances, blocks(trace).instances)
    shared, alone = gpu_projection(trace, work), gpu_projection(trace)
    assert_frame_equal(shared.table, alone.table)
    assert shared.unattributed == alone.unattributed
    # Every projected range's GPU time is its block instance's.
    inst = blocks(trace, work=work).instances.filter(pl.col("gpu_ops") > 0)
    by_id = dict(zip(alone.table.get_column("id").to_list(), alone.table.get_column("gpu_time_ns").to_list(),
                     strict=True))
    assert inst.height and all(by_id[i] == t for i, t in inst.select("id", "gpu_time_ns").iter_rows())
