"""``tracewhy.instrument``: block timers and stage clocks write the documented JSON Lines, the
reader takes them back (and hand-written logs in the same format), and a block is visible to
the profiler as a ``record_function`` of the same name."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracewhy import instrument
from tracewhy.model.instrument import LogBlockCol, MarkCol
from tracewhy.model.schema import Col, Kind
from tracewhy.readers import read_trace
from tracewhy.readers.instrument.reader import read_instrument_logs
from tracewhy.readers.instrument.sniff import looks_like_instrument_log


def test_blocks_and_marks_round_trip(tmp_path: Path) -> None:
    rec = instrument.configure(tmp_path, rank=3, world_size=4)
    for step in range(3):
        rec.next_step(step)
        with instrument.block("outer"), instrument.block("inner", chunk=step):
            time.sleep(0.002)
        instrument.StageClock(rec).mark("tA0", chunk=step)

    @instrument.block("decorated")
    def work(x: int) -> int:
        return x + 1

    assert work(1) == 2
    path = instrument.flush()
    assert path == tmp_path / "tracewhy-instrument.rank3.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["rank"] == 3 and lines[0]["world_size"] == 4
    assert lines[0]["clock"] == "perf_counter_ns" and lines[0]["sync"] is False
    blocks = [x for x in lines if x["type"] == "block"]
    inner = [b for b in blocks if b["name"] == "inner"]
    outer = [b for b in blocks if b["name"] == "outer"]
    assert [b["step"] for b in inner] == [0, 1, 2] and [b["chunk"] for b in inner] == [0, 1, 2]
    assert all(b["depth"] == 1 and b["host_ns"] >= 2_000_000 and b["gpu_ns"] is None for b in inner)
    assert all(o["depth"] == 0 and o["start_ns"] <= i["start_ns"] and o["host_ns"] >= i["host_ns"]
               for o, i in zip(outer, inner, strict=True))
    log = read_instrument_logs([tmp_path])
    assert log.ranks == [3] and log.headers[0].present and not log.sync
    assert log.blocks.filter(log.blocks[LogBlockCol.NAME] == "decorated").height == 1
    assert log.marks.get_column(MarkCol.CHUNK).to_list() == [0, 1, 2]
    assert looks_like_instrument_log(path) and looks_like_instrument_log(tmp_path)


def test_attribution_mode_is_recorded(tmp_path: Path) -> None:
    rec = instrument.configure(tmp_path, rank=0, world_size=1, sync=True)
    with rec.block("synced"):
        pass
    with rec.block("not synced", sync=False):
        pass
    rec.flush()
    log = read_instrument_logs([rec.path])
    assert log.sync and log.headers[0].sync
    assert log.blocks.get_column(LogBlockCol.SYNC).to_list() == [True, True]  # the header's mode covers every block


def test_a_block_is_a_record_function_under_the_profiler(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")  # (a CPU build is enough; without torch this test is skipped)
    rec = instrument.configure(tmp_path, rank=0, world_size=1)
    trace_file = tmp_path / "t.pt.trace.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, \
            rec.block("tracewhy_block_under_profiler"):
        torch.ones(64, 64) @ torch.ones(64, 64)
    with rec.block("outside_the_profiler"):
        pass
    prof.export_chrome_trace(str(trace_file))
    t = read_trace(trace_file)
    names = set(t.of_kind(Kind.ANNOTATION).get_column(Col.NAME).cast(str).to_list())
    assert "tracewhy_block_under_profiler" in names
    assert "outside_the_profiler" not in names


def test_importing_instrument_does_not_import_torch() -> None:
    code = "import sys, tracewhy.instrument as ti; print('torch' in sys.modules, 'polars' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_without_torch_blocks_still_time(tmp_path: Path) -> None:
    code = (
        "import sys, time, tracewhy.instrument as ti\n"
        f"r = ti.configure({str(tmp_path)!r}, rank=0, world_size=1)\n"
        "with ti.block('b'): time.sleep(0.001)\n"
        "print(r.flush())\n"
    )
    path = Path(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip())
    log = read_instrument_logs([path])
    assert log.blocks.get_column(LogBlockCol.HOST).to_list()[0] >= 1_000_000
    assert log.headers[0].versions.get("torch") is None


def test_hand_written_logs_and_rank_from_the_name(tmp_path: Path) -> None:
    f = tmp_path / "timers_rank5.jsonl"
    f.write_text('{"type": "block", "name": "fwd", "host_ns": 10, "extra": "ignored"}\n'
                 '{"type": "block", "name": "bwd", "host_ns": 20, "step": 1}\n')
    log = read_instrument_logs([f])
    assert log.ranks == [5] and log.blocks.height == 2
    assert any("no header" in w for w in log.warnings)


@pytest.mark.parametrize("content, problem", [
    (b"", "no block or mark records"),
    (b"\xff\xfe binary", "not an instrument log"),
    (b'{"type": "block", "name": "x", "host_ns": -5}\n', "negative time"),
    (b'{"type": "mark", "rank": 0, "chunk": 1, "name": "a", "t_ns": 1}\n'
     b'{"type": "mark", "rank": 1, "chunk": 1, "name": "b", "t_ns": 1}\n', "one log per rank"),
])
def test_bad_logs_name_the_file(tmp_path: Path, content: bytes, problem: str) -> None:
    from tracewhy.errors import TraceError

    f = tmp_path / "bad.jsonl"
    f.write_bytes(content)
    with pytest.raises(TraceError, match=problem) as e:
        read_instrument_logs([f])
    assert str(f) in str(e.value)


def test_no_record_is_lost_to_a_flush_from_another_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads timing blocks while the list fills and flushes (every 50 records here): every
    block written, none twice."""
    import importlib
    import threading

    rec_module = importlib.import_module("tracewhy.instrument.recorder")  # the module, not the function
    monkeypatch.setattr(rec_module, "_FLUSH_EVERY", 50)
    rec = instrument.configure(tmp_path, rank=0, world_size=1)

    def work(t: int) -> None:
        for i in range(2000):
            with rec.block(f"t{t}", step=i):
                pass

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: the lost-record window is a few bytecodes
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    rec.flush()
    log = read_instrument_logs([rec.path])
    counts = log.blocks.group_by(LogBlockCol.NAME).len().sort(LogBlockCol.NAME).get_column("len").to_list()
    assert counts == [2000] * 4
    assert log.blocks.unique([LogBlockCol.NAME, LogBlockCol.STEP]).height == 8000
