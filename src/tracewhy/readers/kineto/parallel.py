"""One large Kineto trace read on several cores.

Decoding events and building their columns is CPU work done batch by batch (``Builder.add``),
and msgspec holds the GIL while it decodes, so threads cannot share it. For a large file the
reader starts helper processes as soon as the file's bytes are in memory, so that their imports
overlap the split into raw events. Then every n-th batch stays here and the others go to the
helpers as the batch's JSON bytes; each comes back as the builder of its part. Parts are merged
in file order, so the Trace is the one the serial read gives, row for row.

A helper is a fresh interpreter that runs ``serve``, not a ``multiprocessing`` worker:
those re-run the caller's ``__main__`` module on start, which would run a user's own script a
second time when it calls ``tracewhy.load``. The parts come back as pickles that our own child
made of our own objects, in a private scratch directory; no trace file is ever unpickled.
Only a few batches are in flight per helper, so the bytes sent never pile up in memory. A
helper that fails (killed, out of memory) costs only speed: its batches are built here instead.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from tracewhy.readers.kineto.builder import Builder
from tracewhy.readers.kineto.document import BadCut, Body

#: Below this many (uncompressed) bytes a helper's start-up (an interpreter and its imports,
#: about 0.4 s of CPU) costs more than it saves.
PARALLEL_MIN_BYTES: Final = 256 * 1024 * 1024
#: ``TRACEWHY_READ_WORKERS=N``: N processes decode (1: no helpers), whatever the file's size.
ENV_WORKERS: Final = "TRACEWHY_READ_WORKERS"
#: Set in a helper's environment: a helper never starts helpers of its own, and a process pool
#: worker (``tracewhy ranks``) can set it to keep to one core per file.
ENV_IN_HELPER: Final = "TRACEWHY_READ_HELPER"
#: Default ceiling on processes: each helper holds about 200 MB, and the memory target is twice
#: the file in all.
DEFAULT_MAX_WORKERS: Final = 2
#: Batches queued for one helper beyond the one it is working on.
_QUEUED_PER_HELPER: Final = 1
#: What a helper runs. Not ``-m`` this module: the package imports it before ``-m`` would run
#: it, and it would then be loaded twice.
_SERVE: Final = f"from {__name__} import serve; serve()"


def worker_count(nbytes: int, requested: int | None = None) -> int:
    """How many processes should decode a file of ``nbytes`` (1 means this one alone).

    ``requested`` (or ``$TRACEWHY_READ_WORKERS``) wins; otherwise two for a large file when two
    CPUs are ours to use and this process is not itself a helper.
    """
    if requested is None:
        env = os.environ.get(ENV_WORKERS, "").strip()
        if env.isdigit():
            requested = int(env)
    if requested is not None:
        return max(1, requested)
    if nbytes < PARALLEL_MIN_BYTES or os.environ.get(ENV_IN_HELPER):
        return 1
    if multiprocessing.parent_process() is not None:
        return 1  # a pool worker (``tracewhy ranks`` reads a file per process): its cores are spoken for
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, DEFAULT_MAX_WORKERS))


class Helper:
    """One helper process. Batches and parts travel as files in a private scratch directory (in
    ``/dev/shm`` where there is one), their names on the helper's stdin and stdout: one write and
    one read per batch, where a pipe would wake a feeding thread hundreds of times per batch,
    each time taking the GIL from the decoding here."""

    def __init__(self, workdir: Path, number: int) -> None:
        self.workdir = workdir
        self.prefix = f"h{number}-"
        self.sent = 0
        self.broken = False
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=dict(os.environ, **{ENV_IN_HELPER: "1"}),
        )

    def send(self, body: Body) -> None:
        """Hand the helper a batch (a JSON array of events); it works through them in order."""
        if self.broken:
            return
        name = self.workdir / f"{self.prefix}{self.sent}.json"
        self.sent += 1
        try:
            name.write_bytes(body)
            assert self.proc.stdin is not None
            self.proc.stdin.write(f"{name}\n".encode())
            self.proc.stdin.flush()
        except OSError:  # the helper is gone, or the scratch space is full
            self.broken = True

    def receive(self) -> object | None:
        """The part built from the oldest batch not yet received; None if the helper failed or
        the batch did not decode (``build_parts`` then builds it here, and sees why)."""
        if self.broken:
            return None
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode(errors="replace").strip()
        if not line:
            self.broken = True
            return None
        out = Path(line)
        try:
            payload = out.read_bytes()
            out.unlink()
        except OSError:
            self.broken = True
            return None
        part: object = pickle.loads(payload)  # our own child's pickle of our own objects
        return part

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


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


def build_parts(helpers: list[Helper], bodies: Iterable[tuple[Body, int]],
                progress: Callable[[int], None]) -> list[object]:
    """Every batch's builder, in file order: batch k (its bytes, and its weight for ``progress``)
    is built here when k is a multiple of the number of processes, else by helper ``k % n - 1``.
    The batches are taken from ``bodies`` as they are needed. Raises BadCut as ``decode_body``."""
    stride = len(helpers) + 1
    parts: list[object] = []
    sent: list[list[tuple[int, Body, int]]] = [[] for _ in helpers]  # per helper, oldest first

    def collect(h: int) -> None:
        k, body, weight = sent[h].pop(0)
        part = helpers[h].receive()
        # None: the helper failed, or the batch did not decode: see for ourselves.
        parts[k] = part if part is not None else build_part(body)
        progress(weight)

    for k, (body, weight) in enumerate(bodies):
        parts.append(None)
        h = k % stride - 1
        if h < 0 or helpers[h].broken:
            parts[k] = build_part(body)
            progress(weight)
            continue
        # Keep the helper's backlog short: take its oldest finished part before sending more.
        while len(sent[h]) > _QUEUED_PER_HELPER:
            collect(h)
        helpers[h].send(body)
        sent[h].append((k, body, weight))
    for h in range(len(helpers)):
        while sent[h]:
            collect(h)
    return parts


def build_part(body: Body) -> Builder:
    """Decode one batch (``body`` is a JSON array of events) into a builder of its own."""
    part = Builder(Path())
    part.add_json(body)
    return part


def serve() -> None:
    """A helper's loop: a batch's file name in, the name of its part's file out, until stdin ends."""
    gc.disable()  # as in read_kineto: decoded events form no cycles
    for line in sys.stdin.buffer:
        name = Path(line.decode().strip())
        body = name.read_bytes()
        name.unlink()
        out = name.with_suffix(".part")
        try:
            part = build_part(body)
        except (BadCut, RecursionError):
            part = None  # the reader sees the same for itself and reads the file another way (or says why not)
        out.write_bytes(pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))
        del body
        sys.stdout.buffer.write(f"{out}\n".encode())
        sys.stdout.buffer.flush()
