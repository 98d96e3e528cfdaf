"""One large Kineto trace read on several cores.

Decoding events and building their columns is CPU work done batch by batch (``Builder.add``),
and msgspec holds the GIL while it decodes, so threads cannot share it. For a large file the
reader starts helper processes as soon as the file's bytes are in memory, so that their imports
overlap the split into raw events. Then each batch goes to a helper that has room for it, as the
batch's JSON bytes, or is built here when none has: the quicker side takes more batches, and at
the end the batches no helper has started are built here. Each comes back as the builder of its
part. Parts are merged in file order, so the Trace is the one the serial read gives, row for row.

A helper is a fresh interpreter that runs ``serve``, not a ``multiprocessing`` worker:
those re-run the caller's ``__main__`` module on start, which would run a user's own script a
second time when it calls ``tracewhy.load``. The parts come back as pickles that our own child
made of our own objects, in a private scratch directory, read back by an unpickler that builds
nothing else (``own_pickles``); no trace file is ever unpickled.
Only a few batches are in flight per helper, so the bytes sent never pile up in memory. A
helper that fails (killed, out of memory) costs only speed: its batches are built here instead.
"""

from __future__ import annotations

import gc
import mmap
import os
import pickle
import select
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from tracewhy import own_pickles
from tracewhy.errors import TraceError
from tracewhy.read_helpers import end, spawn
from tracewhy.readers.kineto.builder import Builder
from tracewhy.readers.kineto.document import BadCut, Body
from tracewhy.readers.kineto.pieces import Span

#: Batches queued for one helper beyond the one it is working on.
_QUEUED_PER_HELPER: Final = 1
#: A batch file's suffix once the helper has claimed it, and once this process has.
_TAKEN: Final = ".taken"
_HERE: Final = ".here"
#: A helper's answer for a batch this process claimed first.
_SKIPPED: Final = "-"


class Helper:
    """One helper process. Batches and parts travel as files in a private scratch directory (in
    ``/dev/shm`` where there is one), their names on the helper's stdin and stdout: one write and
    one read per batch, where a pipe would wake a feeding thread hundreds of times per batch,
    each time taking the GIL from the decoding here.

    A batch is ours until one side claims it by renaming its file (``claim``): the helper before
    it starts on it, this process when it would rather build it itself (at the end of the read)
    or must (the helper failed). Once sent, the batch's bytes live only in its file, so the
    buffer they came from can be filled again at once."""

    def __init__(self, workdir: Path, number: int) -> None:
        self.workdir = workdir
        self.prefix = f"h{number}-"
        self.sent = 0
        self.broken = False
        #: Batches sent and not yet answered, oldest first: (number in the file, file, weight).
        self.in_flight: deque[tuple[int, Path, int]] = deque()
        self._answers = bytearray()  # what has come from stdout and not yet been taken
        self._ended = False
        self.proc: subprocess.Popen[bytes] = spawn()  # (the one the command started early, if it did)
        #: Whether its answers can be looked for without waiting (no select on pipes on Windows).
        self.pollable = True
        self._poll()

    def send(self, k: int, body: Body, weight: int, span: Span | None = None) -> bool:
        """Hand the helper batch ``k`` (a JSON array of events), or where it lies in a plain file
        (``span``: the helper reads it there itself, and nothing is copied here); it works through
        them in order. False if it could not be handed over (then the caller builds it)."""
        if self.broken:
            return False
        name = self.workdir / f"{self.prefix}{self.sent}.json"
        self.sent += 1
        try:
            name.write_bytes(body if span is None else span.record())
            assert self.proc.stdin is not None
            self.proc.stdin.write(f"{name}\n".encode())
            self.proc.stdin.flush()
        except OSError:  # the helper is gone, or the scratch space is full
            self.broken = True
            name.unlink(missing_ok=True)
            return False
        self.in_flight.append((k, name, weight))
        return True

    def ready(self) -> bool:
        """Whether the answer for the oldest batch in flight has come (never waits)."""
        while b"\n" not in self._answers and not self._ended:
            if not self._poll():
                return False
            assert self.proc.stdout is not None
            self._read(self.proc.stdout.fileno())
        return True

    def _poll(self) -> bool:
        """Whether the helper has written something not yet read (never waits)."""
        if not self.pollable:
            return False
        assert self.proc.stdout is not None
        try:
            return bool(select.select([self.proc.stdout.fileno()], [], [], 0)[0])
        except (OSError, ValueError):  # no select on pipes here: it is known once waited for
            self.pollable = False
            return False

    def receive(self) -> object | None:
        """The part built from the oldest batch in flight (taken off ``in_flight``); None if the
        helper failed or the batch did not decode (``build_parts`` then builds it here, and sees
        why)."""
        self.in_flight.popleft()
        line = self._answer()
        if line is None or line == _SKIPPED:
            self.broken = True
            return None
        out = Path(line)
        try:
            payload = out.read_bytes()
            out.unlink()
        except OSError:
            self.broken = True
            return None
        try:
            part: object = own_pickles.loads(payload)  # our own child's pickle of our own objects
        except (pickle.UnpicklingError, EOFError, ValueError):
            self.broken = True
            return None
        return part

    def skip(self) -> None:
        """Take the oldest batch in flight back, after ``claim`` won it: the helper answers
        that it skipped it."""
        self.in_flight.popleft()
        if self._answer() != _SKIPPED:
            self.broken = True

    def _answer(self) -> str | None:
        """The next line the helper wrote, once it has come; None if it ended first."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._answers:
            if self._ended or self.broken:
                return None
            self._read(fd)
        line, _, rest = bytes(self._answers).partition(b"\n")
        self._answers[:] = rest
        return line.decode(errors="replace").strip()

    def _read(self, fd: int) -> None:
        try:
            got = os.read(fd, 65536)
        except OSError:
            got = b""
        if not got:
            self._ended = True
        self._answers += got

    def close(self) -> None:
        end(self.proc)


def claim(name: Path, mark: str) -> Path | None:
    """Take batch file ``name`` for one side (its new name), or None if the other side has it:
    a rename is atomic, so a batch is never built twice, nor lost."""
    mine = name.with_suffix(mark)
    try:
        name.rename(mine)
    except FileNotFoundError:
        return None
    return mine


def scratch_dir() -> Path:
    """A private directory for the batches in flight, in memory (``/dev/shm``) where possible."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="tracewhy-read-", dir=base))


def start_helpers(workers: int, workdir: Path) -> list[Helper]:
    """Start ``workers - 1`` helper processes now, so that their imports overlap our work."""
    helpers: list[Helper] = []
    for number in range(workers - 1):
        try:
            helpers.append(Helper(workdir, number))
        except OSError:  # cannot start processes here: read with what we have
            break
    return helpers


def build_parts(helpers: list[Helper], bodies: Iterable[tuple[Body, int, Span | None]],
                progress: Callable[[int], None]) -> list[object]:
    """Every batch's builder, in file order. Each batch (its bytes, its weight for ``progress``,
    and where it lies in the file, if it is a piece of a plain file) goes to the helper with the
    fewest batches in flight if it has room for one more, else it is built here: whichever side
    is quicker takes more of them. At the end the batches that helpers have not started yet are
    taken back and built here, so that this process does not sit waiting for a helper's
    backlog. The batches are taken from ``bodies`` as they are needed. Raises BadCut as
    ``decode_body``."""
    parts: list[object] = []

    def collect(helper: Helper) -> None:
        k, name, weight = helper.in_flight[0]
        part = helper.receive()
        if part is None:  # the helper failed, or the batch did not decode: see for ourselves
            part = _build_claimed(claim(name, _HERE) or name.with_suffix(_TAKEN))
        else:
            name.with_suffix(_TAKEN).unlink(missing_ok=True)
        parts[k] = part
        progress(weight)

    for k, (body, weight, span) in enumerate(bodies):
        parts.append(None)
        for helper in helpers:
            while helper.in_flight and helper.ready():
                collect(helper)
        target = _target(helpers, k)
        if target is not None:
            while len(target.in_flight) > _QUEUED_PER_HELPER:  # (only when helpers cannot be polled)
                collect(target)
        if target is None or not target.send(k, body, weight, span):
            parts[k] = build_part(body)
            progress(weight)
    for helper in helpers:
        _take_back(helper, parts, progress)
    for helper in helpers:
        while helper.in_flight:
            if parts[helper.in_flight[0][0]] is None:
                collect(helper)
            else:  # taken back
                helper.skip()
    return parts


def _target(helpers: list[Helper], k: int) -> Helper | None:
    """The helper to send batch ``k`` to (the one with the fewest batches in flight, if it has
    room for one more), or None to build it here. Where helpers cannot be polled, batches take
    turns instead: batch k is built here when k is a multiple of the number of processes, else
    by helper ``k % n - 1``, which is waited for when it has no room."""
    if all(h.pollable for h in helpers):
        free = [h for h in helpers if not h.broken and len(h.in_flight) <= _QUEUED_PER_HELPER]
        return min(free, key=lambda h: len(h.in_flight)) if free else None
    turn = k % (len(helpers) + 1) - 1
    return helpers[turn] if turn >= 0 and not helpers[turn].broken else None


def _take_back(helper: Helper, parts: list[object], progress: Callable[[int], None]) -> None:
    """Build here, newest first, the batches in flight that the helper has not started."""
    for k, name, weight in reversed(helper.in_flight):
        mine = claim(name, _HERE)
        if mine is None:
            return  # the helper has this one, and so every older one
        parts[k] = _build_claimed(mine)
        progress(weight)


def _build_claimed(mine: Path) -> Builder:
    """Build here a batch sent to a helper, from its file (which goes)."""
    sent = mine.read_bytes()
    mine.unlink()
    return build_part(_batch(sent))


def _batch(sent: Body, into: bytearray | None = None) -> Body:
    """The bytes of a batch as sent: themselves, or read from the file where they lie."""
    if sent[:1] != b"@":
        return sent
    return Span.from_record(bytes(sent)).read(into)


def build_part(body: Body) -> Builder:
    """Decode one batch (``body`` is a JSON array of events) into a builder of its own."""
    part = Builder(Path())
    part.add_json(body)
    return part


def serve() -> None:
    """A helper's loop: a batch's file name in, the name of its part's file out (``-`` for a
    batch taken back before it was started), until stdin ends."""
    gc.disable()  # as in read_kineto: decoded events form no cycles
    room = bytearray()  # the last piece read from its file: filled again when no view of it is left
    for line in sys.stdin.buffer:
        name = Path(line.decode().strip())
        mine = claim(name, _TAKEN)
        if mine is None:
            answer = _SKIPPED
        else:
            out = name.with_suffix(".part")
            try:
                body = _batch(_mapped(mine), room)
                if isinstance(body, memoryview) and isinstance(body.obj, bytearray):
                    room = body.obj
                part = build_part(body)
                del body
            except (BadCut, RecursionError, TraceError):
                part = None  # the reader sees the same for itself and reads the file another way (or says why not)
            out.write_bytes(pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))
            answer = str(out)
        sys.stdout.buffer.write(f"{answer}\n".encode())
        sys.stdout.buffer.flush()


def _mapped(path: Path) -> memoryview:
    """A file's bytes mapped, not copied: the scratch file already lies in memory."""
    with open(path, "rb") as f:
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
