"""A large Kineto file cut into pieces of events while it is read, never held whole.

Parsing a file once just to find where its events begin and end costs about as much as decoding
them (1 s per GB), and holding its bytes costs as much memory as the file. Instead the file is
read (and inflated) a few MB at a time, and each time enough has come in, it is cut at the first
place past the piece's length that looks like the gap between two events (``}`` ``,`` ``{``);
what follows the last cut waits for more. Each piece goes out as the bytes of a JSON array of events.

The cuts are checked, not trusted: a piece is valid JSON only if both its cuts lie between two
events of the top-level array (a cut inside a string or a nested object leaves a bracket or a
quote open), so when every piece decodes, the file is read exactly as a whole parse reads it.
When one does not (an event named "}, {" at the wrong place), or the file is not shaped
``{... "traceEvents": [...] ...}`` (a bare array, a cut-off file), ``BadCut`` is raised and the
reader reads the file whole, the careful way, which also explains what is wrong with it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

import msgspec

from tracewhy.errors import TraceError
from tracewhy.readers.kineto.document import EVENTS_KEY, BadCut, content_start, first_byte
from tracewhy.readers.kineto.events import EVENTS_DECODER, RAW_DOCUMENT_DECODER
from tracewhy.readers.kineto.repair import repair_json
from tracewhy.readers.limits import bad_utf8
from tracewhy.readers.source import is_gzip, iter_content

#: Pieces of a sixteenth of the file, within these bounds. Small pieces keep few events alive
#: at a time (8 MB of events are about 20 MB as Python objects); each piece also costs a fixed
#: ~5 ms (its columns, its round trip to a helper). Measured on the 56 MB trace: 8 MB pieces
#: peak at 2.1-2.6x the file above the imports, 2-4 MB pieces at 1.4-1.9x and no slower; on
#: the 1 GB one, 2 MB pieces take 7-10 s, 16 MB pieces 5.2-5.7 s (two processes). Later, on
#: the V100 DDP trace's 271 MB inflation (whole command, two processes, load 3.5): 16 MB pieces
#: 3.2-3.3 CPU s and 408-413 MB for the two processes together at the peak, 8 MB pieces 2.9-3.0
#: s and 373-381 MB (fewer page faults, and the peak is then the joining of the columns, after
#: the helper has gone), 4 MB as 8; on its 1 GB inflation 4, 8 and 16 MB pieces are within the
#: noise (10.5-11 CPU s).
PIECE_MIN_BYTES: Final = 2 * 1024 * 1024
PIECE_BYTES: Final = 8 * 1024 * 1024


#: With ``taper``, the pieces within this many piece lengths of a plain file's end are cut this
#: many times smaller: processes that share a file's pieces finish their last ones closer together.
TAPER_PIECES: Final = 2
TAPER_DIVISOR: Final = 4


#: The file is read (or inflated) this much at a time: what runs past a piece's cut is copied
#: into the next piece, so small reads keep that copy small.
READ_BYTES: Final = 256 * 1024


def piece_size(content_bytes: int) -> int:
    """The piece size for a file of ``content_bytes`` (inflated)."""
    return min(max(content_bytes // 16, PIECE_MIN_BYTES), PIECE_BYTES)
#: The end of one event and the start of the next, at any spacing. It can also match inside a
#: string or a nested object; a piece cut there is not valid JSON, and decoding it says so.
_BETWEEN_EVENTS: Final = re.compile(rb"\}\s*,\s*\{")
#: No gap between two events within this many bytes past a piece's length: no real event is
#: that long, so the file is refused (a run of white space inflated from a small gzip, or one
#: huge string, would otherwise be held whole).
_EVENT_MAX: Final = 256 * 1024 * 1024
#: The events must begin within this many bytes (Kineto writes a few KB of header first).
_HEAD_MAX: Final = 64 * 1024 * 1024
#: How far back from the end of the events the last gap between two of them is looked for.
_TAIL_MAX: Final = 1024 * 1024


def open_pieces(path: Path, piece_bytes: int, max_inflated_bytes: int, *,
                lent: bool, taper: bool = False) -> PieceStream | LentPieces:
    """The pieces of a file's events. ``lent``: the consumer is done with each piece before it
    asks for the next (no piece is kept), so a plain file can be read into two buffers that take
    turns; otherwise, and for gzip, each piece is a buffer of its own. ``taper``: a plain file's
    last pieces are smaller (``TAPER_PIECES``), for pieces shared among processes."""
    if lent and not is_gzip(path):
        with contextlib.suppress(OSError):  # PieceStream says what is wrong with the file
            return LentPieces(path, piece_bytes, taper=taper)
    return PieceStream(iter_content(path, READ_BYTES, max_inflated_bytes), piece_bytes, path)


class Span(msgspec.Struct, frozen=True):
    """Where the events of a piece of a plain file lie in it: ``length`` bytes from ``offset``
    (the piece is those bytes in brackets), with the file's size and change time as it was
    read. Another process can read the piece from the file itself (``read``), and a span is
    sent where the piece's bytes would otherwise be copied."""

    path: Path
    offset: int
    length: int
    stamp: tuple[int, int]

    def record(self) -> bytes:
        """The span as a few bytes (``from_record`` reads them back); never the start of a piece."""
        return b"@%d %d %d %d " % (self.offset, self.length, *self.stamp) + os.fsencode(self.path)

    @staticmethod
    def from_record(record: bytes) -> Span:
        offset, length, size, changed, path = record[1:].split(b" ", 4)
        return Span(Path(os.fsdecode(path)), int(offset), int(length), (int(size), int(changed)))

    def read(self, into: bytearray | None = None) -> memoryview:
        """The piece, read from the file (into ``into`` when it is large enough and no view of
        it is alive). Raises TraceError if the file is not as it was when the span was made."""
        with open(self.path, "rb") as f:
            if _stamp(f) != self.stamp:
                raise TraceError(self.path, "the file changed while it was being read")
            buf = into if into is not None and len(into) >= self.length + 2 and _free(into) \
                else bytearray(self.length + 2)
            f.seek(self.offset)
            with memoryview(buf) as room:
                got = f.readinto(room[1 : self.length + 1])
        if got != self.length:
            raise TraceError(self.path, "the file changed while it was being read")
        buf[0], buf[self.length + 1] = ord("["), ord("]")
        return memoryview(buf)[: self.length + 2]


def _stamp(f: BinaryIO) -> tuple[int, int]:
    st = os.fstat(f.fileno())
    return st.st_size, st.st_mtime_ns


class PieceStream:
    """Pieces of a file's events, from its content in chunks; ``header`` is set after the last."""

    #: (Pieces of inflated content lie in no file: they have no span.)
    span: Span | None = None

    def __init__(self, chunks: Iterator[bytes], piece_bytes: int, path: Path) -> None:
        self._chunks = chunks
        self._piece_bytes = piece_bytes
        self._path = path
        self.header: dict[str, msgspec.Raw] | None = None

    def pieces(self) -> Iterator[bytearray]:
        """Each piece as the bytes of a JSON array of events, in file order. Raises BadCut when
        the file is not of the shape this reads (nothing is yielded then, unless the shape only
        shows late, at the end of a cut-off file).

        Each piece is a buffer of its own, never changed once given out (decoded events' raw
        args are views into it). The content is copied once, into the piece it belongs to:
        joining chunks and then bracketing each piece cost three copies, and their page faults
        were a tenth of a 56 MB read.
        """
        head, data = _head(self._chunks)
        size = self._piece_bytes
        cur = bytearray(b"[")
        cur += data
        searched = 1 + size  # where the search for the next cut resumes
        for chunk in self._chunks:
            cur += chunk
            # Cut at the first gap past the piece's length, once a whole piece has come in.
            while len(cur) - 1 >= size:
                gap = _BETWEEN_EVENTS.search(cur, searched)
                if gap is None:  # the event there runs past what has come in: read on
                    searched = _resume(cur, searched, len(cur), self._path)
                    break
                nxt = bytearray(b"[")
                nxt += memoryview(cur)[gap.end() - 1 :]
                del cur[gap.start() + 1 :]
                cur += b"]"
                yield cur
                cur, searched = nxt, 1 + size
        close, header = _close(head, cur, 1)
        del cur[close:]
        cur += b"]"
        yield cur
        self.header = header

    def close(self) -> None:
        """(Nothing to give back: each piece goes when its last user lets it go.)"""


def _head(chunks: Iterator[bytes]) -> tuple[bytes, bytes]:
    """The header's bytes up to the events' key, and what came after its ``[``."""
    parts: list[bytes] = []
    size = 0
    for chunk in chunks:
        if not parts and first_byte(chunk[:4096]) not in (b"{", b""):
            raise BadCut("not a JSON object")  # a bare event array, or not JSON at all
        parts.append(chunk)
        size += len(chunk)
        got = b"".join(parts) if len(parts) > 1 else chunk
        key = EVENTS_KEY.search(got)
        if key is not None:
            # Past leading white space and a UTF-8 BOM (Windows tools write one): the header is
            # decoded again with the events' end, and the decoder refuses a BOM.
            head = got[content_start(got, key.start()) : key.start()]
            if head[:1] != b"{":
                raise BadCut("not a JSON object")
            return head, got[key.end() :]
        parts = [got]
        if size > _HEAD_MAX:
            break
    raise BadCut("no traceEvents list near the start")


class LentPieces:
    """Pieces of a plain (not gzip) file's events, read straight into two buffers that take
    turns: the content is copied once, from the OS into a buffer that is already in memory.
    ``header`` is set after the last piece.

    Each piece is a view of a buffer, lent until the next is asked for: decoded events' raw
    args point into it, so a buffer is filled again only once nothing refers to it any more (no
    view of it is alive, which a resize would refuse); otherwise a new one is made. The piece
    is bracketed in place: ``[`` at the buffer's first byte, ``]`` over the gap byte after its
    last event. Raises ``OSError`` when the file cannot be opened, BadCut as ``PieceStream``.
    """

    def __init__(self, path: Path, piece_bytes: int = PIECE_BYTES, *, taper: bool = False) -> None:
        self._file = open(path, "rb")  # noqa: SIM115  (closed by close())
        self._path = path
        self._piece_bytes = piece_bytes
        self._taper = taper
        self._stamp = _stamp(self._file)
        self.header: dict[str, msgspec.Raw] | None = None
        #: Where the piece last given out lies in the file.
        self.span: Span | None = None

    def pieces(self) -> Iterator[memoryview]:
        with self._file:
            yield from self._pieces()

    def _pieces(self) -> Iterator[memoryview]:
        f, size = self._file, self._piece_bytes
        head, data = _head(iter(lambda: f.read(READ_BYTES), b""))
        # Buffers of earlier pieces. The consumer still holds the last one while it asks for the
        # next piece, so it is the one before that which comes back free.
        earlier: list[bytearray] = []
        buf = bytearray(size + 2 * READ_BYTES)
        filled = _put(buf, 1, data)
        offset = f.tell() - len(data)  # of buf[1] in the file
        searched = 1 + size  # where the search for the next cut resumes
        while True:
            gap = _BETWEEN_EVENTS.search(buf, searched, filled) if filled - 1 >= size else None
            if gap is None:  # read on
                if filled - 1 >= size:
                    searched = _resume(buf, searched, filled, self._path)
                if len(buf) - filled < READ_BYTES:  # an event longer than the room left: grow
                    bigger = bytearray(2 * len(buf))
                    _put(bigger, 0, memoryview(buf)[:filled])
                    buf = bigger
                with memoryview(buf) as room:
                    got = f.readinto(room[filled:])
                if not got:
                    break
                filled += got
                continue
            free = [b for b in earlier if len(b) >= len(buf) and _free(b)]
            nxt = free[0] if free else bytearray(len(buf))
            earlier = [*[b for b in earlier if b is not nxt][-1:], buf]
            rest = _put(nxt, 1, memoryview(buf)[gap.end() - 1 : filled])
            buf[0], buf[gap.start() + 1] = ord("["), ord("]")
            self.span = Span(self._path, offset, gap.start(), self._stamp)
            yield memoryview(buf)[: gap.start() + 2]
            size = self._next_size(size, rest - 1)
            offset += gap.end() - 2
            buf, filled, searched = nxt, rest, 1 + size
        del buf[filled:]
        close, header = _close(head, buf, 1)
        buf[0] = ord("[")
        self.span = Span(self._path, offset, close - 1, self._stamp)
        yield memoryview(buf)[: close + 1]
        self.header = header

    def _next_size(self, size: int, held: int) -> int:
        """The next piece's length, ``held`` bytes of the file being already read past the cut."""
        if not self._taper or size < self._piece_bytes:
            return size
        left = os.fstat(self._file.fileno()).st_size - self._file.tell() + held
        return max(1, size // TAPER_DIVISOR) if left < TAPER_PIECES * size else size

    def close(self) -> None:
        self._file.close()


def _resume(buf: bytearray, lo: int, hi: int, path: Path) -> int:
    """Where to search again for a cut once more has come in, after none was found in
    ``buf[lo:hi]``: at the last ``}`` there (a gap not yet complete starts at a ``}`` with only
    white space or a comma after it), else at ``hi``. Searching again from ``lo`` each time made
    a long run without a gap quadratic (2 GB of white space: an hour). Past ``_EVENT_MAX`` the
    file is refused."""
    if hi - lo > _EVENT_MAX:
        raise TraceError(path, f"no gap between two events within {_EVENT_MAX // 2**20} MB (an event, or a run "
                               "of white space, that long): not a trace this reader accepts")
    last = buf.rfind(b"}", lo, hi)
    return last if last >= 0 else hi


def _put(buf: bytearray, at: int, data: bytes | bytearray | memoryview) -> int:
    """Copy ``data`` into ``buf`` at ``at`` (``buf`` is large enough); where it ends."""
    end = at + len(data)
    buf[at:end] = data
    return end


def _free(buf: bytearray) -> bool:
    """Whether no view of ``buf`` is alive (so nothing points into it): only then may it be
    resized, which is the test (one byte off and back on: within its allocation, no copy)."""
    try:
        last = buf.pop()
    except BufferError:
        return False
    buf.append(last)
    return True


def _close(head: bytes, data: bytearray, first: int = 0) -> tuple[int, dict[str, msgspec.Raw]]:
    """Where the events array closes in the file's last bytes (those from ``first`` in
    ``data``), and the header it completes.

    The closing bracket is the last ``]`` after which the rest completes the header and before
    which the last events decode as events (a list that closes after them, such as
    deviceProperties in newer files, fails that); a file cut off before it raises BadCut.
    """
    template = head + b'"traceEvents": []'
    end = len(data)
    while True:
        close = data.rfind(b"]", first, end)
        if close < 0 or len(data) - close > _TAIL_MAX:
            raise BadCut("the events array does not close")
        end = close
        try:
            header = RAW_DOCUMENT_DECODER.decode(template + data[close + 1 :])
        except msgspec.DecodeError:  # (ValidationError too)
            continue
        if header.traceEvents == [] and _ends_with_events(data, first, close):
            return close, header.as_dict()


def _ends_with_events(data: bytearray, first: int, close: int) -> bool:
    """Whether the bytes from ``first`` to ``close`` end with events (each with a phase, as
    events have).

    Decoded from the last place that looks like a gap between events; one inside a string
    (an event named "}, {") does not decode, so earlier ones are tried, and then the start.
    """
    lo = max(first, close - _TAIL_MAX)
    froms = [m.end() - 1 for m in _BETWEEN_EVENTS.finditer(data, lo, close)][::-1][:64]
    if lo == first:
        froms.append(first)
    view = memoryview(data)
    for frm in froms:
        body = b"".join((b"[", view[frm:close], b"]"))
        try:
            try:
                events = EVENTS_DECODER.decode(body)
            except (msgspec.DecodeError, UnicodeDecodeError) as e:
                if not bad_utf8(e):
                    raise
                # Invalid UTF-8 in a name: the piece's decode repairs it.
                events = EVENTS_DECODER.decode(repair_json(body).data)
        except msgspec.DecodeError:
            continue
        return all(e.ph for e in events)
    return False
