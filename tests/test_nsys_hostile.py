"""Hostile Nsight Systems exports: real exports mutated with sqlite3. Every command
exits 0 or with a one-line error, never 70; what the reader skipped, repaired or could not read
is one warning line each, with counts; the user's files are only read."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import polars as pl
import pytest

from nsys_support import PID, ExportBuilder, export_path
from tracewhy.analyses.overlap import overlap
from tracewhy.cli import EXIT_BAD_INPUT, EXIT_OK, main
from tracewhy.errors import TraceError
from tracewhy.model.schema import Col, DeviceCol, Kind
from tracewhy.model.trace import Trace
from tracewhy.readers import read_trace
from tracewhy.readers.nsys.reader import read_nsys

#: The smallest real export (2 kernels, 1 memcpy, 1 sync, runtime calls; nsys 2026.1).
MOCK = "nsysai_mock_rtx3080"
KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"
COMMANDS = ("diagnose", "gaps", "overlap", "kernels", "info")


@pytest.fixture(autouse=True)
def _no_trace_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEWHY_NO_CACHE", "1")


def _copy(folder: Path, name: str = MOCK) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.sqlite"
    path.write_bytes(gzip.decompress(export_path(name).read_bytes()))
    return path


def _sql(path: Path, *statements: str) -> Path:
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return path


def _loosen(table: str) -> tuple[str, ...]:
    """Statements that rebuild ``table`` without its NOT NULL constraints (CREATE TABLE AS keeps
    none), as an older or hand-edited schema would have it."""
    return (f'CREATE TABLE _loose AS SELECT * FROM "{table}"', f'DROP TABLE "{table}"',
            f'ALTER TABLE _loose RENAME TO "{table}"')


def _read(path: Path) -> Trace:
    trace = read_nsys(path)
    trace.check()
    return trace


def _warned(trace: Trace, *fragments: str) -> str:
    hits = [w for w in trace.meta.warnings if all(f in w for f in fragments)]
    assert len(hits) == 1, trace.meta.warnings
    return hits[0]


def _commands_succeed(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in COMMANDS:
        code = main([command, str(path)])
        err = capsys.readouterr().err
        assert code == EXIT_OK and "internal error" not in err, (command, err)


def _kernels(trace: Trace) -> pl.DataFrame:
    return trace.of_kind(Kind.KERNEL)


# --- NULL keys ------------------------------------------------------------------------------------

@pytest.mark.parametrize("table", [KERNELS, "CUPTI_ACTIVITY_KIND_MEMCPY"])
def test_a_null_global_pid_goes_to_the_only_gpu_process(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str) -> None:
    # Crashed diagnose (int(None) in the nsys rules) before.
    path = _sql(_copy(tmp_path), f'UPDATE "{table}" SET globalPid = NULL WHERE rowid = 1')
    trace = _read(path)
    whole = _read(_copy(tmp_path / "whole"))
    assert trace.slices.drop(Col.NAME).equals(whole.slices.drop(Col.NAME))
    _warned(trace, "1 GPU activities have no globalPid", f"attributed to pid {whole.slices[Col.PID].max()}")
    _commands_succeed(path, capsys)


@pytest.mark.parametrize("table", [KERNELS, "CUPTI_ACTIVITY_KIND_MEMCPY"])
def test_a_null_device_id_takes_its_streams_device(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str) -> None:
    # Crashed gaps, overlap and diagnose before, and broke Trace.check().
    path = _sql(_copy(tmp_path), *_loosen(table), f'UPDATE "{table}" SET deviceId = NULL WHERE rowid = 1')
    trace = _read(path)
    assert trace.slices.get_column(Col.DEVICE).drop_nulls().unique().to_list() == [0]
    _warned(trace, "1 GPU activities have no deviceId", "placed on the device")
    _commands_succeed(path, capsys)


def test_null_keys_nothing_can_fill_are_skipped_and_counted(tmp_path: Path) -> None:
    b = ExportBuilder()
    for pid, device in ((1, 0), (2, 1)):
        b.kernel("k()", 100 * pid, 100 * pid + 50, b.api("cudaLaunchKernel_v7000", 10, 20, pid=pid, tid=pid),
                 pid=pid, device=device, stream=7)
    # Two devices in process 1, on its stream 7 too: this kernel's device cannot be told.
    b.kernel("k()", 400, 450, b.api("cudaLaunchKernel_v7000", 30, 40, pid=1, tid=1), pid=1, device=1, stream=7)
    b.kernel("lost_device()", 500, 550, 9001, pid=1, stream=7)
    b.kernel("lost_pid()", 600, 650, 9002, pid=2)
    path = b.write(tmp_path / "keys.sqlite")
    _sql(path, f"UPDATE {KERNELS} SET deviceId = NULL WHERE correlationId = 9001",
         f"UPDATE {KERNELS} SET globalPid = NULL WHERE correlationId = 9002")
    trace = _read(path)
    assert sorted(_kernels(trace).get_column(Col.NAME).cast(pl.String).to_list()) == ["k()"] * 3
    _warned(trace, "1 GPU activities have no globalPid, and 2 processes could have run them: skipped")
    _warned(trace, "1 GPU activities have no deviceId and nothing in the file tells their device: skipped")


def test_a_null_stream_id_is_kept_without_a_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _sql(_copy(tmp_path), *_loosen(KERNELS), f"UPDATE {KERNELS} SET streamId = NULL WHERE rowid = 1")
    trace = _read(path)
    assert _kernels(trace).height == 2 and _kernels(trace).get_column(Col.STREAM).null_count() == 1
    _commands_succeed(path, capsys)


def _nullable_cells() -> list[tuple[str, str]]:
    """Every (table, column) of the tables the reader reads in the mock export."""
    conn = sqlite3.connect(":memory:")
    conn.deserialize(gzip.decompress(export_path(MOCK).read_bytes()))
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
              if not r[0].startswith(("ENUM_", "ANALYSIS_FILE", "ProcessStreams"))]
    return [(t, r[1]) for t in tables for r in conn.execute(f'PRAGMA table_info("{t}")')]


#: The columns are split among this many cases, so that the two test workers share them (each
#: case about 12 s: one diagnose per column).
_NULL_SHARDS = 4


@pytest.mark.slow  # a diagnosis per column: about 200
@pytest.mark.parametrize("shard", range(_NULL_SHARDS))
def test_null_in_any_column_never_breaks_diagnose(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  shard: int) -> None:
    # diagnose runs gaps, overlap and the nsys rules. Every other row keeps its values, so each
    # table still has rows to read.
    original = _copy(tmp_path)
    broken = []
    for table, column in _nullable_cells()[shard::_NULL_SHARDS]:
        path = tmp_path / f"{table}.{column}.sqlite"
        shutil.copy(original, path)
        _sql(path, *_loosen(table), f'UPDATE "{table}" SET "{column}" = NULL WHERE rowid % 2 = 1')
        code = main(["diagnose", str(path), "--no-cache"])
        err = capsys.readouterr().err
        if code not in (EXIT_OK, EXIT_BAD_INPUT) or "internal error" in err:
            broken.append((table, column, err.strip()[-120:]))
        path.unlink()
    assert not broken


# --- text where numbers belong ----------------------------------------------------------------------

@pytest.mark.parametrize(("statement", "fragment"), [
    ("UPDATE ANALYSIS_DETAILS SET startTime = 'abc'", "ANALYSIS_DETAILS.startTime is not an integer ('abc')"),
    ("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 'x'",
     "TARGET_INFO_SESSION_START_TIME.utcEpochNs is not an integer ('x')"),
    # Both pass str.isdigit() after lstrip('-'), which is what the old check asked.
    ("UPDATE META_DATA_EXPORT SET value = '--5' WHERE name = 'EXPORT_PARAM_TIME_SHIFT'",
     "EXPORT_PARAM_TIME_SHIFT is not an integer ('--5')"),
    ("UPDATE META_DATA_EXPORT SET value = '²' WHERE name = 'EXPORT_PARAM_TIME_SHIFT'",
     "EXPORT_PARAM_TIME_SHIFT is not an integer ('²')"),
])
def test_text_in_metadata_numbers_leaves_them_unknown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], statement: str, fragment: str) -> None:
    path = _sql(_copy(tmp_path), statement)
    trace = _read(path)
    _warned(trace, fragment, "taken as unknown")
    assert trace.meta.base_time_ns is None  # the epoch needs all three
    assert _kernels(trace).height == 2
    _commands_succeed(path, capsys)


@pytest.mark.parametrize(("statement", "fragment"), [
    # Before: the whole file was "unreadable" over a process name or one string.
    ("UPDATE PROCESSES SET pid = 'x' WHERE rowid % 2 = 1", "processes with a pid that is not an integer"),
    ("UPDATE StringIds SET id = 'x' WHERE rowid = (SELECT max(rowid) FROM StringIds)",
     "StringIds: 1 strings with an id that is not an integer skipped"),
])
def test_text_in_name_tables_skips_those_rows(tmp_path: Path, statement: str, fragment: str) -> None:
    table = statement.split()[1]
    trace = _read(_sql(_copy(tmp_path), *_loosen(table), statement))
    _warned(trace, fragment)
    assert _kernels(trace).height == 2


def test_text_in_an_event_column_names_the_table(tmp_path: Path) -> None:
    path = _sql(_copy(tmp_path), f"UPDATE {KERNELS} SET gridX = 'wide' WHERE rowid = 1")
    with pytest.raises(TraceError, match=f"wrong type \\({KERNELS}: .*grid_x"):
        read_nsys(path)


def test_a_gpu_without_an_id_loses_only_its_properties(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _sql(_copy(tmp_path), *_loosen("TARGET_INFO_GPU"), "UPDATE TARGET_INFO_GPU SET id = NULL")
    trace = _read(path)
    assert trace.devices.get_column(DeviceCol.DEVICE).to_list() == [0]
    assert trace.devices.get_column(DeviceCol.NAME).to_list() == [None]
    _warned(trace, "TARGET_INFO_GPU: 1 GPUs without an id")
    _commands_succeed(path, capsys)


# --- corrupt files --------------------------------------------------------------------------------

def test_a_schema_with_bytes_that_are_not_utf8_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # SQLite's message quotes the broken schema entry; Python could not decode it before
    # (UnicodeDecodeError, exit 70).
    path = _copy(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET name = CAST(X'50726FFF' AS TEXT), "
                 "sql = CAST(X'435245415445205441424C45207A7AFF28' AS TEXT) WHERE name = 'ProcessStreams'")
    conn.commit()
    conn.close()
    with pytest.raises(TraceError, match=r"malformed database schema \(Pro\\xff\)"):
        read_nsys(path)
    assert main(["info", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err


def test_a_kernel_table_that_is_a_view_is_not_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: the view's rows vanished silently (no rowid), 0 kernels and no word.
    path = _sql(_copy(tmp_path), f"ALTER TABLE {KERNELS} RENAME TO k_base",
                f"CREATE VIEW {KERNELS} AS SELECT * FROM k_base")
    trace = _read(path)
    assert _kernels(trace).height == 0
    _warned(trace, f"{KERNELS} is a view, not a table as nsys writes it: not read")
    _commands_succeed(path, capsys)


def test_a_kernel_table_without_rowid_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: "unreadable SQLite export (no such column: rowid)", as if the file were broken.
    cols = "start, \"end\", deviceId, streamId, correlationId, globalPid, demangledName, shortName"
    path = _sql(_copy(tmp_path), f"CREATE TABLE k2 ({cols}, PRIMARY KEY (start, correlationId)) WITHOUT ROWID",
                f"INSERT INTO k2 SELECT {cols} FROM {KERNELS}", f"DROP TABLE {KERNELS}",
                f"ALTER TABLE k2 RENAME TO {KERNELS}")
    trace = _read(path)
    assert _kernels(trace).height == 0 and trace.of_kind(Kind.MEMCPY).height == 1
    _warned(trace, f"{KERNELS} is a WITHOUT ROWID table, unlike those nsys writes: not read")
    _commands_succeed(path, capsys)


@pytest.mark.parametrize(("statement", "fragment"), [
    (f"DELETE FROM StringIds WHERE id IN (SELECT demangledName FROM {KERNELS} UNION SELECT shortName FROM {KERNELS})",
     "2 kernels have no name (their StringIds entries are missing)"),
    (f"UPDATE {KERNELS} SET demangledName = NULL, shortName = NULL WHERE rowid = 1",
     "1 kernels have no name (NULL name ids)"),
])
def test_kernels_without_names_are_counted(tmp_path: Path, statement: str, fragment: str) -> None:
    path = _sql(_copy(tmp_path), *_loosen(KERNELS), statement)
    trace = _read(path)
    assert "<unnamed kernel>" in _kernels(trace).get_column(Col.NAME).cast(pl.String).to_list()
    _warned(trace, KERNELS, fragment, "shown as <unnamed kernel>")


def test_a_kernel_lasting_4e18_ns_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: 1 kernel of 4e9 s, and overlap called the GPU 100% busy for it.
    path = _sql(_copy(tmp_path), f'UPDATE {KERNELS} SET "end" = start + 4000000000000000000 WHERE rowid = 1')
    trace = _read(path)
    assert _kernels(trace).height == 1 and _kernels(trace).get_column(Col.DUR).max() < 10**6  # type: ignore[operator]
    _warned(trace, KERNELS, "1 rows last longer than the capture could (up to 4e+09 s", "skipped as corrupt")
    devices = overlap(trace).devices
    assert devices.get_column("span_ns").max() < 10**9  # type: ignore[operator]
    assert devices.get_column("idle_ns").sum() > 0
    _commands_succeed(path, capsys)


# --- a database a writer left mid-flight ------------------------------------------------------------

def _snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.iterdir())}


def _crash_copy(source: Path, into: Path) -> Path:
    """The files of ``source`` as they lie now (as if its writer crashed), copied into ``into``."""
    into.mkdir()
    for f in source.parent.iterdir():
        if f.name.startswith(source.name) and not f.name.endswith("-shm"):
            shutil.copy(f, into / f.name)
    return into / source.name


def _crash_mid_transaction(conn: sqlite3.Connection, live: Path, into: Path) -> Path:
    """Copy ``live`` with a transaction open (every kernel deleted, 2.5 MB of filler: more than a
    2-page cache holds, so SQLite spills it into the log or the file), then roll it back."""
    conn.execute("PRAGMA cache_size = 2")
    conn.execute("BEGIN")
    conn.execute(f"DELETE FROM {KERNELS}")
    conn.execute("CREATE TABLE filler (x)")
    conn.executemany("INSERT INTO filler VALUES (?)", [("y" * 500,)] * 5000)
    path = _crash_copy(live, into)
    conn.execute("ROLLBACK")
    conn.close()
    return path


def test_a_write_ahead_log_is_read_for_its_committed_transactions(tmp_path: Path) -> None:
    live = _copy(tmp_path)
    conn = sqlite3.connect(live, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute(f"DELETE FROM {KERNELS} WHERE rowid = (SELECT min(rowid) FROM {KERNELS})")  # committed
    # A transaction still open, large enough that SQLite spills its pages into the log.
    path = _crash_mid_transaction(conn, live, tmp_path / "crashed")
    assert (path.parent / f"{path.name}-wal").stat().st_size > 0
    before = _snapshot(path.parent)
    trace = _read(path)
    # The committed delete is there; the open transaction's is not. immutable=1 read 2 kernels.
    assert _kernels(trace).height == 1
    _warned(trace, f"a write-ahead log ({path.name}-wal) lay beside the file", "committed")
    assert _snapshot(path.parent) == before  # no -shm, nothing rewritten


def test_a_hot_journal_is_rolled_back_in_a_private_copy(tmp_path: Path) -> None:
    live = _copy(tmp_path)
    conn = sqlite3.connect(live, isolation_level=None)
    path = _crash_mid_transaction(conn, live, tmp_path / "crashed")  # spills into the file itself
    before = _snapshot(path.parent)
    assert set(before) == {path.name, f"{path.name}-journal"}
    # immutable=1 read the half-written file: "malformed database schema (filler)".
    trace = _read(path)
    assert _kernels(trace).height == 2
    _warned(trace, f"a hot rollback journal ({path.name}-journal)", "rolled back")
    assert _snapshot(path.parent) == before


def test_a_plain_export_is_opened_without_files_beside_it(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    before = _snapshot(tmp_path)
    trace = _read(path)
    assert not any("lay beside the file" in w for w in trace.meta.warnings)
    assert _snapshot(tmp_path) == before


# --- .nsys-rep through a broken nsys ----------------------------------------------------------------

def _fake_nsys(tmp_path: Path, writes: bytes) -> Path:
    """A stand-in for nsys that exits 0 after writing ``writes`` as the export, and logs calls."""
    payload = tmp_path / "payload"
    payload.write_bytes(writes)
    script = tmp_path / "fake-nsys"
    script.write_text(
        f"#!{sys.executable}\nimport shutil, sys\n"
        f"open({str(tmp_path / 'calls.log')!r}, 'a').write('export\\n')\n"
        f"shutil.copy({str(payload)!r}, sys.argv[sys.argv.index('--output') + 1])\n")
    script.chmod(0o755)
    return script


def _empty_sqlite(tmp_path: Path) -> bytes:
    path = _sql(tmp_path / "empty.sqlite", "CREATE TABLE t (x)")
    return path.read_bytes()


@pytest.mark.parametrize("writes", ["nothing", "garbage", "not an export"])
def test_an_unusable_export_is_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writes: str) -> None:
    payload = {"nothing": b"", "garbage": b"\x00" * 4096, "not an export": _empty_sqlite(tmp_path)}[writes]
    report = tmp_path / "in" / "run.nsys-rep"
    report.parent.mkdir()
    report.write_bytes(b"\x00report")
    monkeypatch.setenv("TRACEWHY_NSYS", str(_fake_nsys(tmp_path, payload)))
    monkeypatch.setenv("TRACEWHY_CACHE_DIR", str(tmp_path / "cache"))
    for _ in range(2):
        with pytest.raises(TraceError) as e:
            read_trace(report)
        assert "\n" not in str(e.value) and str(report) in str(e.value)
        assert not list((tmp_path / "cache" / "nsys").glob("*"))
    # Each read asked nsys again instead of reusing what it wrote.
    assert (tmp_path / "calls.log").read_text().count("export") == 2
    assert os.listdir(report.parent) == ["run.nsys-rep"]


def test_a_clean_export_reads_without_warnings(tmp_path: Path) -> None:
    b = ExportBuilder()
    b.kernel("k()", 3000, 3500, b.api("cudaLaunchKernel_v7000", 2000, 2100))
    path = b.write(tmp_path / "clean.sqlite")
    trace = _read(path)
    assert _kernels(trace).get_column(Col.PID).to_list() == [PID]
    assert not trace.meta.warnings


def test_nvtx_ranges_piled_at_one_instant_are_refused_not_nested(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Found by the long fuzz: nvFuser's real export with every NVTX_EVENTS row moved to one
    instant (13,513 ranges) made `nvtx` weigh every later range as a parent of every earlier one,
    2.7 GB from a 322 KB file. The containment candidates are counted before they are built."""
    path = _sql(_copy(tmp_path, "nvfuser_xent_h200_2025.1"),
                "UPDATE NVTX_EVENTS SET start = (SELECT MIN(start) FROM NVTX_EVENTS), "
                "[end] = (SELECT MIN(start) FROM NVTX_EVENTS) + 1000 WHERE [end] IS NOT NULL")
    assert main(["nvtx", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "containment candidates" in err and str(path) in err
