"""``tracewhy pipeline``: period, stage work, hidden time and OverlapScore from stage marks.

The oracle is the formula applied in plain Python to the raw JSON records of the logs, never
tracewhy's own tables; the committed logs come from a real two-process gloo pipeline
(scripts/gen_traces/pipeline.py) at in-flight depth 1 (serialized) and 2 (overlapped).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import GENERATED
from tracewhy.analyses.pipeline import ChunkCol, parse_stages, pipeline
from tracewhy.cli import main
from tracewhy.errors import TraceError, UsageError
from tracewhy.findings.pipeline import FAIL, OVERLAPPED, PASS, SERIALIZED, judge
from tracewhy.readers.instrument.reader import read_instrument_logs

LOGS = GENERATED / "pipeline"


def _raw_marks(directory: Path) -> dict[str, dict[int, int]]:
    """name -> chunk -> t_ns, straight from the JSON lines."""
    out: dict[str, dict[int, int]] = {}
    for f in sorted(directory.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec["type"] == "mark":
                out.setdefault(rec["name"], {}).setdefault(rec["chunk"], rec["t_ns"])
    return out


def _expected(m: dict[str, dict[int, int]], k: int) -> dict[str, float | None]:
    stage0 = (m["tA1"][k] - m["tA0"][k]) + (m["tEmit"][k] - m["tDecode"][k])
    stage1 = m["tB1"][k] - m["tB0"][k]
    period = m["tEmit"][k] - m["tEmit"][k - 1] if k - 1 in m["tEmit"] else None
    hidden = None if period is None else stage0 + stage1 - period
    score = None if hidden is None else min(1.0, max(0.0, hidden / min(stage0, stage1)))
    return {"stage0_ns": stage0, "stage1_ns": stage1, "period_ns": period, "hidden_ns": hidden, "overlap_score": score}


@pytest.mark.parametrize("depth", ["d1", "d2"])
def test_every_chunk_equals_the_formulas_on_the_raw_records(depth: str) -> None:
    raw = _raw_marks(LOGS / depth)
    r = pipeline(read_instrument_logs([LOGS / depth]))
    assert r.chunks.height == len(raw["tEmit"]) >= 20
    for row in r.chunks.iter_rows(named=True):
        want = _expected(raw, row[ChunkCol.CHUNK])
        for key, value in want.items():
            assert row[key] == pytest.approx(value, abs=1e-12) if isinstance(value, float) else row[key] == value, key
    assert r.stage_ranks == {"stage0": 0, "stage1": 1, "period": 0}


def test_depth_two_overlaps_where_depth_one_serializes(capsys: pytest.CaptureFixture[str]) -> None:
    v1, findings1 = judge(pipeline(read_instrument_logs([LOGS / "d1"])))
    v2, findings2 = judge(pipeline(read_instrument_logs([LOGS / "d2"])))
    assert (v1.verdict, v1.gate) == (SERIALIZED, FAIL)
    assert (v2.verdict, v2.gate) == (OVERLAPPED, PASS)
    assert v1.median_overlap_score is not None and v2.median_overlap_score is not None
    assert v1.median_overlap_score < 0.3 <= v2.median_overlap_score
    assert [f.code for f in findings1][:1] == ["pipeline-serialized"]
    assert "pipeline-serialized" not in [f.code for f in findings2]
    # The CLI gate: exit 1 on D=1, 0 on D=2; the comparison calls the period change real.
    assert main(["pipeline", str(LOGS / "d1")]) == 1
    assert "serialized" in capsys.readouterr().out
    assert main(["pipeline", str(LOGS / "d2"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "overlapped" and doc["gate"] == "pass" and doc["critical_stage"] == "stage1"
    assert {"period_ns", "stage0_ns", "stage1_ns", "hidden_ns", "overlap_score"} <= set(doc["chunks"][0])
    assert main(["pipeline", str(LOGS / "d1"), "--vs", str(LOGS / "d2")]) == 1
    out = capsys.readouterr().out
    assert "B vs A: period" in out and "a real change" in out
    assert "never compared" in out


def _write(tmp: Path, rank: int, marks: list[tuple[int, str, int]], header: bool = True) -> Path:
    f = tmp / f"tracewhy-instrument.rank{rank}.jsonl"
    lines = [json.dumps({"type": "header", "rank": rank, "world_size": 2})] if header else []
    lines += [json.dumps({"type": "mark", "rank": rank, "chunk": c, "name": n, "t_ns": t}) for c, n, t in marks]
    f.write_text("\n".join(lines) + "\n")
    return f


def test_known_timestamps_give_exact_values(tmp_path: Path) -> None:
    # Rank 0: build 10, decode 5, emit every 20 ns; rank 1: compute 12 ns. Rank 1's clock is
    # offset by 10**9 ns: nothing may compare it with rank 0's.
    r0: list[tuple[int, str, int]] = []
    r1: list[tuple[int, str, int]] = []
    for k in range(6):
        base = 100 * k
        r0 += [(k, "tA0", base), (k, "tA1", base + 10), (k, "tDecode", base + 40), (k, "tEmit", base + 45)]
        r1 += [(k, "tB0", 10**9 + base + 12), (k, "tB1", 10**9 + base + 24)]
    _write(tmp_path, 0, r0)
    _write(tmp_path, 1, r1, header=False)
    r = pipeline(read_instrument_logs([tmp_path]), warmup=1)
    rows = r.chunks.to_dicts()
    assert rows[0]["period_ns"] is None and rows[1]["period_ns"] == 100
    assert all(row["stage0_ns"] == 15 and row["stage1_ns"] == 12 for row in rows)
    assert rows[1]["hidden_ns"] == 15 + 12 - 100 and rows[1]["overlap_score"] == 0.0
    assert [row["steady"] for row in rows] == [False] + [True] * 5
    assert r.summary["period_ns"].p50 == 100 and r.summary["period_ns"].count == 5


def test_stage_map_and_its_errors(tmp_path: Path) -> None:
    _write(tmp_path, 0, [(k, n, 30 * k + d) for k in range(5) for n, d in (("load", 0), ("loaded", 8))])
    _write(tmp_path, 1, [(k, n, 30 * k + d) for k in range(5) for n, d in (("run", 2), ("ran", 22))])
    log = read_instrument_logs([tmp_path])
    spec = parse_stages("io=load:loaded, gpu=run:ran", "loaded")
    r = pipeline(log, spec, warmup=0)
    assert r.chunks.get_column("io_ns").to_list() == [8] * 5
    assert r.chunks.get_column("gpu_ns").to_list() == [20] * 5
    # period 30, sum 28, longest 20: hidden -2, score 0.
    assert r.chunks.get_column("overlap_score").drop_nulls().to_list() == [0.0] * 4
    with pytest.raises(UsageError, match="one rank"):
        pipeline(log, parse_stages("x=load:ran,y=run:loaded", "loaded"))
    with pytest.raises(UsageError, match="no log has"):
        pipeline(log)  # the default tA0... marks are absent
    for bad in ("x=load", "x=load:loaded", "x=a:b,x=c:d"):
        with pytest.raises(UsageError):
            parse_stages(bad, "loaded")


def test_bad_logs_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b"\x00\x01 not json\n{\"type\": \"mark\", \"chunk\": \"x\"}\n")
    assert main(["pipeline", str(junk)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an instrument log" in err[0]
    # A cut last line and an unknown record type are skipped with a warning, the rest is read.
    (tmp_path / "ok").mkdir()
    good = _write(tmp_path / "ok", 0, [(k, "tA0", k) for k in range(3)])
    good.write_text(good.read_text() + '{"type": "other"}\n{"type": "mark", "chunk": 9, "na')
    log = read_instrument_logs([good])
    assert log.marks.height == 3
    assert log.warnings and "2 lines are not instrument records" in log.warnings[0]
    # One rank given twice: refused, not silently merged.
    with pytest.raises(TraceError, match="rank 0 is also in"):
        read_instrument_logs([good, good])
    assert main(["pipeline", str(tmp_path / "ok"), "--min-overlap", "30"]) == 2
