"""A Kineto file's events as the exact bytes it holds (``model/raw_events``), for writers that
must keep them (the annotated trace of ``tracewhy export``). Nothing is decoded beyond the top
level."""

from __future__ import annotations

from pathlib import Path

import msgspec

from tracewhy.errors import TraceError
from tracewhy.model.raw_events import RawEvents
from tracewhy.readers.kineto.document import first_byte, split_document
from tracewhy.readers.kineto.repair import too_deep
from tracewhy.readers.source import DEFAULT_MAX_INFLATED_BYTES, read_bytes

_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_LIST = msgspec.json.Decoder(list[msgspec.Raw])


def read_raw_events(path: str | Path, max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES) -> RawEvents:
    path = Path(path)
    buf = read_bytes(path, max_inflated_bytes)
    first = first_byte(buf)
    if first not in (b"{", b"["):
        raise TraceError(path, "not JSON: expected a Kineto trace object or event array")
    try:
        if first == b"[":
            return RawEvents({}, _LIST.decode(buf))
        top = _TOP.decode(buf)
        events = top.pop("traceEvents", None)
        if events is None:
            raise TraceError(path, "JSON object has no traceEvents list; not a Kineto trace")
        return RawEvents(top, _LIST.decode(events))
    except RecursionError:
        raise TraceError(path, too_deep()) from None
    except msgspec.DecodeError:
        # Cut off, or bytes a strict decode refuses (a BOM, NaN, a lone surrogate): the reader's
        # own recovery and repair find the events, kept raw (not decoded in one pass).
        try:
            doc = split_document(path, buf, one_pass=False)
        except RecursionError:
            raise TraceError(path, too_deep()) from None
        if doc.raw_events is None:
            raise TraceError(path, "traceEvents could not be split into events") from None
        return RawEvents(doc.header, doc.raw_events, truncated=doc.truncation is not None)
