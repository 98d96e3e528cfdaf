"""``tracewhy blocks LOG``: block timers from instrument logs.

The oracle is plain Python over the raw JSON records (statistics.quantiles, sums by hand), never
tracewhy's tables. The committed logs come from a real two-process gloo pipeline
(scripts/gen_traces/pipeline.py): rank 0 times ``build`` and ``decode``, rank 1 ``compute``,
each block with its chunk. Attribution mode is checked on a log tracewhy.instrument writes here.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from conftest import GENERATED
from tracewhy import instrument
from tracewhy.analyses.log_blocks import ASYNC, CAPTURE, CHUNK, HOST, MIXED, SYNC, LogBlocksOptions, log_blocks
from tracewhy.cli import main
from tracewhy.findings.blocks import log_attribution, log_synchronized
from tracewhy.findings.codes import Code
from tracewhy.readers.instrument.reader import read_instrument_logs

LOGS = GENERATED / "pipeline"


def _raw_blocks(directory: Path) -> list[dict[str, object]]:
    return [rec for f in sorted(directory.glob("*.jsonl")) for line in f.read_text().splitlines()
            if (rec := json.loads(line))["type"] == "block"]


def _expected(records: list[dict[str, object]], warmup: int) -> dict[tuple[int, str], dict[str, float]]:
    """Per (rank, name): the steady total, mean per chunk, share of the rank's blocks and the
    inclusive-method percentiles of its time per chunk (to the nearest nanosecond, as every time
    tracewhy reports), recomputed from the records."""
    chunks: dict[int, list[int]] = {}
    for r in records:
        chunks.setdefault(int(r["rank"]), []).append(int(r["chunk"]))  # type: ignore[call-overload]
    steady = {rank: sorted(set(c))[warmup:] for rank, c in chunks.items()}
    per: dict[tuple[int, str], dict[int, int]] = {}
    for r in records:
        rank, chunk = int(r["rank"]), int(r["chunk"])  # type: ignore[call-overload]
        if chunk in steady[rank]:
            cell = per.setdefault((rank, str(r["name"])), {})
            cell[chunk] = cell.get(chunk, 0) + int(r["host_ns"])  # type: ignore[call-overload]
    rank_total = {rank: sum(sum(v.values()) for (k, _), v in per.items() if k == rank) for rank in steady}
    out = {}
    for (rank, name), values in per.items():
        q = statistics.quantiles(list(values.values()), n=100, method="inclusive")
        total = sum(values.values())
        out[(rank, name)] = {"total": total, "per_chunk": total / len(steady[rank]), "share": total / rank_total[rank],
                             "p50": round(statistics.median(values.values())), "p90": round(q[89]),
                             "p99": round(q[98])}
    return out


@pytest.mark.parametrize("depth", ["d1", "d2"])
@pytest.mark.parametrize("warmup", [1, 3])
def test_pipeline_logs_match_the_raw_records(depth: str, warmup: int) -> None:
    r = log_blocks(read_instrument_logs([LOGS / depth]), LogBlocksOptions(warmup=warmup))
    assert (r.unit, r.basis, r.warmup, r.sync) == (CHUNK, HOST, warmup, False)
    want = _expected(_raw_blocks(LOGS / depth), warmup)
    got = {(row["rank"], row["name"]): row for row in r.table.iter_rows(named=True)}
    assert set(got) == set(want) == {(0, "build"), (0, "decode"), (1, "compute")}
    for key, w in want.items():
        g = got[key]
        assert g["total_ns"] == w["total"] and g["host_total_ns"] == w["total"]
        assert g["ns_per_unit"] == pytest.approx(w["per_chunk"], rel=1e-12)
        assert g["share"] == pytest.approx(w["share"], rel=1e-12)
        assert (g["p50_ns"], g["p90_ns"], g["p99_ns"]) == (w["p50"], w["p90"], w["p99"])
        assert g["gpu_total_ns"] is None and g["sync_mode"] == ASYNC
        assert g["instances"] == g["units"] == 24 - warmup
    assert r.steady_units == {0: 24 - warmup, 1: 24 - warmup}


def test_statement_in_the_seeds_style() -> None:
    r = log_blocks(read_instrument_logs([LOGS / "d2" / "tracewhy-instrument.rank0.jsonl"]))
    want = _expected(_raw_blocks(LOGS / "d2"), 1)
    f = log_attribution(r)
    assert f is not None and f.code == Code.BLOCK_ATTRIBUTION
    order = sorted(((n, w) for (rank, n), w in want.items() if rank == 0), key=lambda x: -x[1]["total"])
    line = ", ".join(f"{n} {w['per_chunk'] / 1e6:.3g} ms ({100 * w['share']:.1f}%)" for n, w in order)
    assert f.statement.endswith(f"): {line}.")
    assert f.statement.startswith("Host time per chunk by block (mean over 23 steady chunks after 1 warm-up")
    assert log_synchronized(r) is None


def test_json_per_block(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["blocks", str(LOGS / "d1"), "--json", "--warmup", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = _expected(_raw_blocks(LOGS / "d1"), 2)
    assert doc["unit"] == "chunk" and doc["basis"] == "host" and doc["warmup"] == 2
    for b in doc["blocks"]:
        w = want[(b["rank"], b["name"])]
        assert b["total_ns"] == w["total"] and b["share"] == pytest.approx(w["share"], rel=1e-12)
        assert b["p50_ns"] == w["p50"] and b["sync_mode"] == "async"
    assert [f["code"] for f in doc["findings"]] == ["block-attribution"]


def test_the_terminal_names_the_basis_and_the_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["blocks", str(LOGS / "d2"), "--names", "b*,compute"]) == 0
    out = capsys.readouterr().out
    assert "host time per chunk" in out and "build" in out and "compute" in out and "decode" not in out


def _write(directory: Path, sync: bool, steps: int = 4, unsynced_decode: bool = False) -> Path:
    rec = instrument.configure(directory, rank=0, world_size=1, sync=sync)
    for step in range(steps):
        rec.next_step(step)
        with rec.block("denoise"):
            time.sleep(0.003)
        with rec.block("decode", sync=False if unsynced_decode else None):
            time.sleep(0.001)
    return rec.flush()


def test_attribution_mode_log_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, sync=True)
    r = log_blocks(read_instrument_logs([path]))
    assert r.unit == "step" and r.sync and r.synced_instances == r.instances == 6
    assert set(r.table.get_column("sync_mode").to_list()) == {SYNC}
    f = log_synchronized(r)
    assert f is not None and f.code == Code.BLOCKS_SYNCHRONIZED and "attribution mode (sync=True)" in f.statement
    assert main(["blocks", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in doc["findings"]] == ["blocks-synchronized", "block-attribution"]
    assert {b["sync_mode"] for b in doc["blocks"]} == {"sync"}
    raw = [json.loads(x) for x in path.read_text().splitlines()][1:]
    denoise = sorted(x["host_ns"] for x in raw if x["name"] == "denoise" and x["step"] >= 1)
    row = r.table.filter(r.table.get_column("name") == "denoise").row(0, named=True)
    assert row["total_ns"] == sum(denoise) and row["p50_ns"] == statistics.median(denoise)


def test_a_block_opting_out_of_sync_makes_it_mixed(tmp_path: Path) -> None:
    rec = instrument.configure(tmp_path, rank=0, world_size=1)
    for step in range(3):
        rec.next_step(step)
        with rec.block("fwd", sync=step % 2 == 1):
            pass
    r = log_blocks(read_instrument_logs([rec.flush()]), LogBlocksOptions(warmup=0))
    assert r.table.get_column("sync_mode").to_list() == [MIXED] and r.synced_instances == 1
    assert log_synchronized(r) is not None


def test_hand_written_log_without_steps_is_one_unit(tmp_path: Path) -> None:
    f = tmp_path / "timers.jsonl"
    f.write_text('{"type": "block", "name": "fwd", "host_ns": 30}\n{"type": "block", "name": "bwd", "host_ns": 60}\n'
                 '{"type": "block", "name": "fwd", "host_ns": 10, "gpu_ns": 5}\n')
    r = log_blocks(read_instrument_logs([f]), LogBlocksOptions(warmup=5))
    assert (r.unit, r.warmup, r.basis) == (CAPTURE, 0, HOST)
    rows = {row["name"]: row for row in r.table.iter_rows(named=True)}
    assert rows["bwd"]["total_ns"] == 60 and rows["fwd"]["total_ns"] == 40 and rows["fwd"]["gpu_total_ns"] == 5
    assert rows["bwd"]["share"] == 0.6 and rows["bwd"]["gpu_total_ns"] is None
    f2 = log_attribution(r)
    assert f2 is not None and "over the log (no steps or chunks)" in f2.statement


def test_gpu_times_are_the_basis_when_every_block_has_one(tmp_path: Path) -> None:
    f = tmp_path / "gpu.rank0.jsonl"
    f.write_text("".join(f'{{"type": "block", "step": {s}, "name": "{n}", "host_ns": 1000, "gpu_ns": {g}}}\n'
                         for s in range(3) for n, g in (("denoise", 300 + s), ("decode", 100))))
    r = log_blocks(read_instrument_logs([f]))
    assert r.basis == "gpu"
    rows = {row["name"]: row for row in r.table.iter_rows(named=True)}
    assert rows["denoise"]["total_ns"] == 301 + 302 and rows["denoise"]["host_total_ns"] == 2000
    assert rows["decode"]["share"] == pytest.approx(200 / 803)


def test_step_option_is_refused_for_logs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["blocks", str(LOGS / "d1"), "--step", "x"]) == 2
    assert "--step" in capsys.readouterr().err
