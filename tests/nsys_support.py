"""Test support for Nsight Systems input: the real exports (read once per session), NVIDIA's
golden ``nsys stats`` / ``nsys analyze`` CSVs, and tiny exports built inline."""

from __future__ import annotations

import csv
import gzip
import io
import sqlite3
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from conftest import shared_trace
from tracewhy.model.trace import Trace
from tracewhy.readers.nsys.reader import read_nsys

#: The seven real exports in shared/traces/nsys, oldest schema last.
FIXTURES = (
    "nsysai_h100_2gpu_1s",
    "nsysai_mfu_2gpu_before",
    "nsysai_mfu_2gpu_after",
    "nsysai_mock_rtx3080",
    "nvfuser_xent_h200_2025.1",
    "nvfuser_matmul_h200_2024.6",
    "pipit_saxpy_mpi_cuda_a100_2022.2",
)
GOLDEN = "nsys/golden_nsys-2023.4.4"
#: The tolerance of a value nsys prints rounded to one decimal.
ROUND1 = 0.05 + 1e-6
#: The tolerance of a statistic tracewhy rounds to the nearest nanosecond against nsys's tenth.
WHOLE_NS = 0.5 + ROUND1


def export_path(name: str) -> Path:
    return shared_trace(f"nsys/{name}.sqlite.gz")


@cache
def _load(name: str) -> Trace:
    trace = read_nsys(export_path(name))
    trace.check()
    return trace


def load(name: str) -> Trace:
    """The real export read by our reader (once per test session; Trace is immutable)."""
    export_path(name)  # skips cleanly when ../shared is absent
    return _load(name)


@cache
def raw_db(name: str) -> sqlite3.Connection:
    """The export itself, for counts computed independently of the reader (in memory)."""
    conn = sqlite3.connect(":memory:")
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "export.sqlite"
        plain.write_bytes(gzip.decompress(export_path(name).read_bytes()))
        source = sqlite3.connect(plain)
        source.backup(conn)
        source.close()
    conn.text_factory = lambda b: b.decode("utf-8", "replace")
    return conn


def golden(name: str, report: str) -> list[dict[str, str]] | None:
    """Rows of a golden CSV (``stats_X`` or ``analyze_X``), or None when nsys wrote none."""
    folder = shared_trace(GOLDEN) / name
    for candidate in (folder / f"{report}.csv", folder / f"{report}.csv.gz"):
        if candidate.exists():
            data = candidate.read_bytes()
            text = (gzip.decompress(data) if candidate.suffix == ".gz" else data).decode()
            return list(csv.DictReader(io.StringIO(text)))
    return None


def close(ours: float, theirs: str, tol: float = ROUND1) -> bool:
    """``ours`` equals a value nsys printed rounded (relative slack for huge stddevs)."""
    value = float(theirs)
    return abs(ours - value) <= max(tol, abs(value) * 1e-12)


# --- tiny exports built inline ------------------------------------------------------------------

UTC_START = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z, the session start
PID = 4242
TID = 4242
VM = 1 << 48


def gtid(pid: int = PID, tid: int = TID) -> int:
    """A serialized globalTid (NSYS_NOTES §1.3)."""
    return VM | (pid << 24) | tid


def gpid(pid: int = PID) -> int:
    return VM | (pid << 24)


@dataclass
class ExportBuilder:
    """Builds an nsys-shaped SQLite export row by row; tables exist only when given rows.

    ``schema`` "3.25.0" writes META_DATA_EXPORT and ENUM tables (nsys >= 2024); "2.9.1" writes
    EXPORT_META_DATA and no ENUM tables, as nsys 2022.2 did.
    """

    schema: str = "3.25.0"
    export_meta: dict[str, str] = field(default_factory=dict)
    strings: dict[str, int] = field(default_factory=dict)
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _corr: int = 100

    def sid(self, text: str) -> int:
        return self.strings.setdefault(text, len(self.strings) + 1)

    def add(self, table: str, **row: Any) -> ExportBuilder:
        self.rows.setdefault(table, []).append(row)
        return self

    def api(self, name: str, start: int, end: int, *, pid: int = PID, tid: int = TID,
            corr: int | None = None, event_class: int = 0) -> int:
        if corr is None:
            self._corr += 1
            corr = self._corr
        self.add("CUPTI_ACTIVITY_KIND_RUNTIME", start=start, end=end, eventClass=event_class,
                 globalTid=gtid(pid, tid), correlationId=corr, nameId=self.sid(name),
                 returnValue=0, callchainId=None)
        return corr

    def kernel(self, name: str, start: int, end: int, corr: int, *, pid: int = PID,
               device: int = 0, stream: int = 7) -> ExportBuilder:
        return self.add("CUPTI_ACTIVITY_KIND_KERNEL", start=start, end=end, deviceId=device,
                        contextId=1, streamId=stream, correlationId=corr, globalPid=gpid(pid),
                        demangledName=self.sid(name), shortName=self.sid(name.split("(")[0]),
                        gridX=4, gridY=1, gridZ=1, blockX=128, blockY=1, blockZ=1,
                        registersPerThread=32, staticSharedMemory=0, dynamicSharedMemory=1024)

    def memcpy(self, start: int, end: int, corr: int, *, copy_kind: int = 1, src: int = 0,
               dst: int = 2, nbytes: int = 1 << 20, pid: int = PID, device: int = 0) -> ExportBuilder:
        return self.add("CUPTI_ACTIVITY_KIND_MEMCPY", start=start, end=end, deviceId=device,
                        contextId=1, streamId=7, correlationId=corr, globalPid=gpid(pid),
                        bytes=nbytes, copyKind=copy_kind, srcKind=src, dstKind=dst,
                        srcDeviceId=None, dstDeviceId=None)

    def memset(self, start: int, end: int, corr: int, *, mem_kind: int = 2, nbytes: int = 4096,
               pid: int = PID) -> ExportBuilder:
        return self.add("CUPTI_ACTIVITY_KIND_MEMSET", start=start, end=end, deviceId=0,
                        contextId=1, streamId=7, correlationId=corr, globalPid=gpid(pid),
                        value=0, bytes=nbytes, memKind=mem_kind)

    def nvtx(self, text: str | None, start: int, end: int | None, *, event_type: int = 59,
             pid: int = PID, tid: int = TID, domain: int = 0, registered: bool = False,
             end_tid: int | None = None) -> ExportBuilder:
        return self.add("NVTX_EVENTS", start=start, end=end, eventType=event_type,
                        text=None if registered else text,
                        textId=self.sid(text) if registered and text is not None else None,
                        globalTid=gtid(pid, tid), domainId=domain,
                        endGlobalTid=None if end_tid is None else gtid(pid, end_tid))

    def write(self, path: Path) -> Path:
        conn = sqlite3.connect(path)
        meta_table = "META_DATA_EXPORT" if self.schema >= "3" else "EXPORT_META_DATA"
        meta = {"EXPORT_SCHEMA_VERSION": self.schema, "EXPORT_PRODUCT_VERSION": "test", **self.export_meta}
        self._table(conn, meta_table, [{"name": k, "value": v} for k, v in meta.items()])
        self._table(conn, "TARGET_INFO_SESSION_START_TIME",
                    [{"utcEpochNs": UTC_START, "utcTime": "2026-01-01T00:00:00", "localTime": ""}])
        self._table(conn, "StringIds", [{"id": i, "value": s} for s, i in self.strings.items()])
        if self.schema >= "3":
            self._table(conn, "ENUM_CUDA_MEM_KIND", [{"id": 0, "name": "x", "label": "Pageable"}])
        self._table(conn, "ANALYSIS_DETAILS",
                    [{"globalVid": VM, "duration": 10**9, "startTime": 1000, "stopTime": 10**9 + 1000}])
        for table, rows in self.rows.items():
            self._table(conn, table, rows)
        conn.commit()
        conn.close()
        return path

    @staticmethod
    def _table(conn: sqlite3.Connection, name: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return  # a lazy export: no rows, no table
        cols = list(dict.fromkeys(k for r in rows for k in r))
        quoted = ", ".join(f'"{c}"' for c in cols)
        conn.execute(f"CREATE TABLE {name} ({quoted})")
        conn.executemany(
            f"INSERT INTO {name} VALUES ({', '.join('?' for _ in cols)})",
            [tuple(r.get(c) for c in cols) for r in rows],
        )
