"""What native libraries write straight to file descriptor 2 while they read a file, kept off the
user's terminal and handed back as text. NVIDIA's ``ncu_report`` module logs protobuf parse
errors there ("message_lite.cc:195] Can't parse message of type ...") on a damaged report, before
tracewhy's own one-line error; the reader turns the text into a warning instead."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

#: The most of it kept for a warning.
MAX_CHARS = 2000


@contextlib.contextmanager
def captured_fd2() -> Iterator[list[str]]:
    """Redirect fd 2 to a private temporary file for the block; the list holds its lines after.
    Where fd 2 cannot be redirected (no such descriptor), the block runs as it is."""
    lines: list[str] = []
    try:
        saved = os.dup(2)
    except OSError:
        yield lines
        return
    with tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read(MAX_CHARS).decode("utf-8", "replace")
            lines.extend(line.strip() for line in text.splitlines() if line.strip())
