"""The Nsight Systems reader: every real export loads, passes Trace.check(), and agrees with
counts and joins computed here straight from the SQLite file; tiny inline exports pin down each
schema quirk (NSYS_NOTES.md) one at a time."""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
import stat
import sys
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from nsys_support import FIXTURES, PID, UTC_START, ExportBuilder, export_path, gtid, load, raw_db
from tracewhy.errors import TraceError
from tracewhy.model.schema import Col, CopyAttrCol, Kind, NvtxCol
from tracewhy.readers import CacheOptions, read_trace
from tracewhy.readers.nsys import db as nsys_db
from tracewhy.readers.nsys.reader import read_nsys
from tracewhy.readers.nsys.tables import COPY_KIND, MEMORY_KIND, api_name


def _count(name: str, sql: str) -> int:
    conn = raw_db(name)
    return int(conn.execute(sql).fetchone()[0])


def _has(name: str, table: str) -> bool:
    return _count(name, f"SELECT count(*) FROM sqlite_master WHERE name = '{table}'") > 0


def _kinds(name: str) -> Counter[str]:
    return Counter(load(name).slices.get_column(Col.KIND).cast(pl.String).to_list())


# --- the real exports ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURES)
def test_every_export_loads_with_its_version(name: str) -> None:
    t = load(name)  # load() also runs Trace.check()
    table = "META_DATA_EXPORT" if _has(name, "META_DATA_EXPORT") else "EXPORT_META_DATA"
    version = raw_db(name).execute(
        f"SELECT value FROM {table} WHERE name = 'EXPORT_PRODUCT_VERSION'").fetchone()[0]
    assert t.meta.format == "nsys"
    assert t.meta.versions["nsys"] == version
    assert t.slices.height > 0


@pytest.mark.parametrize("name", FIXTURES)
def test_gpu_rows_match_the_raw_tables(name: str) -> None:
    kinds = _kinds(name)
    for kind, table in ((Kind.KERNEL, "CUPTI_ACTIVITY_KIND_KERNEL"),
                        (Kind.MEMCPY, "CUPTI_ACTIVITY_KIND_MEMCPY"),
                        (Kind.MEMSET, "CUPTI_ACTIVITY_KIND_MEMSET"),
                        (Kind.GPU_SYNC, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")):
        expected = _count(name, f"SELECT count(*) FROM {table}") if _has(name, table) else 0
        assert kinds[kind.value] == expected, kind
    if _has(name, "CUPTI_ACTIVITY_KIND_KERNEL"):
        # Times are the export's integer ns, untouched.
        total, first = raw_db(name).execute(
            'SELECT sum("end" - start), min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()
        k = load(name).of_kind(Kind.KERNEL)
        assert int(k.get_column(Col.DUR).sum()) == total
        assert int(k.get_column(Col.TS).min()) == first  # type: ignore[arg-type]
        # Launch attributes, per kernel: grid, block, registers, static + dynamic shared memory.
        raw = raw_db(name).execute("""SELECT start, gridX, gridY, gridZ, blockX, blockY, blockZ,
            registersPerThread, staticSharedMemory + dynamicSharedMemory
            FROM CUPTI_ACTIVITY_KIND_KERNEL""").fetchall()
        attrs = k.select(Col.ID, Col.TS).join(load(name).kernel_attrs, on=Col.ID).drop(Col.ID)
        assert Counter(attrs.select(Col.TS, *attrs.columns[1:9]).rows()) == Counter(raw)


@pytest.mark.parametrize("name", FIXTURES)
def test_api_calls_without_backtrace_duplicates(name: str) -> None:
    # --cudabacktrace (the 2022.2 pipit file) records each call twice: class 0/1 plus a class 67
    # row with the same correlation id. Only the call is kept.
    total = _count(name, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    duplicates = _count(name, """
        SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME AS b WHERE b.eventClass = 67 AND EXISTS (
          SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME AS c WHERE c.eventClass IN (0, 1)
          AND c.correlationId = b.correlationId AND (c.globalTid >> 24) = (b.globalTid >> 24))""")
    kinds = _kinds(name)
    assert kinds[Kind.RUNTIME.value] + kinds[Kind.DRIVER.value] == total - duplicates
    assert kinds[Kind.DRIVER.value] == _count(
        name, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 1")
    if name.startswith("pipit"):
        assert duplicates == 38


@pytest.mark.parametrize("name", FIXTURES)
def test_launch_links_are_the_raw_join_within_each_process(name: str) -> None:
    """Each GPU row links to the API call with its correlation id *in its own process*.

    The windowed nsys-ai files cut rows to a window: kernels launched before it have no API
    row (1810 in nsysai_h100_2gpu_1s); they stay unlinked and the reader says so.
    """
    linked_raw = _count(name, """
        SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL AS k WHERE EXISTS (
          SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r WHERE r.correlationId = k.correlationId
          AND (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid)""")
    t = load(name)
    k = t.of_kind(Kind.KERNEL)
    linked = k.filter(pl.col(Col.LAUNCH).is_not_null())
    assert linked.height == linked_raw
    launch_pid = t.slices.get_column(Col.PID).gather(linked.get_column(Col.LAUNCH))
    assert launch_pid.equals(linked.get_column(Col.PID), check_names=False)
    if linked.height < k.height:
        assert any("have no CUDA API call" in w for w in t.meta.warnings)
    if name == "nsysai_h100_2gpu_1s":
        assert k.height - linked.height == 1810
    # The API row each kernel joins to in SQL names the same call as its launch slice.
    raw = raw_db(name).execute("""
        SELECT k.start, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r ON r.correlationId = k.correlationId
          AND (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid AND r.eventClass IN (0, 1)
        JOIN StringIds AS s ON s.id = r.nameId""").fetchall()
    expected = Counter((ts, api_name(v)) for ts, v in raw)
    names = t.slices.get_column(Col.NAME).cast(pl.String).gather(linked.get_column(Col.LAUNCH))
    ours = Counter(zip(linked.get_column(Col.TS).to_list(), names.to_list(), strict=True))
    assert ours == expected


def test_correlation_ids_repeat_across_processes() -> None:
    # nsysai_mfu_2gpu_after has 311 correlation ids used by both processes: joining on the id
    # alone would link some kernels to the other rank's calls.
    name = "nsysai_mfu_2gpu_after"
    assert _count(name, """SELECT count(*) FROM (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME
        GROUP BY correlationId HAVING count(DISTINCT globalTid >> 24) > 1)""") == 311
    t = load(name)
    gpu = t.slices.filter(pl.col(Col.LAUNCH).is_not_null())
    assert (t.slices.get_column(Col.PID).gather(gpu.get_column(Col.LAUNCH)) == gpu.get_column(Col.PID)).all()


@pytest.mark.parametrize("name", FIXTURES)
def test_copy_attributes_follow_the_enums(name: str) -> None:
    """Copy kinds and memory kinds come from our own constants (the 2022.2 export has no ENUM
    tables); where the file has ENUM tables, their labels agree with ours."""
    if not _has(name, "CUPTI_ACTIVITY_KIND_MEMCPY"):
        return
    t = load(name)
    raw = raw_db(name).execute(
        "SELECT copyKind, srcKind, dstKind, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchall()
    expected = Counter((COPY_KIND[c], MEMORY_KIND[s], MEMORY_KIND[d], b) for c, s, d, b in raw)
    attrs = t.copy_attrs.join(t.of_kind(Kind.MEMCPY).select(Col.ID), on=Col.ID)
    ours = Counter(attrs.select(pl.col(CopyAttrCol.COPY_KIND).cast(pl.String),
                                pl.col(CopyAttrCol.SRC_MEM).cast(pl.String),
                                pl.col(CopyAttrCol.DST_MEM).cast(pl.String), CopyAttrCol.BYTES).iter_rows())
    assert ours == expected
    if _has(name, "ENUM_CUDA_MEM_KIND"):
        labels = dict(raw_db(name).execute("SELECT id, label FROM ENUM_CUDA_MEM_KIND").fetchall())
        for k in (0, 1, 2, 3, 4):
            assert labels[k] == MEMORY_KIND[k]
        opers = dict(raw_db(name).execute("SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER").fetchall())
        assert opers[1] == "Host-to-Device" and COPY_KIND[1] == "HtoD"
        assert opers[8] == "Device-to-Device" and COPY_KIND[8] == "DtoD"
    else:
        assert name.startswith("pipit")


@pytest.mark.parametrize("name", FIXTURES)
def test_nvtx_ranges_and_marks(name: str) -> None:
    expected = _count(name, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (34, 59, 60, 70, 71)") \
        if _has(name, "NVTX_EVENTS") else 0
    t = load(name)
    assert _kinds(name)[Kind.ANNOTATION.value] == expected
    assert t.nvtx_attrs.height == expected


def test_nvtx_domains_and_registered_strings() -> None:
    # pipit (2022.2): domain "MPI" created by eventType 75; ranges use registered strings.
    t = load("pipit_saxpy_mpi_cuda_a100_2022.2")
    names = Counter(t.of_kind(Kind.ANNOTATION).get_column(Col.NAME).cast(pl.String).to_list())
    assert names == {"MPI:MPI_Send": 10, "MPI:MPI_Recv": 5, "saxpy": 5, "MPI:MPI_Init": 1,
                     "MPI:MPI_Finalize": 1}
    # nvtxNameOsThread (eventType 39) names the main thread.
    assert "MPI Rank 0" in t.threads.get_column("name").to_list()
    # mfu (2026.2, windowed): NCCL's domain was created before the window, so its ranges keep
    # domainId 1 without a name, as nsys's own reports show them ("ncclSend", not "NCCL:ncclSend").
    m = load("nsysai_mfu_2gpu_before")
    nccl = m.nvtx_attrs.filter(pl.col(NvtxCol.DOMAIN_ID) == 1)
    assert nccl.height == 462 and nccl.get_column(NvtxCol.DOMAIN).null_count() == 462
    sends = m.slices.filter(pl.col(Col.NAME).cast(pl.String) == "ncclSend")
    assert sends.height == 132
    assert any("domains [1] whose creation was not captured" in w for w in m.meta.warnings)


def test_devices_threads_and_session() -> None:
    mock = load("nsysai_mock_rtx3080")  # the only nsys-ai file with TARGET_INFO_GPU
    d = mock.devices.row(0, named=True)
    assert (d["device"], d["name"], d["num_sms"], d["compute_major"]) == (0, "NVIDIA GeForce RTX 3080", 68, 8)
    h100 = load("nsysai_h100_2gpu_1s")  # no TARGET_INFO_GPU: devices from the activity tables
    assert h100.devices.get_column("device").to_list() == [0, 1]
    assert h100.devices.get_column("name").null_count() == 2
    assert set(h100.threads.filter(pl.col("tid").is_null()).get_column("pid").to_list()) == {111, 112}
    for name in FIXTURES:
        t = load(name)
        start, stop = raw_db(name).execute("SELECT startTime, stopTime FROM ANALYSIS_DETAILS").fetchone()
        utc = raw_db(name).execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
        if name == "nsysai_mock_rtx3080":
            # nsys 2026.1 wrote ANALYSIS_DETAILS on the raw monotonic clock (5.15e14 ns) but the
            # events from the session start: the session is [0, duration] on the events' clock.
            assert start > 5 * 10**14 and t.meta.profiler_spans_ns == ((0, stop - start),)
            assert t.meta.base_time_ns == utc and any("another clock" in w for w in t.meta.warnings)
            start = 0
        else:
            assert t.meta.profiler_spans_ns == ((start, stop),)
            assert t.meta.base_time_ns is not None and t.meta.base_time_ns + start == utc
        assert t.meta.capture_settings["SESSION_START_NS"] == str(start)
        assert not any("ENVIRONMENT" in k for k in t.meta.capture_settings)
        # Every GPU operation ends before the session stops (some start before its nominal
        # start: nsys's zero is a little earlier, NSYS_NOTES §1.2).
        gpu = t.slices.filter(pl.col(Col.KIND).is_in(["kernel", "memcpy", "memset"]))
        assert (gpu.get_column(Col.TS) + gpu.get_column(Col.DUR)).max() <= t.meta.profiler_spans_ns[0][1]
    assert "DERIVED_WINDOW_NS" in h100.meta.capture_settings


# --- tiny exports, one quirk each ---------------------------------------------------------------


def test_tables_exist_only_with_rows(tmp_path: Path) -> None:
    b = ExportBuilder()
    b.kernel("k()", 100, 200, corr=1)  # a kernel whose API call is not in the file
    t = read_nsys(b.write(tmp_path / "k.sqlite"))
    t.check()
    assert t.slices.get_column(Col.KIND).cast(pl.String).to_list() == ["kernel"]
    assert t.slices.get_column(Col.LAUNCH).to_list() == [None]
    assert t.kernel_attrs.row(0, named=True)["shared_mem_bytes"] == 1024


def test_empty_tables_of_a_non_lazy_export(tmp_path: Path) -> None:
    path = ExportBuilder().write(tmp_path / "e.sqlite")
    conn = sqlite3.connect(path)
    conn.execute('CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, "end", deviceId, streamId, '
                 "correlationId, globalPid, demangledName)")
    conn.execute("CREATE TABLE NVTX_EVENTS (start, \"end\", eventType, globalTid)")
    conn.commit()
    conn.close()
    t = read_nsys(path)
    t.check()
    assert t.slices.height == 0
    assert any("no CUDA, NVTX or OS runtime events" in w for w in t.meta.warnings)


def test_oldest_schema_without_enum_tables(tmp_path: Path) -> None:
    b = ExportBuilder(schema="2.9.1")
    c = b.api("cudaMemcpy_v3020", 100, 900)
    b.memcpy(200, 800, c, copy_kind=2, src=2, dst=0)
    t = read_nsys(b.write(tmp_path / "old.sqlite"))
    t.check()
    m = t.of_kind(Kind.MEMCPY).row(0, named=True)
    assert m[Col.NAME] == "Memcpy DtoH (Device -> Pageable)"
    assert t.meta.versions["nsys_export_schema"] == "2.9.1"


def test_session_clock_and_normalized_exports(tmp_path: Path) -> None:
    b = ExportBuilder()
    b.kernel("k()", 5000, 6000, corr=1)
    t = read_nsys(b.write(tmp_path / "plain.sqlite"))
    # ANALYSIS_DETAILS.startTime (1000) is the session start on the trace clock.
    assert t.meta.profiler_spans_ns == ((1000, 10**9 + 1000),)
    assert t.meta.base_time_ns == UTC_START - 1000
    assert t.meta.capture_settings["SESSION_START_UTC"] == "2026-01-01T00:00:00"
    # --ts-normalize=true: timestamps are UTC epoch ns already.
    b.export_meta["EXPORT_PARAM_TIME_NORMALIZE"] = "true"
    assert read_nsys(b.write(tmp_path / "normalized.sqlite")).meta.base_time_ns == 0


def test_api_names_lose_only_the_version_suffix(tmp_path: Path) -> None:
    assert api_name("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    assert api_name("cudaLaunchKernelExC_v11060") == "cudaLaunchKernelExC"
    assert api_name("cudaGetDeviceProperties_v2_v12000") == "cudaGetDeviceProperties_v2"
    assert api_name("cuGetProcAddress_v2") == "cuGetProcAddress_v2"
    b = ExportBuilder()
    b.api("cuLaunchKernel", 10, 20, event_class=1)
    b.api("cudaFree_v3020", 30, 40)
    t = read_nsys(b.write(tmp_path / "a.sqlite"))
    rows = t.slices.select(pl.col(Col.KIND).cast(pl.String), pl.col(Col.NAME).cast(pl.String)).rows()
    assert rows == [("driver", "cuLaunchKernel"), ("runtime", "cudaFree")]


def test_backtrace_rows_dropped_only_when_the_call_is_there(tmp_path: Path) -> None:
    b = ExportBuilder()
    c = b.api("cudaMalloc_v3020", 100, 200)
    b.api("cudaMalloc", 90, 210, corr=c, event_class=67)  # duplicate of the call above
    b.api("cudaFree", 300, 400, event_class=67)  # alone: the only record of that call
    t = read_nsys(b.write(tmp_path / "bt.sqlite"))
    assert t.slices.select(Col.TS, pl.col(Col.NAME).cast(pl.String)).rows() == [
        (100, "cudaMalloc"), (300, "cudaFree")]


def test_same_correlation_id_in_two_processes(tmp_path: Path) -> None:
    b = ExportBuilder()
    b.api("cudaLaunchKernel_v7000", 100, 110, pid=1, tid=1, corr=7)
    b.api("cudaMemcpyAsync_v3020", 105, 115, pid=2, tid=2, corr=7)
    b.kernel("k()", 200, 300, 7, pid=1)
    b.memcpy(250, 350, 7, pid=2)
    t = read_nsys(b.write(tmp_path / "two.sqlite"))
    t.check()
    names = t.slices.get_column(Col.NAME).cast(pl.String)
    for kind, api in ((Kind.KERNEL, "cudaLaunchKernel"), (Kind.MEMCPY, "cudaMemcpyAsync")):
        row = t.of_kind(kind).row(0, named=True)
        assert names[row[Col.LAUNCH]] == api


# Domain ids that pack with the pid into one lookup key, and one too large to (then joined).
@pytest.mark.parametrize("domain", [1, 1 << 40])
def test_nvtx_open_cross_thread_and_per_process_domains(tmp_path: Path, domain: int) -> None:
    b = ExportBuilder()
    b.nvtx("A", 10, 0, event_type=75, pid=1, domain=domain)  # this domain of process 1 is "A"
    b.nvtx("B", 10, 0, event_type=75, pid=2, domain=domain)  # the same id in process 2 is "B"
    b.nvtx("step", 100, 500, pid=1, tid=1, domain=domain, registered=True)
    b.nvtx("step", 100, 500, pid=2, tid=2, domain=domain)
    b.nvtx("open", 600, None, pid=1, tid=1)  # still open at the end of the capture
    b.nvtx("io", 50, 900, event_type=60, pid=1, tid=1, end_tid=3)  # ended on thread 3
    b.nvtx("here", 700, None, event_type=34, pid=1, tid=1)  # a mark
    t = read_nsys(b.write(tmp_path / "nvtx.sqlite"))
    t.check()
    rows = t.slices.join(t.nvtx_attrs, on=Col.ID).select(
        pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR, pl.col(NvtxCol.STYLE).cast(pl.String),
        NvtxCol.END_TID).sort(Col.TS, Col.NAME).rows()
    assert rows == [
        ("io", 50, 850, "StartEnd", 3),
        ("A:step", 100, 400, "PushPop", None),
        ("B:step", 100, 400, "PushPop", None),
        ("open", 600, 300, "PushPop", None),  # runs to the last NVTX timestamp (900)
        ("here", 700, 0, "Mark", None),
    ]
    assert any("never ended" in w for w in t.meta.warnings)


def test_sync_records_named_by_their_call(tmp_path: Path) -> None:
    b = ExportBuilder()
    c = b.api("cudaStreamSynchronize_v3020", 100, 900)
    b.add("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", start=150, end=850, deviceId=0, contextId=1,
          streamId=7, correlationId=c, globalPid=gtid(PID, 0), syncType=2)  # 2025.1 writes 2
    d = b.api("cudaEventSynchronize_v3020", 1000, 1100)
    b.add("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", start=1010, end=1090, deviceId=0, contextId=1,
          streamId=0xFFFFFFFF, correlationId=d + 1000, globalPid=gtid(PID, 0), syncType=1)
    t = read_nsys(b.write(tmp_path / "sync.sqlite"))
    t.check()
    s = t.of_kind(Kind.GPU_SYNC).select(pl.col(Col.NAME).cast(pl.String), Col.STREAM, Col.LAUNCH).rows()
    assert s[0][0] == "Stream Sync" and s[0][2] is not None
    assert s[1] == ("Event Sync", None, None)  # no call in the file: named by syncType


def test_os_runtime_and_profiler_overhead(tmp_path: Path) -> None:
    b = ExportBuilder()
    b.add("OSRT_API", start=10, end=500, eventClass=27, globalTid=gtid(), nameId=b.sid("pthread_cond_wait"),
          returnValue=0, nestingLevel=0, callchainId=None)
    b.add("PROFILER_OVERHEAD", start=600, end=700, globalTid=gtid(), nameId=b.sid("CUPTI Buffer flush"))
    t = read_nsys(b.write(tmp_path / "osrt.sqlite"))
    t.check()
    assert t.slices.select(pl.col(Col.KIND).cast(pl.String), pl.col(Col.NAME).cast(pl.String), Col.TID).rows() == [
        ("other", "pthread_cond_wait", 4242), ("overhead", "CUPTI Buffer flush", 4242)]


# --- input handling -----------------------------------------------------------------------------


def _small_export(tmp_path: Path) -> Path:
    b = ExportBuilder()
    b.kernel("k()", 100, 200, b.api("cudaLaunchKernel_v7000", 50, 60))
    return b.write(tmp_path / "small.sqlite")


def test_sniffed_by_content_plain_and_gzipped_and_never_written_beside(tmp_path: Path) -> None:
    src = _small_export(tmp_path)
    folder = tmp_path / "ro"
    folder.mkdir()
    plain = folder / "trace.bin"  # any name: the content decides
    shutil.copy(src, plain)
    gz = folder / "trace.dat"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)  # nothing may be created here
    try:
        before = sorted(os.listdir(folder))
        for path in (plain, gz):
            t = read_trace(path)
            t.check()
            assert t.meta.format == "nsys" and t.of_kind(Kind.KERNEL).height == 1
        assert sorted(os.listdir(folder)) == before
    finally:
        folder.chmod(stat.S_IRWXU)


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    broken = tmp_path / "broken.sqlite.gz"
    broken.write_bytes(gzip.compress(b"SQLite format 3\x00" + bytes(range(256)) * 64)[:400])  # cut short
    stream = tmp_path / "capture.qdstrm"
    stream.write_bytes(b"U3w[END]NVIDIA Nsight Systems Stream 2023.4" + b"\x00" * 64)
    cases = {other: "not an Nsight Systems export", broken: "gzip", stream: "QdstrmImporter"}
    for path, words in cases.items():
        with pytest.raises(TraceError) as e:
            read_trace(path)
        assert words in str(e.value) and "\n" not in str(e.value)


TID_BIG = 2**24 - 1  # the largest thread id a serialized global id holds


def test_aggregated_fetch_keeps_every_string_and_integer(tmp_path: Path) -> None:
    # Columns travel from SQLite as one text each (integers comma-separated, strings as a JSON
    # array): separators, quotes, escapes, non-ASCII, empty strings, NULLs and extreme integers
    # must come back as they went in.
    texts = ['a,b', 'say "hi"', "back\\slash", "tab\tand\nnewline", "émoji 😀", "", "[1, 2]", "null"]
    b = ExportBuilder()
    for i, text in enumerate(texts):
        b.nvtx(text, 100 * i, 100 * i + 50, tid=TID_BIG if i % 2 else 7)
    b.nvtx(None, 5000, 5050)
    for i, name in enumerate(['k<a,"b">(x)', "üñí"]):
        b.kernel(name, 6000 + 100 * i, 6050 + 100 * i, b.api("cudaLaunchKernel_v7000", 5900 + i, 5910 + i),
                 stream=2**32 - 2)
    path = b.write(tmp_path / "strings.sqlite")
    t = read_nsys(path)
    t.check()
    conn = sqlite3.connect(path)
    raw = conn.execute('SELECT start, "end", text, globalTid & 16777215 FROM NVTX_EVENTS ORDER BY start').fetchall()
    got = t.of_kind(Kind.ANNOTATION).sort(Col.TS).select(
        Col.TS, Col.DUR, pl.col(Col.NAME).cast(pl.String), Col.TID).rows()
    assert [(s, e - s, txt if txt is not None else "<unnamed NVTX range>", tid) for s, e, txt, tid in raw] == got
    kernels = t.of_kind(Kind.KERNEL).sort(Col.TS).select(pl.col(Col.NAME).cast(pl.String), Col.STREAM).rows()
    assert kernels == [('k<a,"b">(x)', 2**32 - 2), ("üñí", 2**32 - 2)]


def test_a_column_of_the_wrong_type_is_a_one_line_error(tmp_path: Path) -> None:
    b = ExportBuilder()
    b.kernel("k()", 100, 200, b.api("cudaLaunchKernel_v7000", 10, 20))
    path = b.write(tmp_path / "typed.sqlite")
    conn = sqlite3.connect(path)
    conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon'")
    conn.commit()
    conn.close()
    with pytest.raises(TraceError) as e:
        read_nsys(path)
    assert "wrong type" in str(e.value) and "\n" not in str(e.value) and "typed.sqlite" in str(e.value)


def test_gzip_inflation_is_bounded(tmp_path: Path) -> None:
    gz = tmp_path / "big.sqlite.gz"
    gz.write_bytes(gzip.compress(_small_export(tmp_path).read_bytes()))
    with pytest.raises(TraceError, match="inflates to more than 1000 bytes"):
        read_nsys(gz, max_inflated_bytes=1000)


def test_report_without_nsys_names_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"\x00NSYS-REPORT-PRIVATE-FORMAT")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("TRACEWHY_NSYS", raising=False)
    with pytest.raises(TraceError) as e:
        read_trace(report)
    assert f"nsys export --type sqlite --force-overwrite true --quiet true --output {tmp_path / 'run.sqlite'}" \
        in str(e.value)


def _fake_nsys(tmp_path: Path, export: Path, fail: bool = False) -> Path:
    """A stand-in for nsys that 'exports' by copying a prepared SQLite file, and logs calls."""
    script = tmp_path / "fake-nsys"
    body = "sys.stderr.write('Error: report version is newer than this nsys\\n'); sys.exit(1)" if fail else (
        f"shutil.copy({str(export)!r}, sys.argv[sys.argv.index('--output') + 1])")
    script.write_text(
        f"#!{sys.executable}\nimport shutil, sys\n"
        f"open({str(tmp_path / 'calls.log')!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n{body}\n")
    script.chmod(0o755)
    return script


def test_report_exported_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "in" / "run.nsys-rep"
    report.parent.mkdir()
    report.write_bytes(b"\x00report")
    monkeypatch.setenv("TRACEWHY_NSYS", str(_fake_nsys(tmp_path, _small_export(tmp_path))))
    monkeypatch.setenv("TRACEWHY_CACHE_DIR", str(tmp_path / "cache"))
    for _ in range(2):
        t = read_trace(report)
        assert t.meta.path == str(report) and t.of_kind(Kind.KERNEL).height == 1
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("export --type sqlite")
    assert os.listdir(report.parent) == ["run.nsys-rep"]
    assert len(list((tmp_path / "cache" / "nsys").glob("run-*.sqlite"))) == 1


def test_report_export_failure_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "run.qdrep"
    report.write_bytes(b"\x00report")
    monkeypatch.setenv("TRACEWHY_NSYS", str(_fake_nsys(tmp_path, tmp_path, fail=True)))
    monkeypatch.setenv("TRACEWHY_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(TraceError, match="report version is newer than this nsys"):
        read_trace(report)
    assert not list((tmp_path / "cache" / "nsys").glob("*"))


def test_batched_fetch_gives_the_same_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    # Big tables are converted a batch of rows at a time; batch edges must not show.
    name = "nvfuser_matmul_h200_2024.6"
    monkeypatch.setattr(nsys_db, "FETCH_BATCH", 7)
    monkeypatch.setenv("TRACEWHY_NSYS_ADBC", "0")  # integer tables too (the Arrow fetch does not batch)
    small = read_nsys(export_path(name))
    for table in ("slices", "kernel_attrs", "copy_attrs", "nvtx_attrs", "threads", "devices"):
        assert small.table(table).equals(load(name).table(table)), table


def test_parsed_trace_cache_round_trip(tmp_path: Path) -> None:
    # read_trace caches the parsed Trace (model/cache.py); the NVTX side table and the capture
    # settings survive the round trip.
    options = CacheOptions(directory=tmp_path)
    path = export_path("nsysai_h100_2gpu_1s")
    first, second = read_trace(path, cache=options), read_trace(path, cache=options)
    assert len(list(tmp_path.iterdir())) == 1
    for name in ("slices", "nvtx_attrs", "kernel_attrs", "copy_attrs", "threads", "devices"):
        assert first.table(name).equals(second.table(name)), name
    assert first.meta == second.meta and second.meta.capture_settings["DERIVED_WINDOW_NS"]


def test_real_export_reads_the_same_plain_or_gzipped(tmp_path: Path) -> None:
    name = "nvfuser_matmul_h200_2024.6"
    plain = tmp_path / "x.sqlite"
    plain.write_bytes(gzip.decompress(export_path(name).read_bytes()))
    a, b = read_trace(plain), load(name)
    assert a.slices.equals(b.slices) and a.nvtx_attrs.equals(b.nvtx_attrs)
