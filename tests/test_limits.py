"""The shared reader limits: int64 range, overflow-checked sums, bounded nesting, regular files only."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import numpy as np
import pytest

from tracewhy.errors import TraceError
from tracewhy.readers import limits


def test_int64_field_type_refuses_a_value_past_int64() -> None:
    decoder = msgspec.json.Decoder(list[limits.Int64])
    assert decoder.decode(b"[9223372036854775807, -9223372036854775808]") == [limits.INT64_MAX, limits.INT64_MIN]
    with pytest.raises(msgspec.ValidationError):
        decoder.decode(b"[9223372036854775808]")


def test_refuse_and_clamp_name_the_field() -> None:
    with pytest.raises(TraceError, match="t_ns 99999999999999999999 is outside"):
        limits.refuse_outside_int64("log.jsonl", "t_ns", 99999999999999999999)
    warnings: list[str] = []
    assert limits.clamp_to_int64(-(1 << 70), "bytes", warnings) == limits.INT64_MIN
    assert limits.clamp_to_int64(5, "bytes", warnings) == 5
    assert len(warnings) == 1 and "bytes" in warnings[0]


def test_checked_arithmetic_raises_where_numpy_wraps() -> None:
    big = np.array([1 << 62, 1 << 62], dtype=np.int64)
    assert np.cumsum(big)[-1] < 0  # what numpy does: it wraps
    with pytest.raises(limits.Int64Overflow):
        limits.checked_cumsum(big)
    with pytest.raises(limits.Int64Overflow):
        limits.checked_sum(big)
    with pytest.raises(limits.Int64Overflow):
        limits.checked_multiply(np.array([1 << 60], dtype=np.int64), 1000)
    # Large values that cancel do not overflow: the check is exact, not a bound.
    cancelling = np.array([1 << 62, -(1 << 62), 1 << 62, 1], dtype=np.int64)
    assert limits.checked_cumsum(cancelling).tolist()[-1] == (1 << 62) + 1


def test_deep_nesting_and_bad_utf8_are_one_line_errors() -> None:
    decoder: msgspec.json.Decoder[object] = msgspec.json.Decoder()
    with pytest.raises(TraceError, match="nested too deeply"):
        limits.decode_json_bounded(decoder, b"[" * 100_000 + b"]" * 100_000, "x.json")
    with pytest.raises(TraceError, match="not UTF-8"):
        limits.decode_json_bounded(decoder, b'["\xff"]', "x.json")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and /dev/zero")
def test_open_regular_refuses_a_fifo_without_blocking_and_a_device(tmp_path: Path) -> None:
    fifo = tmp_path / "rank0.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(TraceError, match="not a regular file"):
        limits.read_regular_bytes(fifo, 1 << 20)
    link = tmp_path / "rank1.jsonl"
    link.symlink_to("/dev/zero")  # size 0 to stat, endless to read
    with pytest.raises(TraceError, match="not a regular file"):
        limits.read_regular_bytes(link, 1 << 20)


def test_read_regular_bytes_bounds_the_size(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_bytes(b"x" * 100)
    assert limits.read_regular_bytes(f, 100) == b"x" * 100
    with pytest.raises(TraceError, match="over the 99"):
        limits.read_regular_bytes(f, 99)
    assert limits.object_budget(100, 10) == 11
    with pytest.raises(TraceError, match="more than a file of this size"):
        limits.refuse_over_budget(f, 12, 11, "records")


def test_bad_utf8_is_told_apart_under_both_msgspec_behaviours() -> None:
    """msgspec before 0.23 let Python's UnicodeDecodeError through for bytes that are not UTF-8;
    0.23 raises its own DecodeError saying so. Both are the same failure to the readers (they
    repair the bytes and count it); a truncated document or a wrongly typed value is not."""
    bad_utf8 = limits.bad_utf8
    try:
        msgspec.json.decode(b'{"name": "\xff\xfe"}')
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        assert bad_utf8(e)
    else:
        raise AssertionError("invalid UTF-8 decoded")
    assert bad_utf8(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"))
    assert bad_utf8(msgspec.DecodeError("Invalid UTF-8 encoded string"))
    assert not bad_utf8(msgspec.DecodeError("Input data was truncated"))
    assert not bad_utf8(msgspec.ValidationError("Expected `str`, got `int`"))
