"""Memory-snapshot pickles that are plain data yet build far more than their size: memo
references repeating one object, one long string shared by many rows, integers no column holds.
Each is refused with one line naming the file, before the tables are built (a snapshot in
torch's documented layout, ``build_snapshot``, is the base every case mutates)."""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import pytest

from test_memory import build_snapshot
from tracewhy.cli import EXIT_BAD_INPUT, main
from tracewhy.errors import TraceError
from tracewhy.readers.memory.snapshot import read_memory_snapshot


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    return path


def test_the_documented_snapshot_is_within_every_budget(tmp_path: Path) -> None:
    snap = read_memory_snapshot(_write(tmp_path, build_snapshot()))
    assert (snap.segments.height, snap.blocks.height, snap.events.height) == (2, 4, 6)


def test_memo_references_are_counted_as_the_rows_they_make(tmp_path: Path) -> None:
    """One block dict referenced 3,000 times in one segment, that segment 3,000 times: pickle
    writes each reference as a two-byte BINGET, so a ~12 KB file stands for 9e6 blocks (10 s and
    1.65 GB on today's code)."""
    data = build_snapshot()
    seg = data["segments"][1]
    seg["blocks"] = [seg["blocks"][0]] * 3000
    data["segments"] = [seg] * 3000
    path = _write(tmp_path, data)
    assert path.stat().st_size < 20_000
    start = time.perf_counter()
    with pytest.raises(TraceError, match=r"3000 snapshot rows \(segments, blocks, trace entries, frames\) is more "
                                         r"than a file of this size can hold"):
        read_memory_snapshot(path)
    assert time.perf_counter() - start < 2


def test_one_long_string_shared_by_many_rows_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """64 segments whose segment_type is one 1 MiB string: the pickle holds it once (1 MiB),
    the tables would copy it 64 times."""
    data = build_snapshot()
    shared = "x" * (1 << 20)
    data["segments"] = [{**data["segments"][0], "segment_type": shared, "blocks": []} for _ in range(64)]
    path = _write(tmp_path, data)
    with pytest.raises(TraceError, match=r"text past .* bytes in its rows"):
        read_memory_snapshot(path)
    assert main(["memory", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err


@pytest.mark.parametrize("where", ["segment address", "block size", "trace addr", "trace time_us"])
@pytest.mark.parametrize("value", [1 << 64, -(10 ** 5000)], ids=["past-int64", "5000-digits"])
def test_an_integer_no_column_holds_is_one_line(where: str, value: int, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    data = build_snapshot()
    if where == "segment address":
        data["segments"][0]["address"] = value
    elif where == "block size":
        data["segments"][1]["blocks"][0]["size"] = value
    else:
        data["device_traces"][0][2][where.split()[1]] = value
    path = _write(tmp_path, data)
    assert main(["memory", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "outside the 64-bit integers" in err and "Traceback" not in err


@pytest.mark.parametrize("where", ["segment total_size", "block size", "trace size"])
@pytest.mark.parametrize("value", [(1 << 63) - 1, -(1 << 63)], ids=["int64-max", "int64-min"])
def test_a_size_no_device_holds_is_one_line(where: str, value: int, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # Found by the fuzz: int64's extremes fit a column, but the replay's running totals of such
    # sizes passed int64 (an OverflowError, exit 70). No device holds a petabyte.
    data = build_snapshot()
    if where == "segment total_size":
        data["segments"][0]["total_size"] = value
    elif where == "block size":
        data["segments"][1]["blocks"][0]["size"] = value
    else:
        data["device_traces"][0][2]["size"] = value
    path = _write(tmp_path, data)
    assert main(["memory", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no device holds that" in err and str(path) in err


def test_cleanup_errors_while_a_pickle_is_refused_stay_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by the fuzz: a forged BYTEARRAY8 length ran the unpickler out of memory under the
    # worker's limit, and CPython printed "SystemError: deallocated bytearray object has exported
    # buffers" (an unraisable error from the bytearray's teardown) beside the one-line refusal.
    # The same kind of error, raised from a finalizer inside the guard, is not passed on to the
    # process's hook (which prints it); other errors still are.
    import sys

    from tracewhy.readers.memory.snapshot import _cleanup_noise_quiet

    seen: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(type(u.exc_value).__name__))

    class Noisy:
        def __init__(self, error: Exception) -> None:
            self.error = error

        def __del__(self) -> None:
            raise self.error

    with _cleanup_noise_quiet():
        Noisy(SystemError("deallocated bytearray object has exported buffers"))
        Noisy(ValueError("a real bug"))
    Noisy(SystemError("outside the guard"))
    assert seen == ["ValueError", "SystemError"]
    # bytearray_dealloc reports through PyErr_Print, which calls sys.excepthook.
    printed: list[str] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: printed.append(kind.__name__))
    with _cleanup_noise_quiet():
        sys.excepthook(SystemError, SystemError("deallocated bytearray object has exported buffers"), None)
        sys.excepthook(KeyError, KeyError("a real bug"), None)
    assert printed == ["KeyError"]
