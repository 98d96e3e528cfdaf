"""Bad input: one line naming the file and the problem, a non-zero exit, no traceback, and the
user's file untouched."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import warnings
import zlib
from pathlib import Path

import polars as pl
import pytest

import tracewhy
from builders import KinetoBuilder
from conftest import shared_trace
from tracewhy.cli import EXIT_BAD_INPUT, main
from tracewhy.model import Kind


def _run(path: Path, capsys: pytest.CaptureFixture[str], command: str = "kernels") -> tuple[int, str]:
    before = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns) if path.is_file() else None
    code = main([command, str(path)])
    err = capsys.readouterr().err
    if before is not None:
        assert (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns) == before
    return code, err


def _assert_one_line_error(code: int, err: str, path: Path, fragment: str) -> None:
    assert code == EXIT_BAD_INPUT
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(path) in lines[0] and fragment in lines[0], lines[0]


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("empty.json", b"", "empty"),
        ("blank.json", b"   \n", "empty"),
        ("text.json", b"hello world", "not a recognized trace"),
        ("number.json", b"42", "not a recognized trace"),
        ("noevents.json", b'{"foo": 1}', "no traceEvents"),
        ("eventsnotlist.json", b'{"traceEvents": 5}', "traceEvents is not a list"),
        ("malformed.json", b'{"traceEvents": [{"ph": "X",, }]}', "not valid JSON"),
        ("rows.json", b"[[1, 2], [3, 4]]", "memory-timeline"),
        ("allbad.json", b'{"traceEvents": [{"ph": 1}, {"ts": "x"}]}', "no usable events"),
        ("binary.json", bytes(range(256)), "not a recognized trace"),
    ],
)
def test_bad_content(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes,
                     fragment: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    code, err = _run(path, capsys)
    _assert_one_line_error(code, err, path, fragment)


def test_missing_file_and_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(tmp_path / "nope.json", capsys)
    _assert_one_line_error(code, err, tmp_path / "nope.json", "no such file")
    code, err = _run(tmp_path, capsys)
    assert code == EXIT_BAD_INPUT and "Traceback" not in err


@pytest.mark.parametrize("inflater", ["isal", "zlib"])
def test_corrupt_gzip(inflater: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    if inflater == "zlib":  # the fallback when ISA-L is not installed
        import zlib

        from tracewhy.readers import source

        monkeypatch.setattr(source, "_inflater", zlib)
    good = gzip.compress(json.dumps(KinetoBuilder().op("a", 0, 1).doc()).encode() * 1)
    path = tmp_path / "corrupt.json.gz"
    path.write_bytes(good[:12] + b"\xff" * 40 + good[52:])
    code, err = _run(path, capsys)
    _assert_one_line_error(code, err, path, "gzip")


def test_gzip_bomb_is_refused(tmp_path: Path) -> None:
    from tracewhy.errors import TraceError
    from tracewhy.readers.kineto.reader import read_kineto

    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * 5_000_000 + b"]}"))
    with pytest.raises(TraceError, match="refusing"):
        read_kineto(path, max_inflated_bytes=1_000_000)


def test_chakra_execution_trace_named(capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_trace("hta/a100_torch_add_chakra_execution_trace_et.json.gz")
    code, err = _run(path, capsys)
    _assert_one_line_error(code, err, path, "execution trace")


def test_wrongly_typed_fields_are_skipped_with_a_warning(tmp_path: Path) -> None:
    b = KinetoBuilder().op("good", 0, 10)
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "bad_ts", "pid": 1, "tid": 1, "ts": "soon", "dur": 1})
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 1, "dur": 1})
    b.events.append({"ph": "X", "cat": "kernel", "name": "odd_args", "pid": 0, "tid": 7, "ts": 3, "dur": 1,
                     "args": {"correlation": "not-a-number", "device": 0}})
    trace = tracewhy.load(b.write(tmp_path / "typed.json"))
    trace.check()
    names = set(trace.slices.get_column("name").cast(str).to_list())
    assert names == {"good", "odd_args"}
    joined = " | ".join(trace.meta.warnings)
    assert "event skipped" in joined and "args ignored" in joined and "without ts" in joined


def _cut(path: Path, fraction: float, out: Path) -> bytes:
    data = gzip.decompress(path.read_bytes())
    cut = data[: int(len(data) * fraction)]
    out.write_bytes(cut)
    return cut


def _complete_events(text: str) -> int:
    """The complete event objects of a cut-off trace's events array, found by the standard
    library's incremental decoder walking the array until the cut."""
    decoder, gap = json.JSONDecoder(), re.compile(r"[\s,]*")
    pos, complete = text.index("[", text.index('"traceEvents"')) + 1, 0
    while True:
        pos = gap.match(text, pos).end()  # type: ignore[union-attr]
        try:
            _, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return complete
        complete += 1


def test_truncated_real_trace_recovers_complete_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz")
    cut_path = tmp_path / "crashed.json"
    cut = _cut(src, 0.6, cut_path)
    # Independent count: the complete event objects before the cut.
    complete = _complete_events(cut.decode())
    trace = tracewhy.load(cut_path)
    trace.check()
    t = trace.meta.truncation
    assert t is not None and t.events_recovered == complete
    assert any("file ends mid-event" in w for w in trace.meta.warnings)
    assert trace.devices.height == 8  # deviceProperties precede the events and survive the cut
    assert trace.of_kind(Kind.KERNEL).height > 0
    code = main(["kernels", str(cut_path), "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["total_count"] > 0


def test_truncated_gzip_stream_recovers(tmp_path: Path) -> None:
    src = shared_trace("perfdigest/rtx4060laptop_torch_compiled_train.json.gz")
    data = src.read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: int(len(data) * 0.7)])
    trace = tracewhy.load(path)
    assert trace.meta.truncation is not None and trace.slices.height > 0


def test_hostile_strings_survive_and_print_plainly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hostile = "<script>alert(1)</script>\x1b[31m[red]\n\"'\u202e"
    b = KinetoBuilder().launch(hostile, 0, 1, gpu_ts=2, gpu_dur=3)
    path = b.write(tmp_path / "hostile.json")
    assert main(["kernels", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kernels"][0]["name"] == hostile
    assert main(["kernels", str(path)]) == 0
    assert "\x1b[31m" not in capsys.readouterr().out


def test_hostile_names_in_every_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hostile = "[bold red]boom[/]\x1b]0;title\x07\u202e"
    b = KinetoBuilder()
    for i in range(3):
        b.annotation(f"ProfilerStep#{i}", i * 100, 100).op(hostile, i * 100 + 1, 50)
        b.launch(hostile, i * 100 + 2, 1, gpu_ts=i * 100 + 60, gpu_dur=3)
    b.header["deviceProperties"] = [{"id": 0, "name": hostile, "totalGlobalMem": 1}]
    path = b.write(tmp_path / "hostile2.json")
    for command in ("info", "ops", "kernels", "steps", "gaps", "diagnose"):
        assert main([command, str(path)]) == 0
        out = capsys.readouterr().out
        assert "\x1b]" not in out and "\u202e" not in out and "\x07" not in out
        if command in ("ops", "kernels"):
            assert "[bold red]boom[/]" in out  # shown literally, not taken as markup


def test_integers_beyond_int64_are_wrongly_typed_not_a_crash(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A corrupt or hostile file can hold integers no int64 column can: in args they make that
    event's args "of the wrong shape" (the event stays), as a pid or flow id they skip the event,
    and a GPU event's device number beyond int32 is taken as -1. Every command still runs."""
    huge = 2**63 + 5
    b = KinetoBuilder().op("good", 0, 10)
    b.events += [
        {"ph": "X", "cat": "kernel", "name": "k_big_corr", "pid": 0, "tid": 7, "ts": 1, "dur": 1,
         "args": {"correlation": huge, "device": 0}},
        {"ph": "X", "cat": "kernel", "name": "k_big_device", "pid": 0, "tid": 7, "ts": 2, "dur": 1,
         "args": {"correlation": 6, "device": 2**33}},
        {"ph": "X", "cat": "kernel", "name": "k_big_pid", "pid": 2**40, "tid": 7, "ts": 3, "dur": 1,
         "args": {"correlation": 7}},
        # The lowest int64 is left out too: the reader means "not known" by it while it builds.
        {"ph": "X", "cat": "kernel", "name": "k_lowest_corr", "pid": 0, "tid": 7, "ts": 3.5, "dur": 1,
         "args": {"correlation": -(2**63)}},
        {"ph": "X", "cat": "cpu_op", "name": "op_big_args", "pid": 1, "tid": 1, "ts": 0, "dur": 5,
         "args": {"External id": huge, "Sequence number": 2**64}},
        {"ph": "X", "cat": "cpu_op", "name": "skipped", "pid": 2**64, "tid": 1, "ts": 0, "dur": 5},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": huge, "pid": 1, "tid": 1, "ts": 0},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 0,
         "args": {"Bytes": 2**70}},
        # Quoted numbers (ROCm, string pids) and float FLOPs are parsed by the reader itself.
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
         "ts": 4, "dur": 1, "args": {"correlation": 8, "stream": "0x" + "F" * 20, "bytes": "9" * 25}},
        {"ph": "X", "cat": "cpu_op", "name": "op_quoted_pid", "pid": "9" * 25, "tid": "stream " + "9" * 25,
         "ts": 30, "dur": 1, "args": {"flops": 1e30, "Sequence number": 3}},
    ]
    path = b.write(tmp_path / "huge.json")
    trace = tracewhy.load(path)
    trace.check()
    s = trace.slices.with_columns(pl.col("name").cast(pl.String))
    by_name = {r["name"]: r for r in s.iter_rows(named=True)}
    assert set(by_name) == {"good", "k_big_corr", "k_big_device", "k_big_pid", "k_lowest_corr", "op_big_args",
                            "Memcpy HtoD (Pageable -> Device)", "op_quoted_pid"}
    assert by_name["k_lowest_corr"]["correlation"] is None
    # Quoted numbers beyond int64 are unknown, as any unreadable quoted number is.
    assert by_name["Memcpy HtoD (Pageable -> Device)"]["stream"] is None
    assert trace.copy_attrs.get_column("bytes").to_list() == [None]
    assert (by_name["op_quoted_pid"]["pid"], by_name["op_quoted_pid"]["tid"]) == (-1, -1)
    assert trace.op_attrs.select("flops", "sequence_number").rows() == [(None, 3)]
    # Its args are ignored whole, so its device comes from its pid, as for any GPU event without one.
    assert by_name["k_big_corr"]["correlation"] is None and by_name["k_big_corr"]["device"] == 0
    assert by_name["k_big_device"]["device"] == -1 and by_name["k_big_pid"]["device"] == -1
    assert by_name["op_big_args"]["external_id"] is None
    warnings = " | ".join(trace.meta.warnings)
    assert warnings.count("args ignored") == 4 and warnings.count("event skipped") == 2
    assert "2 events: device id beyond int32 taken as -1" in warnings
    for command in ("kernels", "info", "ops", "steps", "gaps", "diagnose"):
        assert main([command, str(path)]) == 0, command
    capsys.readouterr()


def test_times_beyond_int64_nanoseconds_are_not_usable(tmp_path: Path) -> None:
    """A start or duration no int64 nanosecond column can hold (1e300 us) used to wrap to
    garbage with numpy warnings on stderr. Such a slice, flow or memory event is skipped, such a
    duration taken as 0, each counted in a warning; start plus duration always fits. A number
    beyond float64 (1e400) is refused by the decoder itself: that event is skipped."""
    b = KinetoBuilder().op("good", 20, 5)
    b.events += [
        {"ph": "X", "cat": "cpu_op", "name": "far", "pid": 1, "tid": 1, "ts": 1e300, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "long", "pid": 1, "tid": 1, "ts": 10, "dur": 1e300},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 5, "pid": 1, "tid": 1, "ts": -1e300},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1e300,
         "args": {"Bytes": 5}},
        {"ph": "X", "cat": "cpu_op", "name": "beyond_float", "pid": 1, "tid": 1, "ts": 12345, "dur": 1},
    ]
    path = tmp_path / "far.json"
    path.write_text(json.dumps(b.doc()).replace('"ts": 12345', '"ts": 1e400'))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy cast warning may escape
        trace = tracewhy.load(path)
    trace.check()
    s = trace.slices.with_columns(pl.col("name").cast(pl.String))
    assert sorted(s.get_column("name").to_list()) == ["good", "long"]
    assert s.filter(pl.col("name") == "long").get_column("dur_ns").to_list() == [0]
    assert trace.flows.height == 0 and trace.memory.height == 0
    joined = " | ".join(trace.meta.warnings)
    for expected in ("slice with ts beyond int64 nanoseconds skipped", "dur beyond int64 nanoseconds taken as 0",
                     "flow event without usable ts skipped", "memory event without usable ts skipped",
                     "event skipped: Number out of range"):
        assert f"1 events: {expected}" in joined


def test_memory_events_without_usable_args_still_count_as_instants(tmp_path: Path) -> None:
    """A [memory] event whose args are missing, null or of the wrong shape is not a memory event
    (nothing to chart), but it is still counted among the instants; wrong shapes are warned of."""
    b = KinetoBuilder().op("op", 0, 5)
    b.events += [
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1, "args": None},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1,
         "args": {"Bytes": "x"}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2,
         "args": {"Bytes": 64, "Total Allocated": 64}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "other", "pid": 1, "tid": 1, "ts": 1},
    ]
    trace = tracewhy.load(b.write(tmp_path / "mem.json"))
    assert trace.meta.event_counts["instant"] == 4 and trace.meta.event_counts["memory"] == 1
    assert trace.memory.get_column("bytes").to_list() == [64]
    assert sum("args ignored" in w for w in trace.meta.warnings) == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
@pytest.mark.parametrize("argv", [
    ["info", "{p}"], ["kernels", "{p}", "--json"], ["diagnose", "{p}"], ["report", "{p}", "-o", "{o}"],
    ["export", "{p}", "-o", "{o}"], ["roofline", "{p}"], ["ranks", "{p}"], ["diff", "{p}", "{p}"],
])
def test_a_named_pipe_is_refused_not_waited_on(tmp_path: Path, argv: list[str]) -> None:
    # A fuzz run found every command blocked forever on a FIFO (open() waits for a writer).
    # Run in a child with a timeout, so that a regression fails instead of hanging the suite.
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    args = [a.format(p=fifo, o=tmp_path / "out.html") for a in argv]
    done = subprocess.run([sys.executable, "-m", "tracewhy", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TRACEWHY_NO_CACHE": "1"})
    assert done.returncode == EXIT_BAD_INPUT
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(fifo) in lines[0] and "not a regular file" in lines[0]


def test_inflating_far_past_the_compression_of_json_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # With the default limit (64 GiB) a 2 MB gzip of 2 GiB of white space was inflated and
    # held: now a file inflating past 200x its compressed size (and past a floor, lowered here
    # from 256 MB to 1 MB so the test stays small) is refused. Real traces inflate 5-30x.
    from tracewhy.readers import source

    monkeypatch.setattr(source, "_BOMB_FLOOR", 1024 * 1024)
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * 8_000_000 + b"]}"))
    code = main(["kernels", str(path), "--json"])
    _assert_one_line_error(code, capsys.readouterr().err, path, "200 times its compressed size")
    real = tmp_path / "real.json.gz"
    real.write_bytes(shared_trace("perfdigest/rtx4060laptop_torch_compiled_train.json.gz").read_bytes())
    assert main(["kernels", str(real), "--json"]) == 0


def test_a_cut_gzip_trailer_does_not_size_the_buffer(tmp_path: Path) -> None:
    # The last 4 bytes of a cut gzip are compressed data, not its size: a 1.4 KB cut file once
    # made the reader allocate up to 4 GB. The buffer is now bounded by what JSON's ratios allow.
    import tracemalloc

    from tracewhy.errors import TraceError
    from tracewhy.readers.source import read_bytes

    data = shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz").read_bytes()
    worst = 0
    for cut in range(len(data) // 2, len(data) // 2 + 64):
        path = tmp_path / "cut.json.gz"
        path.write_bytes(data[:cut])
        size = int.from_bytes(data[cut - 4 : cut], "little")
        worst = max(worst, size)
        tracemalloc.start()
        with contextlib.suppress(TraceError):  # a cut stream may fail to inflate: only memory is checked
            read_bytes(path)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 64 * len(data[:cut]) + 64 * 1024 * 1024
    assert worst > 256 * 1024 * 1024  # some of those trailers did claim hundreds of MB or more


@pytest.mark.parametrize(("cut", "fragment"), [(15, "cut short"), (48, "cut short"), (None, "file is empty")])
def test_a_gzip_with_no_content_says_whether_it_was_cut(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        cut: int | None, fragment: str) -> None:
    # The first 15 or 48 bytes of a real gzip trace inflate to nothing; they were called
    # "file is empty". A whole gzip of white space is empty.
    path = tmp_path / "t.json.gz"
    real = shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz").read_bytes()
    path.write_bytes(real[:cut] if cut is not None else gzip.compress(b"  \n"))
    code, err = _run(path, capsys)
    _assert_one_line_error(code, err, path, fragment)


def test_an_escape_in_a_file_name_is_not_sent_to_the_terminal(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "esc\x1b[2Jname.json"
    code, err = _run(path, capsys)
    assert code == EXIT_BAD_INPUT and "\x1b" not in err and "\\x1b[2Jname.json: no such file" in err


def test_a_file_cut_after_its_events_loses_no_events(tmp_path: Path) -> None:
    # The fuzz run found two cuts after the events array reported lost events: the ResNet trace
    # without its final "}" ("about 1 events lost" of 75,718 that were all there), and the DDP
    # trace cut inside the fields after the array ("about 7 events lost" of all). Both keep
    # every event (counted here in the raw JSON), say only trailing fields are cut, and are not
    # an "incomplete-trace" for diagnose.
    cases = [("kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz", lambda b: b.rstrip()[:-1]),
             ("hta/a100_ddp2_rank0_nccl2.17.json.gz", lambda b: b[: b.rfind(b'"traceName"') + 20])]
    for rel, cut in cases:
        raw = gzip.decompress(shared_trace(rel).read_bytes())
        n = len(json.loads(raw)["traceEvents"])
        path = tmp_path / "cut.json"
        path.write_bytes(cut(raw))
        trace = tracewhy.load(path)
        t = trace.meta.truncation
        assert t is not None and t.events_recovered == n and t.events_lost_estimate == 0 and not t.stream_cut
        assert any(f"all {n} events are complete" in w for w in trace.meta.warnings)
        from tracewhy.reports.diagnose import diagnose

        assert "incomplete-trace" not in [f.code for f in diagnose(trace).findings]


def test_a_cut_gzip_stream_says_the_loss_cannot_be_counted(tmp_path: Path) -> None:
    # Cut at half its compressed bytes, the DDP trace inflates to a prefix of the JSON whose end
    # the reader cannot see: it once said "about 1 events (82 bytes) lost" when most were. The
    # recovered events are the complete ones of that prefix (counted here by a second inflate).
    data = shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz").read_bytes()
    path = tmp_path / "half.json.gz"
    path.write_bytes(data[: len(data) // 2])
    prefix = zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(data[: len(data) // 2])
    complete = _complete_events(prefix.decode("utf-8", "replace"))
    trace = tracewhy.load(path)
    t = trace.meta.truncation
    assert t is not None and t.stream_cut and t.events_recovered == complete
    assert any("gzip stream ends early" in w and "cannot be told" in w for w in trace.meta.warnings)


@pytest.mark.parametrize("content", [b'{"traceEvents": []}', b"[]"])
def test_an_empty_trace_is_said_to_be_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            content: bytes) -> None:
    # The fuzz run found diagnose calling an empty trace healthy ("nothing here costs a
    # meaningful share"), after CPU-only and no-step-markers notes that say nothing about it.
    path = tmp_path / "empty.json"
    path.write_bytes(content)
    assert main(["diagnose", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in doc["findings"]] == ["empty-trace"]
    assert main(["diagnose", str(path)]) == 0
    out = capsys.readouterr().out
    assert "empty-trace" in out and "Nothing here costs" not in out
