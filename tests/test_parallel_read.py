"""Reading with helper processes must give the Trace the serial read gives, row for row.

The batches are made small so that real traces of a few MB go through several helper rounds;
the serial read is the reference (itself checked against raw-JSON sums in test_kineto_real).
"""

from __future__ import annotations

import gzip
import re
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal
from tests.builders import KinetoBuilder
from tests.conftest import shared_trace

from tracewhy import read_helpers
from tracewhy.model.trace import Trace
from tracewhy.readers import source
from tracewhy.readers.kineto import document as kineto_document
from tracewhy.readers.kineto import parallel as kineto_parallel
from tracewhy.readers.kineto import pieces as kineto_pieces
from tracewhy.readers.kineto.reader import read_kineto
from tracewhy.readers.source import iter_content

TABLES = ("slices", "memory", "flows", "threads", "kernel_attrs", "copy_attrs", "op_attrs", "devices")


def _assert_same(a: Trace, b: Trace) -> None:
    for name in TABLES:
        assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    assert a.meta == b.meta


@pytest.mark.parametrize("relative", [
    "tracelens/h100_timesformer_video_bs1.json.gz",      # with_stack: Python frames, memory events
    "hta/v100_rank0_displayTimeUnit_ns_fractional_us.json.gz",  # DDP, NCCL, overrunning runtime calls
    "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz",  # PyTorch 1.8 legacy names
])
@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("split", ["pieces", "raw events"])
def test_helpers_give_the_serial_trace(relative: str, workers: int, split: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways of splitting a large file: pieces cut between events as it is read, and (the
    careful way) raw events found by a parse of the whole; small pieces and batches, and no
    one-pass read, make helpers take real work."""
    path = shared_trace(relative)
    serial = _read_whole(path)
    _pieces_for_any_size(monkeypatch, 300_000)
    if split == "raw events":
        monkeypatch.setattr(kineto_pieces.PieceStream, "pieces", _refuse)
    built_by_helpers = []
    receive = kineto_parallel.Helper.receive

    def counting(self: kineto_parallel.Helper) -> object | None:
        part = receive(self)
        built_by_helpers.append(part is not None)
        return part

    monkeypatch.setattr(kineto_parallel.Helper, "receive", counting)
    # Batches a helper has not started are taken back at the end of the read: on a file this
    # small, all of them (a helper takes longer to start than the read). Not taken back here.
    monkeypatch.setattr(kineto_parallel, "_take_back", lambda *args: None)
    parallel = read_kineto(path, workers=workers, batch_size=4000)
    # Helpers really built parts (a broken helper would silently leave them all to us).
    assert len(built_by_helpers) >= workers - 1 and all(built_by_helpers)
    _assert_same(serial, parallel)


@pytest.mark.parametrize("workers", [2, 3])
def test_batches_a_helper_has_not_started_are_taken_back(workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch is claimed by renaming its file: the helper's claim or ours wins, never both.
    Helpers that start slowly have their batches taken back at the end; each batch is built
    once, the Trace is the serial one, and each helper answered that it skipped them."""
    path = shared_trace("tracelens/h100_timesformer_video_bs1.json.gz")
    serial = _read_whole(path)
    _pieces_for_any_size(monkeypatch, 300_000)
    real_popen = kineto_parallel.subprocess.Popen

    def slow(argv: list[str], **kwargs: object) -> object:
        return real_popen([*argv[:-1], "import time; time.sleep(1); " + argv[-1]], **kwargs)  # type: ignore[call-overload]

    skipped: list[int] = []
    skip = kineto_parallel.Helper.skip

    def counting(self: kineto_parallel.Helper) -> None:
        skip(self)
        skipped.append(0 if self.broken else 1)

    monkeypatch.setattr(kineto_parallel.subprocess, "Popen", slow)
    monkeypatch.setattr(kineto_parallel.Helper, "skip", counting)
    _assert_same(serial, read_kineto(path, workers=workers))
    assert len(skipped) == 2 * (workers - 1) and all(skipped)


def test_a_helper_that_dies_costs_only_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper that exits at once (killed, out of memory...): its batches are built here."""
    path = shared_trace("tracelens/h100_timesformer_video_bs1.json.gz")
    real_popen = kineto_parallel.subprocess.Popen

    def dying(argv: list[str], **kwargs: object) -> object:
        return real_popen([sys.executable, "-c", "import sys; sys.exit(3)"], **kwargs)  # type: ignore[call-overload]

    whole = read_kineto(path, workers=1)
    monkeypatch.setattr(kineto_parallel.subprocess, "Popen", dying)
    _pieces_for_any_size(monkeypatch, 300_000)
    _assert_same(whole, read_kineto(path, workers=2, batch_size=4000))


def test_scratch_files_are_removed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    made: list[Path] = []
    real = kineto_parallel.scratch_dir

    def recording() -> Path:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(kineto_parallel, "scratch_dir", recording)
    read_kineto(shared_trace("tracelens/h100_timesformer_video_bs1.json.gz"), workers=2, batch_size=4000)
    assert made and not made[0].exists()


def test_worker_count(monkeypatch: pytest.MonkeyPatch) -> None:
    big = read_helpers.PARALLEL_MIN_BYTES
    monkeypatch.delenv(read_helpers.ENV_WORKERS, raising=False)
    monkeypatch.delenv(read_helpers.ENV_IN_HELPER, raising=False)
    assert read_helpers.worker_count(big - 1) == 1
    assert read_helpers.worker_count(10, requested=3) == 3
    monkeypatch.setenv(read_helpers.ENV_IN_HELPER, "1")
    assert read_helpers.worker_count(big) == 1  # a helper never starts helpers
    monkeypatch.delenv(read_helpers.ENV_IN_HELPER)
    monkeypatch.setenv(read_helpers.ENV_WORKERS, "1")
    assert read_helpers.worker_count(big) == 1


def _read_whole(path: Path) -> Trace:
    """The reference: the file decoded in one typed pass, whatever its size."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(kineto_document, "ONE_PASS_MAX_BYTES", 1 << 40)
        return read_kineto(path, workers=1)


def _pieces_for_any_size(monkeypatch: pytest.MonkeyPatch, piece: int) -> None:
    """Send files of any size through piece reading, in pieces of ``piece`` bytes."""
    monkeypatch.setattr(kineto_document, "ONE_PASS_MAX_BYTES", 0)
    monkeypatch.setattr(kineto_pieces, "PIECE_BYTES", piece)


def _refuse(self: kineto_pieces.PieceStream) -> Iterator[bytes]:
    raise kineto_document.BadCut("refused by the test")
    yield b""


def _pieces(path: Path, piece: int) -> list[bytes]:
    return list(kineto_pieces.PieceStream(iter_content(path, piece), piece, path).pieces())


@pytest.mark.parametrize(("relative", "piece"), [
    ("tracelens/h100_timesformer_video_bs1.json.gz", 1_000_000),  # Kineto's pretty-printed layout
    ("perfdigest/rtx4060laptop_torch_sample.json.gz", 2_000),  # compact JSON, no white space at all
])
@pytest.mark.parametrize("workers", [1, 2])
def test_files_read_in_pieces_read_as_a_whole_parse(relative: str, piece: int, workers: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Files over the one-pass size are read in pieces cut between events as they come off the
    disk (kineto_pieces); small pieces and a zero one-pass limit send real traces that way."""
    path = shared_trace(relative)
    whole = _read_whole(path)
    assert len(_pieces(path, piece)) > 5
    _pieces_for_any_size(monkeypatch, piece)
    _assert_same(whole, read_kineto(path, workers=workers))


@pytest.mark.parametrize(("relative", "piece"), [
    ("tracelens/h100_timesformer_video_bs1.json.gz", 1_000_000),  # pretty-printed: "},\n  {"
    ("perfdigest/rtx4060laptop_torch_sample.json.gz", 2_000),  # compact: one comma between events
])
def test_a_plain_file_is_read_into_buffers_that_take_turns(relative: str, piece: int, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain file read by one process goes into buffers that take turns, each piece
    bracketed in place (in a compact file the closing bracket goes over the one comma between
    two events). The pieces are byte for byte those of the streamed read, a buffer is filled
    again only once no view of it is alive, the Trace is the whole parse's, and the file on disk
    is untouched."""
    path = tmp_path / "plain.json"
    path.write_bytes(gzip.decompress(shared_trace(relative).read_bytes()))
    before, stat = path.read_bytes(), path.stat()
    lent = kineto_pieces.LentPieces(path, piece)
    streamed = kineto_pieces.PieceStream(iter_content(path, piece), piece, path)
    buffers: list[int] = []
    copies = []
    for view in lent.pieces():
        buffers.append(id(view.obj))
        copies.append(bytes(view))
        del view  # as a consumer that keeps nothing
    assert len(copies) > 5 and copies == list(streamed.pieces())
    assert lent.header == streamed.header
    assert len(set(buffers)) <= 3  # reused, not one per piece
    held = list(kineto_pieces.LentPieces(path, piece).pieces())  # a consumer that keeps every piece
    assert len({id(v.obj) for v in held}) == len(held)  # a buffer still viewed is never refilled
    assert [bytes(v) for v in held] == copies
    lent.close()
    whole = _read_whole(path)
    _pieces_for_any_size(monkeypatch, piece)
    kinds: list[bool] = []
    real_open = kineto_pieces.open_pieces

    def recording(*args: object, **kwargs: bool) -> object:
        stream = real_open(*args, **kwargs)  # type: ignore[arg-type]
        kinds.append(isinstance(stream, kineto_pieces.LentPieces))
        return stream

    monkeypatch.setattr(kineto_pieces, "open_pieces", recording)
    _assert_same(whole, read_kineto(path, workers=1))
    assert kinds == [True]
    assert path.read_bytes() == before and path.stat().st_mtime_ns == stat.st_mtime_ns


@pytest.mark.parametrize("workers", [1, 2])
def test_a_cut_inside_an_event_falls_back_to_the_careful_read(workers: int, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Names that hold the very bytes the cutter looks for ("}, {"), with pieces so small that a
    cut lands inside them: the piece does not decode, and the file is read the careful way."""
    b = KinetoBuilder()
    for i in range(200):
        b.op(f"op{i} }}, {{ tricky", i * 10, 5)
    path = b.write(tmp_path / "tricky.json")
    whole = read_kineto(path, workers=1)
    with pytest.raises(kineto_document.BadCut):
        for body in _pieces(path, 1):
            kineto_document.decode_body(body, {})
    _pieces_for_any_size(monkeypatch, 1)
    got = read_kineto(path, workers=workers)
    assert got.slices.height == 200
    _assert_same(whole, got)


def test_a_cut_off_file_read_in_pieces_is_recovered_as_when_read_whole(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A crashed job's file ends mid-event: the pieces run out before the events close, and the
    whole read recovers the complete events before the cut, as it does for a small file."""
    data = gzip.decompress(shared_trace("tracelens/h100_timesformer_video_bs1.json.gz").read_bytes())
    path = tmp_path / "cut.json"
    path.write_bytes(data[: len(data) * 2 // 3])
    whole = _read_whole(path)
    assert whole.meta.truncation is not None
    _pieces_for_any_size(monkeypatch, 500_000)
    _assert_same(whole, read_kineto(path, workers=1))


@pytest.mark.parametrize("inflater", ["isal", "zlib"])
def test_gzip_content_comes_in_bounded_chunks(inflater: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ISA-L inflates when installed; the standard library's zlib is the fallback. Either gives
    exactly what gzip.decompress gives."""
    if inflater == "zlib":
        monkeypatch.setattr(source, "_inflater", zlib)
    else:
        assert source._inflater.__name__ == "isal.isal_zlib"  # a core dependency: installed in CI
    path = shared_trace("tracelens/h100_owlv2-large_zero-shot.json.gz")
    sizes = [len(c) for c in iter_content(path, 1_000_000)]
    assert max(sizes) <= 1_000_000 and len(sizes) > 40
    assert b"".join(iter_content(path, 1_000_000)) == gzip.decompress(path.read_bytes())


@pytest.mark.parametrize("piece", [None, 600])
def test_slices_left_open_are_counted_whole_and_in_pieces(piece: int | None, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch >= 2.4 writes "finished": false on slices still open when the profiler stopped;
    Python frames among them too, although their other args are never decoded. An instant's
    "finished" means nothing (an instant has no end) and is not counted."""
    b = KinetoBuilder()
    for i in range(30):
        b.op(f"op{i}", i * 10, 5)
    open_ops = [{"ph": "X", "cat": "cpu_op", "name": f"open_op{i}", "pid": 1, "tid": 1, "ts": 400 + i,
                 "dur": 1, "args": {"External id": 900 + i, "finished": False}} for i in range(3)]
    open_frames = [{"ph": "X", "cat": "python_function", "name": f"f.py(1): open{i}", "pid": 1, "tid": 1,
                    "ts": 500 + i, "dur": 1, "args": {"Python id": i, "finished": False}} for i in range(4)]
    closed_frame = {"ph": "X", "cat": "python_function", "name": "f.py(2): closed", "pid": 1, "tid": 1,
                    "ts": 600, "dur": 1, "args": {"Python id": 9, "finished": True}}
    instant = {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 700,
               "args": {"Bytes": 8, "finished": False}}
    b.events += [*open_ops, *open_frames, closed_frame, instant]
    path = b.write(tmp_path / "open.json")
    if piece is not None:
        _pieces_for_any_size(monkeypatch, piece)
        assert len(_pieces(path, piece)) > 3
    trace = read_kineto(path, workers=1)
    expected = sum(1 for e in b.events if e.get("ph") == "X" and e.get("args", {}).get("finished") is False)
    assert expected == 7
    assert trace.meta.unfinished_events == expected
    assert any("7 events were still open" in w for w in trace.meta.warnings)


def test_slices_left_open_are_counted_when_other_args_do_not_decode(tmp_path: Path) -> None:
    """When one op's args are of the wrong shape (an external id that is not a number), the ops'
    args are decoded one by one: the open ones among the others are counted all the same, the
    wrong ones are dropped with a warning, and an open slice whose args were dropped is not
    counted (its "finished" was never read)."""
    b = KinetoBuilder()
    for i in range(5):
        b.op(f"op{i}", i * 10, 5)
    b.events += [{"ph": "X", "cat": "cpu_op", "name": f"open{i}", "pid": 1, "tid": 1, "ts": 100 + i, "dur": 1,
                  "args": {"External id": external, "finished": False}}
                 for i, external in enumerate([7, 8, "not a number", 9])]
    trace = read_kineto(b.write(tmp_path / "open.json"), workers=1)
    expected = sum(1 for e in b.events if e.get("args", {}).get("finished") is False
                   and isinstance(e["args"].get("External id"), int))
    assert expected == 3
    assert trace.meta.unfinished_events == expected
    assert any("args ignored" in w for w in trace.meta.warnings)


def test_a_bare_event_array_is_refused_at_its_first_byte(tmp_path: Path) -> None:
    """A bare array (some writers drop the object around the events) goes to the whole read at
    once: the piece reader must not scan 64 MB for a traceEvents key it cannot find."""
    path = tmp_path / "bare.json"
    path.write_bytes(b"[" + b",".join(b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": %d, '
                                      b'"dur": 1}' % i for i in range(50)) + b"]")
    chunks_read = []

    def chunks() -> Iterator[bytes]:
        for c in iter_content(path, 64):
            chunks_read.append(c)
            yield c

    with pytest.raises(kineto_document.BadCut):
        list(kineto_pieces.PieceStream(chunks(), 64, path).pieces())
    assert len(chunks_read) == 1


class _CountingPattern:
    """Wraps the cut pattern and adds up how many bytes each search may scan."""

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        self.pattern, self.scanned = pattern, 0

    def search(self, buf: bytes | bytearray, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[bytes] | None:
        self.scanned += max(0, min(endpos, len(buf)) - pos)
        return self.pattern.search(buf, pos, endpos)

    def finditer(self, buf: bytes | bytearray, pos: int = 0, endpos: int = sys.maxsize) -> Iterator[re.Match[bytes]]:
        self.scanned += max(0, min(endpos, len(buf)) - pos)
        return self.pattern.finditer(buf, pos, endpos)


@pytest.mark.parametrize("gz", [False, True])
def test_a_long_run_between_events_is_searched_once(gz: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fuzz run found a long run of white space between two events re-searched from the
    # piece's start after every 256 KB read: quadratic (2 GB: about an hour). The search now
    # resumes at the last "}" it passed, so the bytes scanned stay within a small multiple of
    # the file, and the events are read as a whole parse reads them.
    body = (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1},'
            + b" " * (24 * 1024 * 1024)
            + b'{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": 1}]}')
    path = tmp_path / ("run.json.gz" if gz else "run.json")
    path.write_bytes(gzip.compress(body, 1) if gz else body)
    counting = _CountingPattern(kineto_pieces._BETWEEN_EVENTS)
    monkeypatch.setattr(kineto_pieces, "_BETWEEN_EVENTS", counting)
    monkeypatch.setattr(kineto_pieces, "piece_size", lambda n: kineto_pieces.PIECE_MIN_BYTES)
    trace = read_kineto(path)
    assert trace.slices.get_column("name").cast(str).to_list() == ["a", "b"]
    assert counting.scanned < 3 * len(body)


def test_no_gap_between_events_within_the_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracewhy.errors import TraceError

    monkeypatch.setattr(kineto_pieces, "_EVENT_MAX", 4 * 1024 * 1024)
    monkeypatch.setattr(kineto_pieces, "piece_size", lambda n: kineto_pieces.PIECE_MIN_BYTES)
    path = tmp_path / "long.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "' + b"x" * (12 * 1024 * 1024) + b'", "ts": 1}]}')
    with pytest.raises(TraceError, match="no gap between two events within 4 MB") as e:
        read_kineto(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("workers", [2, 3])
def test_helpers_read_the_pieces_of_a_plain_file_from_it(workers: int, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A piece of a plain file goes to a helper as where it lies in the file (a span), not as
    its bytes; the helper reads it there. Every span reads back the piece byte for byte, and
    the Trace is the serial one, with helpers building parts."""
    path = tmp_path / "plain.json"
    path.write_bytes(gzip.decompress(shared_trace("tracelens/h100_timesformer_video_bs1.json.gz").read_bytes()))
    lent = kineto_pieces.LentPieces(path, 300_000, taper=True)
    spans = []
    for view in lent.pieces():
        assert lent.span is not None and bytes(lent.span.read()) == bytes(view)
        spans.append(lent.span)
    assert len(spans) > 10 and all(kineto_pieces.Span.from_record(s.record()) == s for s in spans)
    serial = _read_whole(path)
    _pieces_for_any_size(monkeypatch, 300_000)
    sent: list[bool] = []
    send = kineto_parallel.Helper.send

    def recording(self: kineto_parallel.Helper, k: int, body: bytes, weight: int,
                  span: kineto_pieces.Span | None = None) -> bool:
        sent.append(span is not None)
        return send(self, k, body, weight, span)

    monkeypatch.setattr(kineto_parallel.Helper, "send", recording)
    monkeypatch.setattr(kineto_parallel, "_take_back", lambda *args: None)
    _assert_same(serial, read_kineto(path, workers=workers))
    assert sent and all(sent)


def test_a_span_of_a_file_that_changed_is_refused(tmp_path: Path) -> None:
    from tracewhy.errors import TraceError

    path = tmp_path / "plain.json"
    path.write_bytes(gzip.decompress(shared_trace("perfdigest/rtx4060laptop_torch_sample.json.gz").read_bytes()))
    lent = kineto_pieces.LentPieces(path, 2_000)
    next(iter(lent.pieces()))
    span = lent.span
    assert span is not None
    lent.close()
    with path.open("ab") as f:
        f.write(b" ")
    with pytest.raises(TraceError, match="changed while it was being read"):
        span.read()


def test_helpers_that_cannot_be_polled_take_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where select does not work on pipes (Windows), whether a helper is done cannot be asked
    without waiting: batches then take turns between this process and the helpers, as a fixed
    stride, and the Trace is the serial one."""
    path = shared_trace("tracelens/h100_timesformer_video_bs1.json.gz")
    serial = _read_whole(path)
    _pieces_for_any_size(monkeypatch, 300_000)

    def no_select(*args: object) -> object:
        raise OSError("select on a pipe")

    sent: list[int] = []
    send = kineto_parallel.Helper.send

    def recording(self: kineto_parallel.Helper, k: int, body: bytes, weight: int,
                  span: kineto_pieces.Span | None = None) -> bool:
        sent.append(k)
        return send(self, k, body, weight, span)

    monkeypatch.setattr(kineto_parallel.select, "select", no_select)
    monkeypatch.setattr(kineto_parallel.Helper, "send", recording)
    _assert_same(serial, read_kineto(path, workers=2))
    assert len(sent) > 10 and sent == list(range(1, 2 * len(sent), 2))  # every other batch, in turn
