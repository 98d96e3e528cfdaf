"""The document level of a Kineto JSON file: header, event list, and recovery of cut-off files.

Small files are decoded in one typed pass. Larger ones are read in pieces as they are read
(``pieces``); a file that piece reading cannot handle comes here whole and is split into
raw event spans by a parse (the careful path), so that only one batch of events exists as
Python objects at a time.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from tracewhy.errors import TraceError
from tracewhy.model.trace import Truncation
from tracewhy.readers.kineto.events import (
    EVENT_DECODER,
    EVENTS_DECODER,
    LAX_EVENT_DECODER,
    RAW_DICT_DECODER,
    RAW_DOCUMENT_DECODER,
    RAW_LIST_DECODER,
    TYPED_DOCUMENT_DECODER,
    Event,
)
from tracewhy.readers.kineto.repair import has_non_finite_mark, merge_counts, non_finite_values, repair_json
from tracewhy.readers.limits import bad_utf8

#: Files up to this size are decoded in one typed pass (their events as objects fit easily).
ONE_PASS_MAX_BYTES = 8 * 1024 * 1024
_WS = b" \t\r\n"


class BadCut(Exception):
    """A piece of a large file did not decode as a list of events (the cut fell inside one), or
    the file is not of the shape the piece cutter reads (``pieces``)."""


#: Where the events array of a ``{... "traceEvents": [...]}`` file begins.
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
#: The bytes of a JSON array of events: a piece of its own, or a view of one in place.
Body = bytes | bytearray | memoryview


@dataclass
class Document:
    """A decoded file: header fields kept raw, and events either decoded or as raw spans."""

    header: dict[str, msgspec.Raw]
    events: list[Event] | None
    raw_events: list[msgspec.Raw] | None
    truncation: Truncation | None
    #: What ``repair`` mended before the file decoded, counted by kind.
    repairs: dict[str, int] = field(default_factory=dict)

    @property
    def event_count(self) -> int:
        return len(self.events) if self.events is not None else len(self.raw_events or ())

    def bodies(self, size: int) -> Iterator[tuple[bytes, int]]:
        """The raw events in batches of ``size``, in file order, each as the bytes of a JSON
        array of events with its number of events; made one at a time as they are taken."""
        raws = self.raw_events or []
        for start in range(0, len(raws), size):
            batch = raws[start : start + size]
            yield b"[" + b",".join(batch) + b"]", len(batch)


def decode_body(body: Body, problems: dict[str, int]) -> list[Event]:
    """The events of a JSON array; a wrongly typed event is skipped and counted in ``problems``.
    Bytes a strict decode refuses (invalid UTF-8, NaN...) are repaired (``repair``) and
    the repairs counted in ``problems``. Raises BadCut if the bytes are not a JSON array at all."""
    try:
        return _decode_events(body, problems)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        fixed = repair_json(body)
        if not fixed.counts:
            raise BadCut(str(e)) from None
    found: dict[str, int] = {}  # counted only if the repaired piece decodes (else it is read again whole)
    try:
        events = _decode_events(fixed.data, found)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise BadCut(str(e)) from None
    merge_counts(problems, found)
    merge_counts(problems, fixed.counts)
    return events


def _decode_events(body: Body, problems: dict[str, int]) -> list[Event]:
    try:
        events: list[Event] = EVENTS_DECODER.decode(body)
        return events
    except msgspec.ValidationError:
        return _decode_each(RAW_LIST_DECODER.decode(body), problems)


def split_document(path: Path, buf: bytes | bytearray, *, one_pass: bool = True) -> Document:
    """The header and the events of a file held whole: decoded in one pass when it is small
    enough and ``one_pass`` allows, else as raw event spans to decode batch by batch. A file
    that a strict decode refuses is repaired (``repair``) and read again; what was
    repaired is in the Document's ``repairs``."""
    try:
        return _split(path, buf, one_pass, repaired=False)
    except _Unreadable:
        fixed = repair_json(buf)
        doc = _split(path, fixed.data, one_pass, repaired=True)
        doc.repairs = fixed.counts
        return doc


class _Unreadable(Exception):
    """A strict decode of the whole file failed in a way a repair may mend."""


def _split(path: Path, buf: bytes | bytearray, one_pass: bool, *, repaired: bool) -> Document:
    first = first_byte(buf)
    if first not in (b"{", b"["):
        raise TraceError(path, "not JSON: expected a Kineto trace object or event array")
    one_pass = one_pass and len(buf) <= ONE_PASS_MAX_BYTES
    try:  # (the careful path below can meet a decode error the typed one stopped short of)
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
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        if not repaired and _may_repair(buf, e):
            raise _Unreadable from None
        if bad_utf8(e):  # (never after a repair: it replaced every bad byte)
            where = f"{e.reason} at byte {e.start}" if isinstance(e, UnicodeDecodeError) else str(e)
            raise TraceError(path, f"not valid UTF-8 ({where})") from None
        if "truncated" not in str(e):
            raise TraceError(path, f"not valid JSON ({e})") from None
        return _recover_truncated(path, buf, first == b"[")


def _may_repair(buf: bytes | bytearray, e: Exception) -> bool:
    """Whether a failed decode may be one ``repair_json`` mends: cheap checks on the bytes, so
    that a file that is only cut off (the common failure) is not scanned for nothing."""
    if bad_utf8(e) or b"\\ud" in buf or b"\\uD" in buf:
        return True
    content = _CONTENT.search(buf)
    if content is not None and b"\xef" in buf[: content.start()]:  # a BOM before the JSON
        return True
    return bool(non_finite_values(buf))


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


def content_start(buf: bytes | bytearray, end: int) -> int:
    """Where the first byte that is neither white space nor part of a UTF-8 BOM is, before
    ``end``; ``end`` if there is none."""
    m = _CONTENT.search(buf, 0, end)
    return end if m is None else m.start()


def first_byte(buf: bytes | bytearray) -> bytes:
    """The first byte that is neither white space nor part of a UTF-8 BOM; b"" if there is none."""
    m = _CONTENT.search(buf)
    return b"" if m is None else m.group()


def _decode_each(raws: list[msgspec.Raw], problems: dict[str, int]) -> list[Event]:
    """Decode events one by one (a batch with a wrongly typed event): that event is skipped and
    counted in ``problems`` instead of failing the file; args stay raw (``decode_args`` judges
    those)."""
    events: list[Event] = []
    for raw in raws:
        try:
            events.append(EVENT_DECODER.decode(raw))
        except msgspec.ValidationError as e:
            if has_non_finite_mark(raw):  # a repaired NaN/Infinity: a float field takes it
                with contextlib.suppress(msgspec.ValidationError):
                    events.append(LAX_EVENT_DECODER.decode(raw))
                    continue
            key = f"event skipped: {e}"
            problems[key] = problems.get(key, 0) + 1
    return events


def _recover_truncated(path: Path, buf: bytes | bytearray, bare_array: bool) -> Document:
    """Keep every complete event before the cut of a file that ends mid-way."""
    header: dict[str, msgspec.Raw] = {}
    if bare_array:
        start = bytes(buf[:4096]).index(b"[") + 1
    else:
        m = EVENTS_KEY.search(buf)
        if m is None:
            raise TraceError(path, "JSON ends early, before any traceEvents")
        start = m.end()
        # Kineto writes schemaVersion, deviceProperties and distributedInfo before the events,
        # so they survive a cut; traceName/displayTimeUnit/baseTimeNanoseconds come after.
        try:
            header = RAW_DOCUMENT_DECODER.decode(bytes(buf[: m.start()]) + b'"traceEvents": []}').as_dict()
        except msgspec.DecodeError:
            header = {}
    closed = _closed_events(buf, start)
    if closed is not None:  # cut after the events: every event is there
        close, raws = closed
        return Document(header, None, raws, Truncation(
            bytes_total=len(buf), bytes_recovered=close + 1, events_recovered=len(raws), events_lost_estimate=0))
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


#: The end of an event and of the events array: ``}`` then ``]``, at any spacing.
_EVENTS_CLOSE = re.compile(rb"\}\s*\]")
_CLOSE_TAIL = 1024 * 1024


def _closed_events(buf: bytes | bytearray, start: int) -> tuple[int, list[msgspec.Raw]] | None:
    """Where the events array of a cut file closes, with its events, when the cut came after
    it (in the fields that follow, or before the final brace); None when it came earlier. The
    last few ``}]`` in the file's last MB are tried (one inside an event's args fails to
    decode as the array's end)."""
    lo = max(start, len(buf) - _CLOSE_TAIL)
    ends = [m.end() - 1 for m in _EVENTS_CLOSE.finditer(buf, lo)][::-1][:4]
    for close in ends:
        try:
            raws = RAW_LIST_DECODER.decode(b"[" + bytes(buf[start:close]) + b"]")
        except msgspec.DecodeError:
            continue
        return close, raws
    return None


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
