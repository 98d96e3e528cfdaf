"""Hostile memory-timeline exports, each built in tmp_path from a real one (torch's
``export_memory_timeline``, tests/data/generated/memory_timeline): values past int64, nesting
that exhausts the decoder, times that wrap when converted to ns, sums that wrap, negative bytes.
Each once ended in exit 70 or was shown as numbers without a word."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import GENERATED
from tracewhy.cli import main
from tracewhy.readers.memory.timeline import read_memory_timeline

SIZES = GENERATED / "memory_timeline" / "cpu_adam_memory_timeline.json.gz"
RAW = GENERATED / "memory_timeline" / "cpu_adam_memory_timeline.raw.json.gz"


def _load(path: Path) -> list:  # type: ignore[type-arg]
    return json.loads(gzip.decompress(path.read_bytes()))


def _write(tmp: Path, name: str, doc: object) -> Path:
    f = tmp / name
    f.write_text(json.dumps(doc))
    return f


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_uint64_value_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    times, sizes = _load(SIZES)
    sizes[3][2] = 18446744073709551615
    f = _write(tmp_path, "t.json", [times, sizes])
    assert "64-bit" in _error(["memory", str(f)], capsys)
    rows = _load(RAW)
    rows[5][2] = 18446744073709551615
    f = _write(tmp_path, "t.raw.json", rows)
    assert "64-bit" in _error(["memory", str(f)], capsys)


def test_deep_nesting_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "deep.json"
    f.write_bytes(b"[[" + b"[" * 100_000 + b"]" * 100_000 + b"]]")
    assert "nested too deeply" in _error(["memory", str(f)], capsys)


def test_times_that_wrap_in_nanoseconds_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    times, sizes = _load(SIZES)
    times[-1] = 1 << 60  # microseconds: x1000 passes int64
    f = _write(tmp_path, "t.json", [times, sizes])
    assert "64-bit" in _error(["memory", str(f)], capsys)


def test_sums_that_wrap_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    times, sizes = _load(SIZES)
    sizes[4][1] = sizes[4][2] = 1 << 62  # two categories: the total passes int64
    f = _write(tmp_path, "t.json", [times, sizes])
    assert "64-bit" in _error(["memory", str(f)], capsys)
    rows = _load(RAW)
    rows[1][2] = rows[2][2] = 1 << 62  # one category's running total passes int64
    rows[2][3] = rows[1][3]
    f = _write(tmp_path, "t.raw.json", rows)
    assert "64-bit" in _error(["memory", str(f)], capsys)


def test_negative_live_bytes_are_shown_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    times, sizes = _load(SIZES)
    sizes[4][1] = -4096
    f = _write(tmp_path, "t.json", [times, sizes])
    tl = read_memory_timeline(f)
    assert tl.warnings and "negative" in tl.warnings[0]
    assert main(["memory", str(f)]) == 0
    assert "negative" in capsys.readouterr().err
    assert not read_memory_timeline(SIZES).warnings and not read_memory_timeline(RAW).warnings
