"""Reader for PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzipped, PyTorch 1.8 to 2.13.

``read_kineto`` chooses the way through the file: in pieces as it comes off the disk
(``pieces``) or whole (``document``), decoded here or also in helper processes
(``parallel``); a ``Builder`` turns the batches of events into the Trace's columns.
"""

from __future__ import annotations

import dataclasses
import gc
import shutil
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

from tracewhy.errors import TraceError
from tracewhy.model.schema import Kind
from tracewhy.model.trace import Trace
from tracewhy.read_helpers import worker_count
from tracewhy.readers.kineto import document, parallel, pieces
from tracewhy.readers.kineto.builder import Builder
from tracewhy.readers.kineto.document import BadCut, Body, first_byte, split_document
from tracewhy.readers.kineto.pieces import Span
from tracewhy.readers.kineto.repair import merge_counts, too_deep
from tracewhy.readers.source import DEFAULT_MAX_INFLATED_BYTES, content_size, gzip_complete, is_gzip, read_bytes

Progress = Callable[[int, int], None]
DEFAULT_BATCH = 100_000


def read_kineto(
    path: str | Path,
    *,
    progress: Progress | None = None,
    batch_size: int = DEFAULT_BATCH,
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
    workers: int | None = None,
    kinds: Collection[Kind] | None = None,
) -> Trace:
    """Read a Kineto JSON trace (``.json`` or ``.json.gz``) into a Trace.

    A file over ``ONE_PASS_MAX_BYTES`` is read in pieces as it comes off the disk
    (``pieces``) and never held whole; a small one, and one that piece reading cannot
    handle, is read whole (``document``). ``workers``: processes that decode (default:
    two for a file of 256 MB or more, see ``parallel``). The Trace is the same either
    way and for any number of workers. ``kinds`` (what every timeline reader takes) changes
    nothing: JSON is parsed whole, so the Trace is whole.
    """
    path = Path(path)
    try:
        return _read(path, progress, batch_size, max_inflated_bytes, workers)
    except RecursionError:
        # msgspec recurses once per level of nesting (even to skip a value it does not keep).
        raise TraceError(path, too_deep()) from None


def _read(path: Path, progress: Progress | None, batch_size: int, max_inflated_bytes: int,
          workers: int | None) -> Trace:
    size = content_size(path)
    whole_max, piece = document.ONE_PASS_MAX_BYTES, pieces.piece_size(size)
    # Helpers start before the read, so that their start-up overlaps it.
    count = worker_count(size, workers) if size > whole_max or workers else 1
    scratch = parallel.scratch_dir() if count > 1 else None
    helpers = parallel.start_helpers(count, scratch) if scratch is not None else []
    # The cyclic collector would walk every decoded event object again and again while the
    # batches are built; none of them can form a cycle, so it is paused for the read.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    builder: Builder | None = None
    try:
        if size > whole_max:
            # A piece sent to a helper is copied out at once: every piece may be lent.
            stream = pieces.open_pieces(path, piece, max_inflated_bytes, lent=True, taper=bool(helpers))
            try:
                builder = _build(path, ((p, len(p), stream.span) for p in stream.pieces()), helpers, size, progress)
            except BadCut:
                # Not a shape piece reading handles, or a cut inside an event: read it whole.
                # Helpers may hold batches of the abandoned read: new ones take over.
                builder = None
                if helpers:
                    _stop(helpers, None)
                    helpers = parallel.start_helpers(count, scratch) if scratch is not None else []
            else:
                assert stream.header is not None
                header, truncation = stream.header, None
                had_events = bool(builder.rows_seen or builder.problems)
            finally:
                stream.close()
        if builder is None:
            buf = read_bytes(path, max_inflated_bytes)
            if not first_byte(buf):  # (never buf.strip(): that would copy the whole file)
                # A gzip file cut inside its first block inflates to nothing: it is not empty.
                raise TraceError(path, "gzip stream ends before any content: the file is cut short"
                                 if is_gzip(path) and not gzip_complete(path) else "file is empty")
            doc = split_document(path, buf, one_pass=not helpers and size <= whole_max)
            del buf
            if doc.events is not None:
                builder = Builder(path)
                builder.add(doc.events)
                if progress is not None:
                    progress(len(doc.events), len(doc.events))
            else:
                builder = _build(path, ((b, n, None) for b, n in doc.bodies(batch_size)), helpers, doc.event_count,
                                 progress)
            merge_counts(builder.problems, doc.repairs)
            had_events = doc.event_count > 0
            header, truncation = doc.header, doc.truncation
            if truncation is not None and is_gzip(path) and not gzip_complete(path):
                truncation = dataclasses.replace(truncation, stream_cut=True)
            doc.events = doc.raw_events = None  # let the events go before the columns are joined
    finally:
        # Helpers are gone, and the collector back, before the columns are joined.
        _stop(helpers, scratch)
        if gc_was_enabled:
            gc.enable()
    if had_events and not builder.rows_seen:
        _no_usable_events(path, builder)
    return builder.finish(header, truncation)


def _no_usable_events(path: Path, builder: Builder) -> None:
    first = next(iter(builder.problems), "no event could be decoded")
    raise TraceError(path, f"no usable events ({first})")


def _stop(helpers: list[parallel.Helper], scratch: Path | None) -> None:
    for helper in helpers:
        helper.close()
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


def _build(path: Path, bodies: Iterable[tuple[Body, int, Span | None]], helpers: list[parallel.Helper],
           total: int, progress: Progress | None) -> Builder:
    """Build the columns of every batch (bytes of a JSON array of events, its weight in units
    of ``total``, and where it lies in a plain file, if it does), here or in a helper."""
    builder = Builder(path)
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(min(done, total), total)

    if helpers:
        for part in parallel.build_parts(helpers, bodies, advance):
            assert isinstance(part, Builder)
            builder.merge(part)
    else:
        for body, weight, _ in bodies:
            builder.add_json(body)
            advance(weight)
    return builder

