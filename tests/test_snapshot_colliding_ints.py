"""Snapshot pickles whose dict or set keys are integers past int64 that all hash alike: CPython
hashes an int to ``n mod (2**61 - 1)``, so the multiples of that prime collide and the C
unpickler's dict of 100,000 of them never finishes. They are refused from the bytes, before
unpickling; a snapshot with a few big integers, or digits in its text, is still read."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from test_memory import build_snapshot
from tracewhy.cli import EXIT_BAD_INPUT
from tracewhy.errors import TraceError
from tracewhy.readers.memory.colliding_ints import MAX_BIG_INTS_SHARING_A_HASH
from tracewhy.readers.memory.snapshot import load_plain_pickle, read_memory_snapshot

PRIME = 2**61 - 1  # (CPython's modulus for hashing ints: sys.hash_info.modulus)


def _long1(value: int) -> bytes:
    payload = value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)
    return b"\x8a" + bytes([len(payload)]) + payload


def _long4(value: int) -> bytes:
    payload = value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)
    return b"\x8b" + len(payload).to_bytes(4, "little") + payload


def _colliding_dict(n: int, spell: Callable[[int], bytes] = _long1) -> bytes:
    """The pickle of ``{k * PRIME: None for k in range(5, 5 + n)}``, written opcode by opcode so
    that the test never builds the dict itself: PROTO 2, EMPTY_DICT, MARK, key/None pairs,
    SETITEMS, STOP. (k from 5: the first four multiples fit int64.)"""
    return b"\x80\x02}(" + b"".join(spell(k * PRIME) + b"N" for k in range(5, 5 + n)) + b"u."


def test_the_opcodes_written_are_a_dict_of_keys_that_all_hash_alike() -> None:
    # (independent of the reader: pickle itself reads a small one back)
    data = pickle.loads(_colliding_dict(3_000))
    assert len(data) == 3_000 and {hash(k) for k in data} == {0}
    assert all(k.bit_length() > 63 for k in data)


def test_100_000_colliding_keys_are_refused_fast_with_one_line(tmp_path: Path) -> None:
    # Before, the C unpickler spent minutes inserting them. Run in a child with a generous
    # timeout so that a regression fails instead of hanging the suite.
    path = tmp_path / "collide.pickle"
    path.write_bytes(_colliding_dict(100_000))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tracewhy", "memory", str(path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TRACEWHY_NO_CACHE": "1"})
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0]
    assert "100000 integers past 64 bits could share one hash" in lines[0]
    assert time.monotonic() - started < 120


@pytest.mark.parametrize("spell", [
    pytest.param(_long1, id="LONG1"),
    pytest.param(_long4, id="LONG4"),
    pytest.param(lambda v: f"I{v}\n".encode(), id="INT-text"),
    pytest.param(lambda v: f"L{v}L\n".encode(), id="LONG-text"),
    pytest.param(lambda v: f"I{v:#x}\n".encode(), id="INT-hex-text"),
])
def test_every_opcode_that_spells_an_int_past_int64_is_counted(tmp_path: Path, spell: Callable[[int], bytes]) -> None:
    path = tmp_path / "collide.pickle"
    path.write_bytes(_colliding_dict(MAX_BIG_INTS_SHARING_A_HASH + 1, spell))
    assert len(pickle.loads(path.read_bytes())) == MAX_BIG_INTS_SHARING_A_HASH + 1  # (a valid pickle)
    with pytest.raises(TraceError, match=r"1001 integers past 64 bits could share one hash"):
        load_plain_pickle(path)


def test_a_set_of_colliding_ints_is_refused_too(tmp_path: Path) -> None:
    # EMPTY_SET, MARK, the keys, ADDITEMS: a set is built by the same hashing as a dict
    keys = b"".join(_long1(k * PRIME) for k in range(5, 5 + 2_000))
    path = tmp_path / "set.pickle"
    path.write_bytes(b"\x80\x04\x8f(" + keys + b"\x90.")
    with pytest.raises(TraceError, match="2000 integers past 64 bits"):
        load_plain_pickle(path)


def test_up_to_the_bound_colliding_keys_are_read(tmp_path: Path) -> None:
    path = tmp_path / "collide.pickle"
    path.write_bytes(_colliding_dict(MAX_BIG_INTS_SHARING_A_HASH))
    assert len(load_plain_pickle(path)) == MAX_BIG_INTS_SHARING_A_HASH


def test_one_big_value_written_many_times_is_one_key_not_a_collision(tmp_path: Path) -> None:
    # pickle.dumps without memo writes the same value 5,000 times: one key, no collisions
    path = tmp_path / "same.pickle"
    path.write_bytes(b"\x80\x02](" + _long1(7 * PRIME) * 5_000 + b"e.")
    assert load_plain_pickle(path) == [7 * PRIME] * 5_000


def test_a_snapshot_with_a_few_big_ints_and_digits_in_its_text_is_read(tmp_path: Path) -> None:
    data = build_snapshot()
    # text that looks like protocol-0 INT and LONG opcodes, in frame names and settings
    data["segments"][0]["blocks"][0]["frames"][0]["name"] = f"step\nI{7 * PRIME}\nL{9 * PRIME}L\n"
    data["allocator_settings"] = {"note": f"I{11 * PRIME}\n", **{str(k * PRIME): k for k in range(5, 10)}}
    data["extra"] = {k * PRIME: k for k in range(5, 10)}  # a few real colliding big ints
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    snap = read_memory_snapshot(path)
    assert len(snap.segments) == len(data["segments"])
    assert any(f"I{7 * PRIME}" in name for stack in snap.stacks for _, _, name in stack)
    path.write_bytes(pickle.dumps(data, protocol=0))  # every int and string in text
    assert len(read_memory_snapshot(path).segments) == len(data["segments"])


def test_an_empty_file_is_not_a_pickle(tmp_path: Path) -> None:
    path = tmp_path / "empty.pickle"
    path.write_bytes(b"")
    with pytest.raises(TraceError, match="not a readable pickle"):
        load_plain_pickle(path)
