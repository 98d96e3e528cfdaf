"""A trace's events as the exact bytes its file holds, for writers that must keep them (the
annotated trace of ``tracewhy export``): the model's tables drop fields, so they are never
re-serialized. A format whose reader can give them registers a raw-events reader."""

from __future__ import annotations

import msgspec


class RawEvents(msgspec.Struct, frozen=True):
    """``header``: every top-level field but ``traceEvents``, in file order, as written;
    ``events``: each event's bytes exactly as in the file. ``truncated``: the file was cut off
    and ``events`` are the complete ones before the cut."""

    header: dict[str, msgspec.Raw]
    events: list[msgspec.Raw]
    truncated: bool = False
