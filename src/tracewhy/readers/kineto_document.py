"""The document level of a Kineto JSON file: header, event list, and recovery of cut-off files.

Small files are decoded in one typed pass. Larger ones are cut into pieces between events
without parsing them, and each piece is decoded on its own, so that only one piece's events
exist as Python objects at a time: peak memory is the file's bytes, a piece, and the columns.
(Events of 8 MB are about 20 MB as objects; a 56 MB file read whole held 250 MB, in pieces
about 140 MB, and reads no slower.) A file the cutter cannot handle, and one whose pieces do
not decode, is split into raw event spans by a parse instead (the careful path).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from tracewhy.errors import TraceError
from tracewhy.model.trace import Truncation
from tracewhy.readers.kineto_events import (
    EVENT_DECODER,
    EVENTS_DECODER,
    RAW_DICT_DECODER,
    RAW_DOCUMENT_DECODER,
    RAW_LIST_DECODER,
    TYPED_DOCUMENT_DECODER,
    Event,
)

#: Files up to this size are decoded in one typed pass (their events as objects fit easily).
ONE_PASS_MAX_BYTES = 8 * 1024 * 1024
_WS = b" \t\r\n"


#: Larger files are cut into pieces of about this many bytes, each decoded on its own.
CHUNK_BYTES = 8 * 1024 * 1024
#: The end of one event and the start of the next, at any spacing. It can also match inside a
#: string or a nested object; a piece cut there is not valid JSON, and decoding it says so.
_BETWEEN_EVENTS = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
#: How far from the end of the file the events array may close (the keys Kineto writes after it).
_TAIL_MAX = 1024 * 1024


class BadCut(Exception):
    """A piece of a large file did not decode as a list of events: the cut fell inside one."""


Unit = tuple[Callable[[], bytes], int]


@dataclass
class Document:
    """A decoded file: header fields kept raw, and events either decoded, as raw spans, or as
    byte spans of the buffer (pieces of a large file, cut between events without parsing)."""

    header: dict[str, msgspec.Raw]
    events: list[Event] | None
    raw_events: list[msgspec.Raw] | None
    truncation: Truncation | None
    buf: bytes | bytearray | None = None
    pieces: list[tuple[int, int]] | None = None

    @property
    def event_count(self) -> int:
        """Events, or for a file read in pieces its bytes: the unit of progress."""
        if self.pieces is not None:
            return sum(b - a for a, b in self.pieces)
        return len(self.events) if self.events is not None else len(self.raw_events or ())

    def batches(self, size: int, problems: dict[str, int]) -> Iterator[list[Event]]:
        if self.events is not None:
            yield self.events
            return
        for make, _ in self.units(size):
            yield decode_body(make(), problems)

    def units(self, size: int) -> list[Unit]:
        """The work, in file order: for each batch, a function making its bytes (a JSON array of
        events) and its weight in ``event_count`` units."""
        if self.pieces is not None:
            view = memoryview(self.buf or b"")
            return [(functools.partial(_piece, view, a, b), b - a) for a, b in self.pieces]
        raws = self.raw_events or []
        return [(functools.partial(_joined, raws[start : start + size]), len(raws[start : start + size]))
                for start in range(0, len(raws), size)]


def _piece(view: memoryview, a: int, b: int) -> bytes:
    return b"".join((b"[", view[a:b], b"]"))


def _joined(raws: list[msgspec.Raw]) -> bytes:
    return b"[" + b",".join(raws) + b"]"


def decode_body(body: bytes, problems: dict[str, int]) -> list[Event]:
    """The events of a JSON array; a wrongly typed event is skipped and counted in ``problems``.
    Raises BadCut if the bytes are not a JSON array at all."""
    try:
        events: list[Event] = EVENTS_DECODER.decode(body)
        return events
    except msgspec.ValidationError:
        return decode_raw_events(RAW_LIST_DECODER.decode(body), problems)
    except msgspec.DecodeError as e:
        raise BadCut(str(e)) from None


def cut_document(buf: bytes | bytearray, piece_bytes: int = CHUNK_BYTES) -> Document | None:
    """Header and event pieces of a large ``{"traceEvents": [...]}`` file, found without parsing
    the events (parsing once to find them would cost as much as decoding them); None when the
    file is not of that shape, which the careful path then explains.

    The header is checked by decoding it with an empty event list in place of the real one, the
    pieces by decoding each: a piece is valid JSON only if its cuts lie between two events of the
    array, so a file whose pieces all decode is read exactly as a whole parse would read it.
    """
    key = _EVENTS_KEY.search(buf)
    if key is None:
        return None
    start = key.end()
    head = bytes(buf[: key.start()]) + b'"traceEvents": []'
    end = len(buf)
    while True:
        # The array's closing bracket: the last "]" after which the rest completes the header
        # and before which the last events decode as events (a list that closes after them,
        # such as deviceProperties in newer files, fails that).
        close = buf.rfind(b"]", start, end)
        if close < 0 or len(buf) - close > _TAIL_MAX:
            return None
        end = close
        try:
            header = RAW_DOCUMENT_DECODER.decode(head + bytes(buf[close + 1 :]))
        except msgspec.DecodeError:  # (ValidationError too)
            continue
        if header.traceEvents == [] and _ends_with_events(buf, start, close):
            break
    pieces: list[tuple[int, int]] = []
    a = start
    while True:
        m = _BETWEEN_EVENTS.search(buf, a + piece_bytes, close) if a + piece_bytes < close else None
        if m is None:
            pieces.append((a, close))
            break
        pieces.append((a, m.start() + 1))
        a = m.end() - 1
    return Document(header.as_dict(), None, None, None, buf=buf, pieces=pieces)


def _ends_with_events(buf: bytes | bytearray, start: int, close: int) -> bool:
    """Whether the bytes just before ``close`` are the last events of an array opened at ``start``.

    Decoded from the last place that looks like a gap between events; one inside a string
    (an event named "}, {") does not decode, so earlier ones are tried.
    """
    lo = max(start, close - _TAIL_MAX)
    froms = [m.end() - 1 for m in _BETWEEN_EVENTS.finditer(buf, lo, close)][::-1][:64]
    if lo == start:
        froms.append(start)
    view = memoryview(buf)
    for frm in froms:
        try:
            events = EVENTS_DECODER.decode(b"".join((b"[", view[frm:close], b"]")))
        except msgspec.DecodeError:
            continue
        return all(e.ph for e in events)
    return False


def split_document(path: Path, buf: bytes | bytearray, *, one_pass: bool = True, cut: bool = True) -> Document:
    """The header and the events of a file: decoded in one pass when it is small enough and
    ``one_pass`` allows; else, if ``cut``, as pieces cut between events (``cut_document``);
    else as raw event spans to decode batch by batch."""
    first = first_byte(buf)
    if first not in (b"{", b"["):
        raise TraceError(path, "not JSON: expected a Kineto trace object or event array")
    one_pass = one_pass and len(buf) <= ONE_PASS_MAX_BYTES
    if not one_pass and cut and first == b"{":
        doc = cut_document(buf, CHUNK_BYTES)
        if doc is not None:
            return doc
    try:
        if first == b"[":
            return _bare_array(path, buf, one_pass)
        if one_pass:
            typed = TYPED_DOCUMENT_DECODER.decode(buf)
            if isinstance(typed.traceEvents, list):
                return Document(typed.as_dict(), typed.traceEvents, None, None)
            _no_events(path, buf)
        raw = RAW_DOCUMENT_DECODER.decode(buf)
        if not isinstance(raw.traceEvents, list):
            _no_events(path, buf)
        assert isinstance(raw.traceEvents, list)
        return Document(raw.as_dict(), None, raw.traceEvents, None)
    except msgspec.ValidationError as e:
        if str(e).endswith("`$.traceEvents`"):
            raise TraceError(path, "traceEvents is not a list") from None
        # A wrongly typed event somewhere: take the careful path, event by event.
        if first == b"[":
            return Document({}, None, RAW_LIST_DECODER.decode(buf), None)
        careful = RAW_DOCUMENT_DECODER.decode(buf)
        if not isinstance(careful.traceEvents, list):
            raise TraceError(path, "traceEvents is not a list") from None
        return Document(careful.as_dict(), None, careful.traceEvents, None)
    except msgspec.DecodeError as e:
        if "truncated" not in str(e):
            raise TraceError(path, f"not valid JSON ({e})") from None
        return _recover_truncated(path, buf, first == b"[")


def _bare_array(path: Path, buf: bytes | bytearray, one_pass: bool) -> Document:
    raws = RAW_LIST_DECODER.decode(buf)
    if raws and first_byte(bytes(raws[0])[:64]) == b"[":
        raise TraceError(
            path, "a list of rows, not events: this looks like a memory-timeline export, not a profiler trace"
        )
    if one_pass:
        try:
            return Document({}, EVENTS_DECODER.decode(buf), None, None)
        except msgspec.ValidationError:
            pass
    return Document({}, None, raws, None)


def _no_events(path: Path, buf: bytes | bytearray) -> None:
    top = RAW_DICT_DECODER.decode(buf)
    if "nodes" in top and "schema" in top:
        raise TraceError(path, "this is a PyTorch execution trace (Chakra ET), not a profiler trace")
    keys = ", ".join(sorted(top)[:5]) or "none"
    raise TraceError(path, f"JSON object has no traceEvents list (keys: {keys}); not a Kineto trace")


_CONTENT = re.compile(rb"[^ \t\r\n\xef\xbb\xbf]")


def first_byte(buf: bytes | bytearray) -> bytes:
    """The first byte that is neither white space nor part of a UTF-8 BOM; b"" if there is none."""
    m = _CONTENT.search(buf)
    return b"" if m is None else m.group()


def decode_raw_events(raws: list[msgspec.Raw], problems: dict[str, int]) -> list[Event]:
    """Decode a batch of raw events; a wrongly typed event is skipped and counted in ``problems``
    instead of failing the file (its args stay raw here: ``decode_args`` judges those)."""
    try:
        return EVENTS_DECODER.decode(b"[" + b",".join(raws) + b"]")
    except msgspec.ValidationError:
        pass
    events: list[Event] = []
    for raw in raws:
        try:
            events.append(EVENT_DECODER.decode(raw))
        except msgspec.ValidationError as e:
            key = f"event skipped: {e}"
            problems[key] = problems.get(key, 0) + 1
    return events


def _recover_truncated(path: Path, buf: bytes | bytearray, bare_array: bool) -> Document:
    """Keep every complete event before the cut of a file that ends mid-way."""
    header: dict[str, msgspec.Raw] = {}
    if bare_array:
        start = bytes(buf[:4096]).index(b"[") + 1
    else:
        m = re.search(rb'"traceEvents"\s*:\s*\[', buf)
        if m is None:
            raise TraceError(path, "JSON ends early, before any traceEvents")
        start = m.end()
        # Kineto writes schemaVersion, deviceProperties and distributedInfo before the events,
        # so they survive a cut; traceName/displayTimeUnit/baseTimeNanoseconds come after.
        try:
            header = RAW_DOCUMENT_DECODER.decode(bytes(buf[: m.start()]) + b'"traceEvents": []}').as_dict()
        except msgspec.DecodeError:
            header = {}
    pos = len(buf)
    for _ in range(32):
        cut = _last_event_boundary(buf, start, pos)
        if cut is None:
            break
        try:
            raws = RAW_LIST_DECODER.decode(b"[" + bytes(buf[start:cut]) + b"]")
        except msgspec.DecodeError:
            pos = cut - 1
            continue
        per_event = max(1, (cut - start) // max(1, len(raws)))
        truncation = Truncation(
            bytes_total=len(buf),
            bytes_recovered=cut,
            events_recovered=len(raws),
            events_lost_estimate=(len(buf) - cut) // per_event + 1,
        )
        return Document(header, None, raws, truncation)
    raise TraceError(path, "JSON ends early and no complete event could be recovered")


def _last_event_boundary(buf: bytes | bytearray, start: int, end: int) -> int | None:
    """Index just past the last ``}`` that is followed by ``,`` and ``{`` before ``end``."""
    pos = end
    while True:
        brace = buf.rfind(b"{", start, pos)
        if brace < 0:
            return None
        j = brace - 1
        while j > start and buf[j] in _WS:
            j -= 1
        if buf[j : j + 1] == b",":
            j -= 1
            while j > start and buf[j] in _WS:
                j -= 1
            if buf[j : j + 1] == b"}":
                return j + 1
        pos = brace
