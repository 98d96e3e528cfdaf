"""Hostile instrument logs for ``pipeline`` and ``blocks``, each built in tmp_path from the real
two-process gloo pipeline logs (scripts/gen_traces/pipeline.py, in-flight depth 1: serialized).

Every case once ended in an internal error (exit 70), a hang, or a wrong verdict with exit 0.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from conftest import GENERATED
from tracewhy.cli import main
from tracewhy.readers.instrument.reader import read_instrument_logs

SERIAL = GENERATED / "pipeline" / "d1"
HUGE = 99999999999999999999999


def _records(name: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in (SERIAL / name).read_text().splitlines()]


def _copy(tmp: Path, edit0=None, edit1=None) -> Path:  # type: ignore[no-untyped-def]
    """The serialized pipeline's two rank logs in ``tmp/logs``, each record list passed through an edit."""
    out = tmp / "logs"
    out.mkdir()
    for name, edit in (("tracewhy-instrument.rank0.jsonl", edit0), ("tracewhy-instrument.rank1.jsonl", edit1)):
        recs = _records(name)
        if edit is not None:
            recs = edit(recs)
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    return out


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(("kind", "field"), [("mark", "t_ns"), ("mark", "chunk"), ("mark", "rank"),
                                             ("block", "host_ns"), ("block", "gpu_ns"), ("block", "depth")])
def test_an_integer_past_int64_skips_its_line_with_a_warning(tmp_path: Path, kind: str, field: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    def edit(recs: list[dict[str, object]]) -> list[dict[str, object]]:
        first = next(r for r in recs if r["type"] == kind)
        first[field] = HUGE
        return recs

    logs = _copy(tmp_path, edit0=edit)
    log = read_instrument_logs([logs])
    assert any("1 lines are not instrument records" in w for w in log.warnings)
    for command in ("pipeline", "blocks"):
        assert main([command, str(logs)]) in (0, 1)
        assert "internal error" not in capsys.readouterr().err


def test_a_rank_past_int64_in_the_file_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = [r for r in _records("tracewhy-instrument.rank1.jsonl") if r["type"] != "header"]
    for r in recs:
        r.pop("rank", None)
    f = tmp_path / f"x.rank{HUGE}.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main(["blocks", str(f)]) == 3
    assert "outside the 64-bit integers" in _one_line_error(capsys)


def test_invalid_utf8_and_deep_nesting_skip_their_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs = _copy(tmp_path)
    f = logs / "tracewhy-instrument.rank0.jsonl"
    deep = b"[" * 100_000 + b"]" * 100_000
    f.write_bytes(f.read_bytes() + b'{"type":"mark","rank":0,"chunk":99,"name":"\xff\xfe","t_ns":5}\n'
                  + b'{"type":"mark","rank":0,"chunk":98,"name":"tA0","t_ns":5,"extra":' + deep + b"}\n")
    log = read_instrument_logs([logs])
    assert any("2 lines are not instrument records" in w for w in log.warnings)
    assert main(["pipeline", str(logs)]) == 1  # still the serialized pipeline
    assert "internal error" not in capsys.readouterr().err


def test_a_mark_named_chunk_does_not_break_the_table(tmp_path: Path) -> None:
    def edit(recs: list[dict[str, object]]) -> list[dict[str, object]]:
        extra = [{"type": "mark", "rank": 0, "chunk": r["chunk"], "name": "chunk", "t_ns": r["t_ns"]}
                 for r in recs if r.get("name") == "tA0"]
        return recs + extra

    assert main(["pipeline", str(_copy(tmp_path, edit0=edit))]) == 1  # the serialized pipeline it was


def _run_with_deadline(argv: list[str], seconds: float) -> int | None:
    """main(argv) in a daemon thread; None when it has not returned within ``seconds`` (a hang)."""
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(main(argv)), daemon=True)
    t.start()
    t.join(seconds)
    return result[0] if result else None


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(), reason="needs FIFOs and /dev/zero")
@pytest.mark.parametrize("special", ["fifo", "dev_zero"])
def test_a_pipe_or_device_in_a_log_directory_is_refused(tmp_path: Path, special: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    logs = _copy(tmp_path)
    odd = logs / "tracewhy-instrument.rank7.jsonl"
    if special == "fifo":
        os.mkfifo(odd)
    else:
        odd.symlink_to("/dev/zero")
    assert _run_with_deadline(["pipeline", str(logs)], 60) == 3
    assert "not a regular file" in _one_line_error(capsys)


def _shift(names: set[str], by: int, chunks: set[int] | None = None):  # type: ignore[no-untyped-def]
    def edit(recs: list[dict[str, object]]) -> list[dict[str, object]]:
        for r in recs:
            if r["type"] == "mark" and r["name"] in names and (chunks is None or r["chunk"] in chunks):
                r["t_ns"] = int(r["t_ns"]) + by  # type: ignore[call-overload]
        return recs
    return edit


def test_marks_going_backwards_everywhere_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # tA1 a second before tA0 in every chunk: stage0 is negative, nothing is measurable.
    logs = _copy(tmp_path, edit0=_shift({"tA1"}, -10**9))
    assert main(["pipeline", str(logs)]) == 3
    assert "negative" in _one_line_error(capsys)


def test_marks_going_backwards_in_some_chunks_are_left_out_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs = _copy(tmp_path, edit0=_shift({"tA1"}, -10**9, {5, 6}))
    assert main(["pipeline", str(logs), "--json"]) == 1  # the rest is the serialized pipeline it was
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["verdict"] == "serialized"
    assert 5 not in [c["chunk"] for c in doc["chunks"]]
    assert "chunks 5, 6" in captured.err and "negative" in captured.err


def test_chunk_numbers_counting_down_do_not_make_a_serialized_pipeline_overlapped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    last = max(int(r["chunk"]) for r in _records("tracewhy-instrument.rank0.jsonl") if r["type"] == "mark")

    def down(recs: list[dict[str, object]]) -> list[dict[str, object]]:
        for r in recs:
            if r.get("chunk") is not None:
                r["chunk"] = last - int(r["chunk"])  # type: ignore[call-overload]
        return recs

    assert main(["pipeline", str(_copy(tmp_path, edit0=down, edit1=down)), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "serialized" and doc["gate"] == "fail"


def test_duplicate_marks_that_disagree_leave_their_chunk_out(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    def dup(recs: list[dict[str, object]]) -> list[dict[str, object]]:
        emit = next(r for r in recs if r.get("name") == "tEmit" and r["chunk"] == 7)
        same = next(r for r in recs if r.get("name") == "tEmit" and r["chunk"] == 8)
        return [*recs, {**emit, "t_ns": int(emit["t_ns"]) + 5_000_000}, dict(same)]  # type: ignore[call-overload]

    assert main(["pipeline", str(_copy(tmp_path, edit0=dup)), "--json"]) == 1
    captured = capsys.readouterr()
    chunks = [c["chunk"] for c in json.loads(captured.out)["chunks"]]
    assert 7 not in chunks and 8 in chunks
    assert "chunks 7" in captured.err and "disagree" in captured.err


def test_stage_sums_that_pass_int64_are_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    top = (1 << 63) - 1

    def wrap(recs: list[dict[str, object]]) -> list[dict[str, object]]:
        for r in recs:
            if r["type"] == "mark" and r["chunk"] == 4:
                r["t_ns"] = {"tA0": 0, "tA1": top, "tDecode": 0, "tEmit": top}.get(str(r["name"]), r["t_ns"])
        return recs

    assert main(["pipeline", str(_copy(tmp_path, edit0=wrap)), "--json"]) == 1
    captured = capsys.readouterr()
    assert 4 not in [c["chunk"] for c in json.loads(captured.out)["chunks"]]
    assert "64-bit" in captured.err


def test_an_unmeasurable_gate_fails_unless_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def first_two(recs: list[dict[str, object]]) -> list[dict[str, object]]:
        return [r for r in recs if r["type"] != "mark" or int(r["chunk"]) < 2]  # type: ignore[call-overload]

    logs = _copy(tmp_path, edit0=first_two, edit1=first_two)
    assert main(["pipeline", str(logs)]) == 1
    assert "not measured" in capsys.readouterr().out
    assert main(["pipeline", str(logs), "--allow-unmeasured"]) == 0


def test_negative_gpu_time_is_not_taken(tmp_path: Path) -> None:
    def neg(recs: list[dict[str, object]]) -> list[dict[str, object]]:
        next(r for r in recs if r["type"] == "block")["gpu_ns"] = -5
        return recs

    log = read_instrument_logs([_copy(tmp_path, edit0=neg)])
    assert log.blocks.get_column("gpu_ns").drop_nulls().min() is None or log.blocks["gpu_ns"].drop_nulls().min() >= 0
    assert any("1 lines are not instrument records" in w for w in log.warnings)


def test_block_totals_that_pass_int64_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def big(recs: list[dict[str, object]]) -> list[dict[str, object]]:
        for r in recs:
            if r["type"] == "block" and r["name"] == "build":
                r["host_ns"] = 1 << 62
        return recs

    assert main(["blocks", str(_copy(tmp_path, edit0=big))]) == 3
    assert "64-bit" in _one_line_error(capsys)


def test_a_byte_order_mark_keeps_the_header(tmp_path: Path) -> None:
    logs = _copy(tmp_path)
    f = logs / "tracewhy-instrument.rank0.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + f.read_bytes())
    log = read_instrument_logs([logs])
    assert log.headers[0].present and log.headers[0].clock == "perf_counter_ns"
    assert not log.warnings


def test_the_real_logs_still_read_clean() -> None:
    assert not read_instrument_logs([SERIAL]).warnings
