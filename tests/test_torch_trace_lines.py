"""TORCH_TRACE entries as (envelope, payload) pairs: the glog prefix, the tab-indented payload and
its md5, and every kind of bad line counted rather than fatal."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from tracewhy.errors import TraceError
from tracewhy.readers.torch_trace import lines
from tracewhy.readers.torch_trace.lines import LineCounts, iter_torch_trace

PREFIX = "V1128 20:02:23.480000 30360 torch/_dynamo/convert_frame.py:303] "


def entry(envelope: dict[str, object], payload: str | None = None) -> str:
    if payload is None:
        return PREFIX + json.dumps(envelope) + "\n"
    digest = hashlib.md5(payload.encode(), usedforsecurity=False).hexdigest()
    body = "".join(f"\t{line}\n" for line in payload.split("\n"))
    return PREFIX + json.dumps({**envelope, "has_payload": digest}) + "\n" + body


def read(tmp_path: Path, text: str, name: str = "log.log") -> tuple[list[tuple[dict[str, object], str]], LineCounts]:
    path = tmp_path / name
    data = text.encode()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    counts = LineCounts()
    return list(iter_torch_trace(path, counts)), counts


def test_envelopes_and_payloads_in_order(tmp_path: Path) -> None:
    text = (entry({"str": ["model.py", 1]})
            + entry({"dynamo_start": {"stack": []}, "frame_id": 0, "frame_compile_id": 0, "attempt": 0})
            + entry({"artifact": {"name": "dynamo_graph_break_reason", "encoding": "string"}, "frame_id": 0,
                     "frame_compile_id": 0, "attempt": 0}, "Graph break in user code at m.py:4\n  indented"))
    got, counts = read(tmp_path, text, "log.log.gz")
    assert [next(iter(e)) for e, _ in got] == ["str", "dynamo_start", "artifact"]
    assert got[2][1] == "Graph break in user code at m.py:4\n  indented"
    assert got[0][1] == ""
    assert (counts.entries, counts.bad_json, counts.not_entries, counts.payload_mismatch) == (3, 0, 0, 0)


def test_bad_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    good = entry({"dynamo_start": {}, "frame_id": 1, "frame_compile_id": 0, "attempt": 0})
    text = ("some other logger's line\n" + PREFIX + "{not json\n" + PREFIX + "[1, 2]\n"
            + "\torphan payload line\n" + good
            + PREFIX + json.dumps({"dynamo_start": {}, "has_payload": "0" * 32}) + "\n\tedited payload\n")
    got, counts = read(tmp_path, text)
    assert [e.get("frame_id") for e, _ in got] == [1, None]
    # The other logger's line, the JSON array (no "] {"), the orphan payload line.
    assert counts.not_entries == 3
    assert counts.bad_json == 1  # "{not json"
    assert counts.payload_mismatch == 1
    assert len(counts.warnings()) == 3


def test_a_long_line_is_cut_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lines, "MAX_LINE_BYTES", 200)
    long_envelope = PREFIX + json.dumps({"dynamo_start": {"x": "a" * 500}}) + "\n"
    got, counts = read(tmp_path, long_envelope + entry({"dynamo_start": {}, "frame_id": 2}))
    assert [e.get("frame_id") for e, _ in got] == [2]
    assert counts.cut == 1 and counts.bad_json == 1


def test_a_pipe_is_refused_in_one_line(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    with pytest.raises(TraceError, match="not a regular file"):
        list(iter_torch_trace(fifo))
