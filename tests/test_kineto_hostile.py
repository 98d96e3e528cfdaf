"""Hostile Kineto JSON: bytes a strict JSON decode refuses but real writers produce
are read, with one warning line per kind of repair; what cannot be read is one TraceError line.

Each case is a real trace with one thing changed, read four ways that must agree: plain and
gzip, whole (small files) and in pieces as large files are read (alone and with a helper
process). Tiny pieces and no one-pass read send a 22 KB trace down the large-file path.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import polars as pl
import pytest

import tracewhy
from conftest import shared_trace
from tracewhy.cli import EXIT_BAD_INPUT, main
from tracewhy.errors import TraceError
from tracewhy.model.trace import Trace
from tracewhy.readers.kineto import document as kineto_document
from tracewhy.readers.kineto import pieces as kineto_pieces
from tracewhy.readers.kineto import reader
from tracewhy.readers.kineto.reader import read_kineto

SMALL = "hta/a100_cuda_event_sync_small.json.gz"
KERNEL_ARGS = b'"blocks per SM": 1.185185,\n      "warps per SM": 4.740741,'
MODES = ["whole", "pieces", "helpers"]
#: One of each repair: invalid UTF-8, a bare inf, a lone surrogate escape.
EVERY_REPAIR = [(b'"aten::ones"', b'"aten::on\xffes"'), (KERNEL_ARGS, b'"blocks per SM": inf,'),
                (b'"aten::empty"', b'"aten::em\\ud800pty"')]


def _mutated(tmp_path: Path, name: str, edits: list[tuple[bytes, bytes]], *, gz: bool = False,
             prefix: bytes = b"") -> Path:
    """The small real trace with each ``old`` replaced (once) by ``new``, ``prefix`` before it."""
    data = gzip.decompress(shared_trace(SMALL).read_bytes())
    for old, new in edits:
        assert old in data, old
        data = data.replace(old, new, 1)
    path = tmp_path / (name + (".json.gz" if gz else ".json"))
    path.write_bytes(gzip.compress(prefix + data) if gz else prefix + data)
    return path


def _read(path: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> Trace:
    if mode == "whole":
        return read_kineto(path)
    with monkeypatch.context() as m:
        m.setattr(kineto_document, "ONE_PASS_MAX_BYTES", 0)
        m.setattr(kineto_pieces, "PIECE_BYTES", 3000)
        return read_kineto(path, workers=2 if mode == "helpers" else 1, batch_size=20)


def _read_all_ways(tmp_path: Path, name: str, edits: list[tuple[bytes, bytes]],
                   monkeypatch: pytest.MonkeyPatch, prefix: bytes = b"") -> Trace:
    """Read plain and gzip, whole and in pieces: the same Trace every time (warnings included);
    that Trace."""
    traces = [_read(_mutated(tmp_path, name, edits, gz=gz, prefix=prefix), mode, monkeypatch)
              for gz in (False, True) for mode in MODES]
    for t in traces:
        t.check()
        assert t.slices.equals(traces[0].slices) and t.kernel_attrs.equals(traces[0].kernel_attrs)
        assert t.devices.equals(traces[0].devices)
        assert t.meta.warnings == traces[0].meta.warnings
    return traces[0]


def _names(trace: Trace) -> set[str]:
    return set(trace.slices.get_column("name").cast(pl.String).to_list())


def test_invalid_utf8_in_strings_becomes_u_fffd_with_a_count(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Was an internal error (UnicodeDecodeError out of msgspec). Invalid bytes in two names and a Call stack.
    edits = [(b'"aten::ones"', b'"aten::on\xff\xfees"'), (b'"aten::empty"', b'"aten::em\xc3pty"'),
             (b'"External id": 513', b'"External id": 513, "Call stack": "x\xe9y"')]
    trace = _read_all_ways(tmp_path, "utf8", edits, monkeypatch)
    assert {"aten::on\ufffd\ufffdes", "aten::em\ufffdpty"} <= _names(trace)
    assert trace.meta.warnings == ("invalid UTF-8 inside strings: 4 byte sequences replaced with U+FFFD",)
    assert trace.slices.height == read_kineto(shared_trace(SMALL)).slices.height


def test_invalid_utf8_in_the_header_and_in_args_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes the event decode keeps raw (args, header fields) are repaired where they are read:
    a device's name, an op's call stack."""
    edits = [(b'"name": "NVIDIA A100-PG509-200"', b'"name": "NVIDIA \xffA100"'),
             (b'"External id": 513', b'"External id": 513, "Call stack": "x\xe9y"')]
    trace = _read_all_ways(tmp_path, "utf8head", edits, monkeypatch)
    assert trace.devices.get_column("name").to_list()[0] == "NVIDIA \ufffdA100"
    assert "x\ufffdy" in trace.op_attrs.get_column("call_stack").to_list()
    assert trace.meta.warnings == ("invalid UTF-8 inside strings: 2 byte sequences replaced with U+FFFD",)


def test_a_lone_surrogate_escape_becomes_u_fffd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Was "not valid JSON (... utf-16 surrogate pair ...)" for the whole file. A valid pair and an
    # escaped backslash before "ud800" (a literal text, not an escape) are left as they are.
    edits = [(b'"aten::ones"', b'"aten::on\\ud800es"'), (b'"aten::empty"', b'"aten::em\\udc00pty"'),
             (b'"aten::item"', b'"aten::\\ud83d\\ude00item\\\\ud800"')]
    trace = _read_all_ways(tmp_path, "lone", edits, monkeypatch)
    assert {"aten::on\ufffdes", "aten::em\ufffdpty", "aten::\U0001f600item\\ud800"} <= _names(trace)
    assert trace.meta.warnings == ("unpaired UTF-16 surrogate escapes (such as \\ud800): 2 replaced with U+FFFD",)


def test_bare_nan_and_infinity_are_read_as_non_finite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # PyTorch 1.8's Kineto wrote "memory bandwidth (GB/s)": inf (pytorch/kineto#105), Python's
    # json writes NaN/Infinity; the file was refused as not valid JSON. A kernel keeps its other
    # args; a string that reads like one ("a: nan]") is left alone; a NaN dur is taken as 0.
    edits = [(KERNEL_ARGS, b'"blocks per SM": inf, "warps per SM": -Infinity, "memory bandwidth (GB/s)": inf,'
                           b' "note": "a: nan]",'),
             (b'"est. achieved occupancy %": 7', b'"est. achieved occupancy %": NaN'),
             (b'"ts": 1707417525509905, "dur": 2245', b'"ts": 1707417525509905, "dur": NaN')]
    trace = _read_all_ways(tmp_path, "nan", edits, monkeypatch)
    attrs = trace.kernel_attrs.filter(pl.col("blocks_per_sm").is_infinite()).row(0, named=True)
    assert attrs["warps_per_sm"] == -math.inf and math.isnan(attrs["est_occupancy_pct"])
    assert attrs["registers_per_thread"] == 16 and attrs["grid_x"] == 128
    ones = trace.slices.filter(pl.col("name") == "aten::ones").row(0, named=True)
    assert ones["dur_ns"] == 0
    assert trace.meta.warnings == (
        "bare NaN/Infinity (not JSON; PyTorch 1.8-era Kineto wrote them): 5 values read as non-finite",
        "1 events: slice without dur taken as 0",
    )


@pytest.mark.parametrize(("bom", "blank"), [(True, 0), (True, 100_000), (False, 100), (False, 5_000_000)])
def test_a_bom_and_leading_white_space_of_any_length(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     bom: bool, blank: int) -> None:
    # A BOM was "not a recognized trace"; so was white space past 64 bytes in a plain file.
    prefix = (b"\xef\xbb\xbf" if bom else b"") + b" \n" * (blank // 2)
    trace = _read_all_ways(tmp_path, "lead", [], monkeypatch, prefix=prefix)
    assert trace.meta.warnings == ()
    assert trace.slices.equals(read_kineto(shared_trace(SMALL)).slices)
    for gz in (False, True):
        path = _mutated(tmp_path, "lead", [], gz=gz, prefix=prefix)
        assert tracewhy.load(path).slices.height == trace.slices.height


def test_pieces_are_repaired_one_by_one_never_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the large-file path only the piece that fails is repaired: the file is never read whole
    (which would hold all of it in memory)."""
    path = _mutated(tmp_path, "pieces", EVERY_REPAIR, prefix=b"\xef\xbb\xbf")

    def refuse(*args: object) -> bytes:
        raise AssertionError("read whole")

    monkeypatch.setattr(reader, "read_bytes", refuse)
    trace = _read(path, "pieces", monkeypatch)
    assert len(trace.meta.warnings) == 3


@pytest.mark.parametrize("where", ["args", "header", "top"])
@pytest.mark.parametrize("mode", MODES)
def test_nesting_deeper_than_the_decoder_goes_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str], where: str,
                                                                 mode: str) -> None:
    # Was RecursionError out of msgspec (exit 70). Kineto nests fewer than ten levels.
    deep = b"[" * 50_000 + b"]" * 50_000
    edits = {"args": [(b'"External id": 513', b'"External id": 513, "deep": ' + deep)],
             "header": [(b'"distributedInfo": {"rank": 0}', b'"distributedInfo": ' + deep)],
             "top": [(b'"schemaVersion": 1', b'"schemaVersion": 1, "x": ' + deep)]}[where]
    for gz in (False, True):
        path = _mutated(tmp_path, "deep", edits, gz=gz)
        with pytest.raises(TraceError, match="nested deeper than the decoder allows"):
            _read(path, mode, monkeypatch)
    assert main(["kernels", str(path)]) == EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "nested deeper" in lines[0]


def test_device_properties_beyond_int64_are_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # polars refused the whole devices table (an internal error in every command).
    edits = [(b'"id": 0, "name"', b'"id": 99999999999999999999999, "name"'),
             (b'"numSms": 108', b'"numSms": -99999999999999999999999')]
    trace = _read_all_ways(tmp_path, "bigdev", edits, monkeypatch)
    first = trace.devices.row(0, named=True)
    assert first["device"] is None and first["num_sms"] is None and first["name"] == "NVIDIA A100-PG509-200"
    assert trace.devices.height == 8 and trace.devices.get_column("num_sms").null_count() == 1
    assert trace.meta.warnings == (
        "deviceProperties: 2 values beyond their column's integers (such as an id past int64) read as unknown",)
    path = _mutated(tmp_path, "bigdev", edits)
    for command in ("kernels", "info", "ops", "gaps", "diagnose"):
        assert main([command, str(path)]) == 0, command
    capsys.readouterr()


def test_events_of_an_unknown_phase_are_warned_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # They were counted in event_counts only; nothing told the user part of the file was unread.
    edits: list[tuple[bytes, bytes]] = [(b'"ph": "i"', b'"ph": "Q"'), (b'"ph": "i"', b'"ph": "Q"'),
                                        (b'"ph": "f"', b'"ph": "B"')]
    trace = _read_all_ways(tmp_path, "phase", edits, monkeypatch)
    assert trace.meta.event_counts["ignored phase 'Q'"] == 2
    assert trace.meta.warnings == ("1 events: phase 'B' is not one this reader reads; ignored",
                                   "2 events: phase 'Q' is not one this reader reads; ignored")


def test_every_repair_at_once_in_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for gz in (False, True):
        path = _mutated(tmp_path, "all", EVERY_REPAIR, gz=gz, prefix=b"\xef\xbb\xbf\n")
        for command in ("kernels", "diagnose", "info", "ops", "steps"):
            assert main([command, str(path)]) == 0, command
        assert main(["export", str(path), "-o", str(tmp_path / "out.json")]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("mode", MODES)
def test_a_repaired_file_that_is_also_cut_off_keeps_its_complete_events(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       mode: str) -> None:
    # A crashed PyTorch 1.8 job: bare inf and invalid UTF-8 early, the file cut mid-event.
    whole = _mutated(tmp_path, "cut", EVERY_REPAIR)
    data = whole.read_bytes()
    path = tmp_path / "cut.json"
    path.write_bytes(data[: int(len(data) * 0.7)])
    trace = _read(path, mode, monkeypatch)
    trace.check()
    assert trace.meta.truncation is not None and trace.meta.truncation.events_recovered > 0
    assert "aten::on\ufffdes" in _names(trace)
    assert [w.split(":")[0] for w in trace.meta.warnings] == [
        "file ends mid-event", "invalid UTF-8 inside strings", "unpaired UTF-16 surrogate escapes (such as \\ud800)",
        "bare NaN/Infinity (not JSON; PyTorch 1.8-era Kineto wrote them)"]


def test_a_rank_past_int32_is_ignored_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real rank trace whose distributedInfo says rank 1e30: the rank is no rank, so it is left
    out with a warning, and ``ranks`` asks which rank the file is (one line, exit 3) instead of
    failing on a rank no integer column holds."""
    doc = json.loads(gzip.decompress(shared_trace("hta/tracediff_test_v100_rank1of2.json.gz").read_bytes()))
    doc["distributedInfo"]["rank"] = 10**30
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc))
    trace = read_kineto(path)
    assert trace.meta.rank is None and trace.meta.world_size == 2
    assert ("distributedInfo rank 10000000000000000000... is not a rank (an integer from 0 to 2147483647): ignored"
            in trace.meta.warnings)
    other = str(shared_trace("hta/tracediff_control_a100_rank3of8.json.gz"))
    assert main(["ranks", str(path), other]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot tell which rank this is" in err
