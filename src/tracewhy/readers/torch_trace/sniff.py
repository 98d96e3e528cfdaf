"""Telling a TORCH_TRACE log by its content: a directory that holds torch's
``dedicated_log_torch_trace_*.log`` files, or a file whose first line is a glog prefix followed
by a JSON envelope."""

from __future__ import annotations

import os
from itertools import islice
from pathlib import Path

from tracewhy.readers.source import content_head

_HEAD_BYTES = 4096
#: Directory entries looked at for a log before the directory is taken as not one.
_MAX_ENTRIES = 100_000
#: The name torch gives each log (torch/_logging/_internal.py, LOG_PREFIX).
LOG_PREFIX = "dedicated_log_torch_trace_"


def is_torch_trace(path: Path) -> bool:
    """A directory with a TORCH_TRACE log in it, or a file whose first non-blank line is
    ``V1128 20:02:23.480000 30360 torch/...py:303] {"...`` (a TORCH_LOGS capture's lines carry
    ``[0/0] [__graph_breaks]`` after the prefix instead)."""
    if path.is_dir():
        try:
            with os.scandir(path) as entries:
                return any(e.name.startswith(LOG_PREFIX) for e in islice(entries, _MAX_ENTRIES))
        except OSError:
            return False
    if not path.is_file():  # a pipe or device: opening one to read would block until a writer comes
        return False
    head = content_head(path, _HEAD_BYTES)
    if not head:
        return False
    first = head.lstrip(b"\r\n").split(b"\n", 1)[0]
    return first[:1] in (b"V", b"I", b"W", b"E", b"D", b"C") and b'] {"' in first[:512]
