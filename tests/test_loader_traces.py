"""``Loader.traces``: the two traces of a diff (or a check against a baseline) read at once when
they are small, and everything a read tells said in the order the traces were given, as when
they are read in turn. On real nsys exports, whose reads carry warnings."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Collection
from pathlib import Path

import pytest

from conftest import shared_trace
from tracewhy.errors import TraceError
from tracewhy.input_size import SMALL_INPUTS_MAX_BYTES
from tracewhy.model.schema import Kind
from tracewhy.model.trace import Trace
from tracewhy.readers import read_trace
from tracewhy.reports.inputs import Loader


def _exports(tmp_path: Path) -> tuple[str, str]:
    """Two small real exports whose reads warn (two distinct files, so each has its own lines)."""
    a = tmp_path / "a.sqlite.gz"
    b = tmp_path / "b.sqlite.gz"
    shutil.copyfile(shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz"), a)
    shutil.copyfile(shared_trace("nsys/nsysai_mfu_2gpu_before.sqlite.gz"), b)
    assert a.stat().st_size + b.stat().st_size < SMALL_INPUTS_MAX_BYTES
    return str(a), str(b)


class _Recorder:
    """A loader's read and seen that note when each read ran and what was said, in order; the
    first file's read is held back until the second's has started (it waits at most 10 s, so a
    loader that reads in turn is slow, not stuck)."""

    def __init__(self, first: str) -> None:
        self.first = first
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.second_started = threading.Event()
        self.said: list[tuple[str, list[str]]] = []

    def read(self, path: str, kinds: Collection[Kind] | None) -> Trace:
        self.started[path] = time.monotonic()
        if path == self.first:
            self.second_started.wait(10)
        else:
            self.second_started.set()
        trace = read_trace(path, kinds=kinds)
        self.ended[path] = time.monotonic()
        return trace

    def seen(self, path: str, trace: Trace) -> None:
        self.said.append((path, list(trace.meta.warnings)))


def test_small_files_are_read_at_once_and_told_in_the_order_given(tmp_path: Path) -> None:
    a, b = _exports(tmp_path)
    r = _Recorder(first=a)
    traces = Loader(read=r.read, seen=r.seen).traces([a, b])
    # Both reads ran at once: the second began before the first, held back for it, ended.
    assert r.started[b] < r.ended[a]
    # ... and yet the first file was told first, each with its own reader's warnings.
    assert [p for p, _ in r.said] == [a, b]
    assert [w for _, w in r.said] == [list(t.meta.warnings) for t in traces]
    assert all(w for _, w in r.said)  # (these exports warn: a derived file, launches outside it)
    assert [t.meta.path for t in traces] == [a, b]


def test_the_default_seen_says_each_reads_warnings_in_order(tmp_path: Path) -> None:
    a, b = _exports(tmp_path)
    said: list[str] = []
    traces = Loader(warn=lambda source, lines: said.extend(f"{source}: {line}" for line in lines)).traces([b, a])
    assert said == [f"{t.meta.path}: {line}" for t in traces for line in t.meta.warnings]
    assert said[0].startswith(b)


def test_a_failed_read_is_raised_after_the_reads_before_it_are_told(tmp_path: Path) -> None:
    a, _ = _exports(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("not a trace")
    said: list[str] = []
    loader = Loader(seen=lambda path, trace: said.append(path))
    with pytest.raises(TraceError, match=r"bad\.json"):
        loader.traces([a, str(bad)])
    assert said == [a]
    said.clear()
    # The first failing: its error, and nothing told of the file after it (as in turn).
    with pytest.raises(TraceError, match=r"bad\.json"):
        loader.traces([str(bad), a])
    assert said == []


def test_a_trace_given_is_used_as_it_is_and_not_told(tmp_path: Path) -> None:
    a, b = _exports(tmp_path)
    given = read_trace(a)
    said: list[str] = []
    traces = Loader(seen=lambda path, trace: said.append(path)).traces([given, b])
    assert traces[0] is given and said == [b]


def test_large_inputs_are_read_in_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _exports(tmp_path)
    import tracewhy.input_size as input_size

    monkeypatch.setattr(input_size, "SMALL_INPUTS_MAX_BYTES", 1)
    monkeypatch.setattr(input_size.small_inputs, "__defaults__", (1,))
    threads: set[str] = set()

    def read(path: str, kinds: Collection[Kind] | None) -> Trace:
        threads.add(threading.current_thread().name)
        return read_trace(path, kinds=kinds)

    Loader(read=read).traces([a, b])
    assert threads == {threading.main_thread().name}
