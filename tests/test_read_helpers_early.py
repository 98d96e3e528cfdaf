"""A large Kineto file's decoding helper is started by the command line before its own imports,
and the reader takes that helper instead of starting one: the Trace is the one the serial read
gives. Files that are not large JSON traces start none, and a helper no read takes is stopped."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal
from tests.conftest import shared_trace

from tracewhy import read_helpers
from tracewhy.readers.kineto import document as kineto_document
from tracewhy.readers.kineto import parallel as kineto_parallel
from tracewhy.readers.kineto import pieces as kineto_pieces
from tracewhy.readers.kineto.reader import read_kineto

TRACE = "tracelens/h100_timesformer_video_bs1.json.gz"


@pytest.fixture
def small_threshold(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any file of 1 kB or more counts as large; no helper is left over from another test."""
    monkeypatch.setattr(read_helpers, "PARALLEL_MIN_BYTES", 1024)
    monkeypatch.delenv(read_helpers.ENV_WORKERS, raising=False)
    monkeypatch.delenv(read_helpers.ENV_IN_HELPER, raising=False)
    read_helpers._stop_early()
    yield
    read_helpers._stop_early()


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("early") / "trace.json"
    path.write_bytes(gzip.decompress(shared_trace(TRACE).read_bytes()))
    return path


def test_the_reader_takes_the_helper_started_early(small_threshold: None, plain_trace: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    serial = read_kineto(plain_trace, workers=1)
    read_helpers.start_early(["kernels", str(plain_trace), "--json"])
    assert len(read_helpers._early) == 1
    early = read_helpers._early[0]
    taken: list[int] = []
    spawn = kineto_parallel.spawn

    def recording() -> object:
        proc = spawn()
        taken.append(proc.pid)
        return proc

    monkeypatch.setattr(kineto_parallel, "spawn", recording)
    # Pieces small enough that the helper gets batches, and none taken back before it starts.
    monkeypatch.setattr(kineto_document, "ONE_PASS_MAX_BYTES", 0)
    monkeypatch.setattr(kineto_pieces, "PIECE_BYTES", 300_000)
    monkeypatch.setattr(kineto_parallel, "_take_back", lambda *args: None)
    parallel = read_kineto(plain_trace, workers=2)
    assert taken == [early.pid] and not read_helpers._early
    for name in ("slices", "memory", "flows", "threads", "kernel_attrs", "copy_attrs", "op_attrs", "devices"):
        assert_frame_equal(getattr(serial, name), getattr(parallel, name), check_exact=True)
    assert serial.meta == parallel.meta
    assert early.poll() is not None  # the read ended it as it ends the helpers it starts


def test_gzip_json_is_recognised_by_its_trailer(small_threshold: None) -> None:
    path = shared_trace(TRACE)
    assert read_helpers._json_content_size(str(path)) == len(gzip.decompress(path.read_bytes()))


@pytest.mark.parametrize("content", [b"SQLite format 3\x00" + bytes(2000), b"[" + b" " * 2000 + b"]"])
def test_no_helper_for_a_file_that_is_not_a_json_object(content: bytes, small_threshold: None, tmp_path: Path) -> None:
    """An Nsight Systems export, a bare event array (read whole, never in pieces), a gzip of one."""
    plain, packed = tmp_path / "x", tmp_path / "x.gz"
    plain.write_bytes(content)
    packed.write_bytes(gzip.compress(content))
    read_helpers.start_early([str(plain), str(packed)])
    assert not read_helpers._early


def test_no_helper_for_small_files_options_or_missing_paths(plain_trace: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    read_helpers._stop_early()
    monkeypatch.delenv(read_helpers.ENV_WORKERS, raising=False)
    read_helpers.start_early([str(plain_trace)])  # a few MB: under the default threshold
    monkeypatch.setattr(read_helpers, "PARALLEL_MIN_BYTES", 1024)
    read_helpers.start_early(["--json", str(tmp_path), str(tmp_path / "missing.json"), "-o"])
    monkeypatch.setenv(read_helpers.ENV_WORKERS, "1")
    read_helpers.start_early([str(plain_trace)])
    assert not read_helpers._early


def test_a_helper_no_read_takes_is_stopped(small_threshold: None, plain_trace: Path) -> None:
    read_helpers.start_early([str(plain_trace)])
    (early,) = read_helpers._early
    read_helpers._stop_early()
    assert early.poll() is not None and not read_helpers._early


def test_no_helper_for_a_read_the_parse_cache_will_serve(small_threshold: None, plain_trace: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the cache holds an entry whose stored identity the file still has, the read will not
    decode: no helper is started for it, unless the command line or the environment turns the
    cache off. Before the entry exists, and after the file changes, one is."""
    from tracewhy import cache_place
    from tracewhy.model import cache
    from tracewhy.readers import read_trace

    monkeypatch.setenv(cache_place.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv(cache_place.ENV_DISABLE, raising=False)
    monkeypatch.setattr(cache, "RACY_WINDOW_NS", -1)  # the file was written a moment ago
    monkeypatch.setattr(cache_place, "RACY_WINDOW_NS", -1)
    trace = tmp_path / "trace.json"
    trace.write_bytes(plain_trace.read_bytes())

    def starts(args: list[str]) -> bool:
        read_helpers._stop_early()
        read_helpers.start_early(args)
        return bool(read_helpers._early)

    assert starts(["diagnose", str(trace)])  # no entry yet
    with monkeypatch.context() as m:
        m.setenv(read_helpers.ENV_WORKERS, "1")  # the read itself on one core: no helper to hand over
        read_trace(trace)
    assert list((tmp_path / "cache").iterdir())
    assert not starts(["diagnose", str(trace)])
    assert starts(["diagnose", "--no-cache", str(trace)])
    monkeypatch.setenv(cache_place.ENV_DISABLE, "1")
    assert starts(["diagnose", str(trace)])
    monkeypatch.delenv(cache_place.ENV_DISABLE)
    with trace.open("ab") as f:  # a write changes the size and the ctime: the entry no longer vouches
        f.write(b"\n")
    assert starts(["diagnose", str(trace)])
    read_helpers._stop_early()
