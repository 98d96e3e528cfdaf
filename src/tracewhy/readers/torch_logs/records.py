"""Dynamo's own record text, read the same whether it came through TORCH_LOGS (stderr) or
TORCH_TRACE (structured logs): a graph break's header, reason and user frame, a guard's text
without its ``  # source`` tail, and the compile id ``F/C`` a record names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tracewhy.model.torch_logs import LogBreakCol

_ID = re.compile(r"(?:!\d+/)?(\d+)/(\d+)")
# "(user stack suppressed due to duplicate graph break)" precedes the location on repeats.
BREAK_START = re.compile(r"^Graph break(?: \([^)]*\))?(?: in user code at (\S+):(\d+)|:? ?(.*))")
_REASON = re.compile(r"^(?:Graph Break )?Reason: ?(.*)")
_FILE_LINE = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')


@dataclass
class LogRecord:
    """One record: its artifact (``graph_breaks``, ``recompiles``), compile id and message lines."""

    artifact: str
    compile_id: str | None
    lines: list[str] = field(default_factory=list)


def without_comment(text: str) -> str:
    """``text`` up to a "  # ..." tail (two or more blanks before a '#'), in one pass: the
    first '#' with two blanks before it starts the tail, and the blanks go with it."""
    at = text.find("#")
    while at != -1:
        start = at
        while start > 0 and text[start - 1].isspace():
            start -= 1
        if at - start >= 2:
            return text[:start]
        at = text.find("#", at + 1)
    return text


def compile_region(cid: str | None) -> str | None:
    m = _ID.fullmatch(cid) if cid else None
    return f"{m.group(1)}/{m.group(2)}" if m else None


def break_row(r: LogRecord) -> dict[str, str | None]:
    head = BREAK_START.match(r.lines[0])
    location = f"{head.group(1)}:{head.group(2)}" if head and head.group(1) else None
    reason = head.group(3) if head and head.group(3) else None
    function = None
    for i, line in enumerate(r.lines[1:], 1):
        if (m := _REASON.match(line.strip())) and reason is None:
            # torch 2.6+ puts the graph-break type on the first non-empty line after the header.
            following = next((x.strip() for x in r.lines[i + 1:] if x.strip()), "")
            reason = following if following and not following.startswith(("Explanation", "User code")) else m.group(1)
        elif m := _FILE_LINE.match(line):
            function = m.group(3)
            location = location or f"{m.group(1)}:{m.group(2)}"
    if location is None:  # torch 2.0-2.5 name the user frame last in "from user code at:"
        frames = [m for x in r.lines if (m := _FILE_LINE.match(x))]
        if frames:
            location = f"{frames[-1].group(1)}:{frames[-1].group(2)}"
    return {LogBreakCol.COMPILE_ID: r.compile_id, LogBreakCol.REGION: compile_region(r.compile_id),
            LogBreakCol.FUNCTION: function, LogBreakCol.LOCATION: location, LogBreakCol.REASON: reason}
