"""The entries of one TORCH_TRACE log file, as ``(envelope, payload)`` pairs: what every reader of
these logs (compile ids, breaks, metrics, Inductor output code) iterates over.

torch 2.2+ (``torch/_logging/_internal.py: trace_structured``; tlparse reads the same) writes
one entry as a glog-prefixed line ``V1128 20:02:23.478000 30360 torch/_dynamo/utils.py:2350]
{...}`` whose JSON object is the envelope (the entry's kind as its one other key, plus
``frame_id``/``frame_compile_id``/``attempt``, ``rank`` once distributed is up, and
``has_payload``: the md5 of the payload); the payload follows as lines that each start with a
tab. The file is streamed (gzip inflated with the size bound every reader has), lines are
bounded, and nothing in it is trusted: a line that is not an entry, an envelope that is not JSON,
a payload whose md5 differs, a line cut at the bound are counted, not fatal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from tracewhy.readers.source import iter_content, refuse_special

#: A longer line is cut to this many bytes (and counted): the longest envelope in the logs
#: here is a ``compilation_metrics`` of about 60 KB (it carries the configs as JSON strings);
#: payload lines are short (JSON is written with ``indent=0``, code one line per line).
MAX_LINE_BYTES: Final = 4 * 1024**2
#: A payload is kept up to this many bytes; the rest of it is dropped (and counted). Inductor's
#: output code for a large model is a few MB; FX graphs of a big model tens of MB at most.
MAX_PAYLOAD_BYTES: Final = 64 * 1024**2
#: The glog prefix ends within this many bytes: level, date, time, thread id, the emitting
#: file:line (a path inside torch), then "] ".
MAX_PREFIX_BYTES: Final = 512
_GLOG_LEVELS: Final = b"VIWEDC"
_ENVELOPE_START: Final = b"] {"

_envelope_decoder: msgspec.json.Decoder[dict[str, Any]] = msgspec.json.Decoder(dict[str, Any])


@dataclass
class LineCounts:
    """What iterating a log met, for the warnings its reader gives."""

    lines: int = 0
    entries: int = 0
    #: Lines that are neither an entry nor a payload line (another logger's output, a cut line).
    not_entries: int = 0
    #: Glog-prefixed lines whose envelope is not a JSON object.
    bad_json: int = 0
    #: Lines cut at ``MAX_LINE_BYTES``, and payloads cut at ``MAX_PAYLOAD_BYTES``.
    cut: int = 0
    #: Payloads whose md5 is not the envelope's ``has_payload``: cut or edited after writing.
    payload_mismatch: int = 0

    def warnings(self) -> list[str]:
        """One warning per kind of problem met, with its count."""
        out = []
        if self.bad_json:
            out.append(f"{self.bad_json} TORCH_TRACE line{_s(self.bad_json)} with an envelope that is not a JSON "
                       "object, skipped")
        if self.not_entries:
            out.append(f"{self.not_entries} line{_s(self.not_entries)} that {_are(self.not_entries)} not TORCH_TRACE "
                       "entries (no glog prefix and JSON envelope), skipped")
        if self.cut:
            out.append(f"{self.cut} line{_s(self.cut)} or payload{_s(self.cut)} longer than the reader's bound, cut")
        if self.payload_mismatch:
            out.append(f"{self.payload_mismatch} payload{_s(self.payload_mismatch)} whose md5 differs from the "
                       "envelope's has_payload (cut or edited after torch wrote it)")
        return out


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _are(n: int) -> str:
    return "is" if n == 1 else "are"


def iter_torch_trace(path: Path, counts: LineCounts | None = None) -> Iterator[tuple[dict[str, Any], str]]:
    """Every entry of the TORCH_TRACE log ``path`` (plain or gzip): its envelope (the JSON object
    after the glog prefix) and its payload (the tab-indented lines after it, tabs removed, joined
    with newlines; "" when it has none). ``counts``, when given, is filled as the file is read.
    Raises a TraceError only for a file that cannot be read (missing, a pipe or device, a gzip
    bomb); bad content is counted."""
    counts = counts if counts is not None else LineCounts()
    refuse_special(path)
    envelope: dict[str, Any] | None = None
    payload: list[bytes] = []
    payload_bytes = 0
    payload_cut = False
    for line, cut in _bounded_lines(iter_content(path)):
        counts.lines += 1
        counts.cut += cut
        if line.startswith(b"\t"):
            if envelope is None:
                counts.not_entries += 1
            elif payload_bytes + len(line) <= MAX_PAYLOAD_BYTES:
                payload.append(line[1:])
                payload_bytes += len(line)
            else:
                payload_cut = True
            continue
        if envelope is not None:
            yield _finished(envelope, payload, payload_cut, counts)
            envelope, payload, payload_bytes, payload_cut = None, [], 0, False
        if not line.strip():
            continue
        envelope = _envelope(line, counts)
    if envelope is not None:
        yield _finished(envelope, payload, payload_cut, counts)


def _finished(envelope: dict[str, Any], payload: list[bytes], cut: bool,
              counts: LineCounts) -> tuple[dict[str, Any], str]:
    counts.entries += 1
    counts.cut += cut
    data = b"\n".join(payload)
    expected = envelope.get("has_payload")
    if isinstance(expected, str) and hashlib.md5(data, usedforsecurity=False).hexdigest() != expected:
        counts.payload_mismatch += 1
    return envelope, data.decode("utf-8", errors="replace")


def _envelope(line: bytes, counts: LineCounts) -> dict[str, Any] | None:
    """The JSON object after the glog prefix, or None (counted) for a line that is not an entry."""
    at = line.find(_ENVELOPE_START, 0, MAX_PREFIX_BYTES)
    if not line[:1] or line[:1] not in _GLOG_LEVELS or at == -1:
        counts.not_entries += 1
        return None
    try:
        return _envelope_decoder.decode(line[at + 2:])
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        counts.bad_json += 1
        return None


def _bounded_lines(chunks: Iterator[bytes]) -> Iterator[tuple[bytes, bool]]:
    """The lines of a stream of chunks (without their newline), each cut to ``MAX_LINE_BYTES``,
    with whether it was cut; a cut line's rest is skipped without being kept."""
    pending = bytearray()
    cut = False
    for chunk in chunks:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end == -1 else chunk[start:end]
            room = MAX_LINE_BYTES - len(pending)
            if len(piece) > room:
                cut = True
            pending += piece[:max(room, 0)]
            if end == -1:
                break
            yield bytes(pending.rstrip(b"\r")), cut
            pending.clear()
            cut = False
            start = end + 1
    if pending or cut:
        yield bytes(pending.rstrip(b"\r")), cut
