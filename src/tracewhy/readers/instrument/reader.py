"""Instrument logs: JSON Lines of ``header``, ``mark`` and ``block`` records, one file per rank.

The format is ``tracewhy.instrument``'s (docs/inputs/instrument-logs.md), and any other code may write
it: fields beyond the documented ones are ignored, a missing header only costs what it would
have said (the clock, the sync mode), and the rank comes from the records, the header or the
file name (``...rank<R>.jsonl``), in that order. Lines that are not records (cut, not JSON,
wrong types, integers outside int64 or negative times, invalid UTF-8, nesting too deep, unknown
``type``) are skipped with one warning per file that counts them and quotes the first; a file
with no record at all is refused. Files found in a directory are checked as files named directly
(regular files only, their size read after opening: a FIFO or /dev/zero named ``*.jsonl`` is
refused, not read).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import msgspec
import polars as pl

from tracewhy.errors import TraceError
from tracewhy.model.instrument import LOG_BLOCKS_SCHEMA, MARKS_SCHEMA, InstrumentLog, LogBlockCol, MarkCol, RankHeader
from tracewhy.readers.instrument.sniff import LOG_SUFFIX
from tracewhy.readers.limits import Int64, NonNegativeInt64, bad_utf8, read_regular_bytes, refuse_outside_int64

_RANK_IN_NAME: Final = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
#: Larger files are refused: a log is ~150 bytes a record, so this is ~7M records.
MAX_LOG_BYTES: Final = 1 << 30
_BOM: Final = b"\xef\xbb\xbf"


class _HeaderRecord(msgspec.Struct, tag="header", tag_field="type"):
    rank: NonNegativeInt64 | None = None
    world_size: NonNegativeInt64 | None = None
    clock: str | None = None
    sync: bool = False
    cuda_events: bool | None = None
    device: str | None = None
    versions: dict[str, str] = {}


# Times and durations are non-negative int64 (a negative one, or one past int64, skips its line).
class _MarkRecord(msgspec.Struct, tag="mark", tag_field="type"):
    chunk: Int64
    name: str
    t_ns: NonNegativeInt64
    rank: NonNegativeInt64 | None = None
    gpu_t_ns: NonNegativeInt64 | None = None


class _BlockRecord(msgspec.Struct, tag="block", tag_field="type"):
    name: str
    host_ns: NonNegativeInt64
    rank: NonNegativeInt64 | None = None
    step: Int64 | None = None
    chunk: Int64 | None = None
    start_ns: NonNegativeInt64 | None = None
    gpu_ns: NonNegativeInt64 | None = None
    depth: NonNegativeInt64 = 0
    sync: bool = False


_DECODER: Final = msgspec.json.Decoder(_HeaderRecord | _MarkRecord | _BlockRecord)


def read_instrument_logs(paths: list[Path]) -> InstrumentLog:
    """Every rank log named (files, or directories of ``*.jsonl``) as one InstrumentLog."""
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(p.glob(f"*{LOG_SUFFIX}"))
            if not found:
                raise TraceError(p, f"no {LOG_SUFFIX} instrument logs in this directory")
            files.extend(found)
        else:
            files.append(p)
    headers: list[RankHeader] = []
    blocks: list[dict[str, object]] = []
    marks: list[dict[str, object]] = []
    warnings: list[str] = []
    seen: dict[int, str] = {}
    for f in files:
        header, b, m, w = _read_one(f)
        if header.rank in seen:
            raise TraceError(f, f"rank {header.rank} is also in {seen[header.rank]}: give each rank's log once")
        seen[header.rank] = str(f)
        headers.append(header)
        blocks.extend(b)
        marks.extend(m)
        warnings.extend(w)
    return InstrumentLog(
        source=", ".join(str(p) for p in paths),
        headers=tuple(sorted(headers, key=lambda h: h.rank)),
        blocks=pl.DataFrame(blocks, schema=LOG_BLOCKS_SCHEMA),
        marks=pl.DataFrame(marks, schema=MARKS_SCHEMA),
        warnings=tuple(warnings),
    )


def _read_one(path: Path) -> tuple[RankHeader, list[dict[str, object]], list[dict[str, object]], list[str]]:
    try:
        data = read_regular_bytes(path, MAX_LOG_BYTES)
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from e
    if data.startswith(_BOM):  # (Windows editors and PowerShell's Out-File write one)
        data = data[len(_BOM):]
    header: _HeaderRecord | None = None
    records: list[_MarkRecord | _BlockRecord] = []
    bad = 0
    first_bad = ""
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = _DECODER.decode(line)
        except msgspec.DecodeError as e:
            bad += 1
            first_bad = first_bad or f"line {number}: {'not UTF-8' if bad_utf8(e) else _reason(e)}"
            continue
        except (UnicodeDecodeError, RecursionError) as e:  # msgspec raises these, not a DecodeError
            bad += 1
            what = "not UTF-8" if isinstance(e, UnicodeDecodeError) else "nested too deeply"
            first_bad = first_bad or f"line {number}: {what}"
            continue
        if isinstance(rec, _HeaderRecord):
            if header is None and not records:
                header = rec
                continue
            bad += 1
            first_bad = first_bad or f"line {number}: a second header, or one after the records"
            continue
        records.append(rec)
    if not records:
        problem = "no block or mark records" + (f" ({bad} lines not understood; {first_bad})" if bad else "")
        raise TraceError(path, f"not an instrument log: {problem}")
    rank = _rank(path, header, records)
    warnings = []
    if bad:
        warnings.append(f"{path}: {bad} lines are not instrument records and were skipped ({first_bad})")
    if header is None:
        warnings.append(f"{path}: no header line: the clock and the sync mode are not known (read as not synchronized)")
    others = {r.rank for r in records if r.rank is not None and r.rank != rank}
    if others:
        raise TraceError(path, f"records of ranks {sorted(others | {rank})} in one file: write one log per rank")
    # Every duration is non-negative, so any sum an analysis takes of them is at most this one.
    for field in ("host_ns", "gpu_ns"):
        total = sum(getattr(r, field) or 0 for r in records if isinstance(r, _BlockRecord))
        refuse_outside_int64(path, f"the blocks' {field} add up to", total)
    h = header or _HeaderRecord()
    rank_header = RankHeader(rank=rank, file=str(path), present=header is not None, world_size=h.world_size,
                             clock=h.clock, sync=h.sync, cuda_events=h.cuda_events, device=h.device,
                             versions=dict(h.versions))
    blocks: list[dict[str, object]] = [
        {LogBlockCol.RANK: rank, LogBlockCol.STEP: r.step, LogBlockCol.CHUNK: r.chunk, LogBlockCol.NAME: r.name,
         LogBlockCol.START: r.start_ns, LogBlockCol.HOST: r.host_ns, LogBlockCol.GPU: r.gpu_ns,
         LogBlockCol.DEPTH: r.depth, LogBlockCol.SYNC: r.sync or h.sync}
        for r in records if isinstance(r, _BlockRecord)
    ]
    marks: list[dict[str, object]] = [
        {MarkCol.RANK: rank, MarkCol.CHUNK: r.chunk, MarkCol.NAME: r.name, MarkCol.T: r.t_ns, MarkCol.GPU_T: r.gpu_t_ns}
        for r in records if isinstance(r, _MarkRecord)
    ]
    return rank_header, blocks, marks, warnings


def _rank(path: Path, header: _HeaderRecord | None, records: list[_MarkRecord | _BlockRecord]) -> int:
    for r in records:
        if r.rank is not None:
            return r.rank
    if header is not None and header.rank is not None:
        return header.rank
    m = _RANK_IN_NAME.search(path.name)
    return refuse_outside_int64(path, "the rank in the file name", int(m.group(1))) if m else 0


def _reason(e: msgspec.DecodeError) -> str:
    text = str(e)
    where = text.rpartition(" - at ")[2] if " - at " in text else "a field"
    if "Expected `int` >= 0" in text:
        return f"a negative time, duration or count at {where}"
    if "Expected `int` <=" in text or "Expected `int` >=" in text:
        return f"an integer outside the 64-bit integers at {where}"
    return text if len(text) <= 120 else text[:117] + "..."
