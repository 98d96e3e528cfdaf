"""What ``TORCH_LOGS="graph_breaks,recompiles"`` writes to stderr, read into tables: each graph
break with its reason and user-code location, each recompile with the guard that failed, both
with their compile id ``F/C`` (``analyses/torch_logs`` joins them to the trace's regions).

The records are read by shape, not by exact wording. Every record line carries the artifact
tag (``[__graph_breaks]``, ``[__recompiles]``) and, since torch 2.2, the compile id in
brackets; a break starts at ``Graph break`` and a recompile at ``Recompiling function``, and
later lines of the same record carry the same tag. Lines of other loggers and of warnings are
skipped; lines tagged as a record but not understood become warnings.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from pathlib import Path

import polars as pl

from tracewhy.errors import TraceError
from tracewhy.model.torch_logs import (
    BREAK_SCHEMA,
    FALLBACK_SCHEMA,
    RECOMPILE_SCHEMA,
    FallbackKind,
    LogFallbackCol,
    LogRecompileCol,
    TorchLogs,
)
from tracewhy.readers.source import os_error, read_bytes
from tracewhy.readers.torch_logs.records import (
    BREAK_START,
    LogRecord,
    break_row,
    compile_region,
    without_comment,
)

#: A log bigger than this is not a TORCH_LOGS capture of a profiled job.
MAX_LOG_BYTES = 512 * 1024**2
#: Share of undecodable bytes past which the input is binary, not a log.
MAX_BAD_BYTES_SHARE = 0.01
#: Warnings kept about lines not understood; the rest are counted.
MAX_LINE_WARNINGS = 5
#: A longer line is cut to this many characters (with a warning): the longest guard or break
#: reason in the captures here is under 2,000 characters; a 50 MB line is not a record, and
#: would otherwise travel whole into tables and JSON.
MAX_LINE_CHARS = 65_536

# torch 2.2+ (glog-style prefix from torch/_logging/_internal.py): "V1126 00:14:53.487000 32649
# site-packages/torch/_dynamo/guards.py:5396] [1/1] [__recompiles] message". The compile id may
# be absent ("[__graph_breaks]" alone) outside a compile, or carry compiled autograd ("!0/1/0").
_GLOG = re.compile(r"^[VIWEDC]\d{4} [\d:.]+\s+\d+ \S+\] (?:\[([!\d/_]+)\] )?\[__(graph_breaks|recompiles)\] ?(.*)$")
# torch 2.0/2.1 (Python logging): "[2023-05-01 10:00:00,000] torch._dynamo.symbolic_convert.
# __graph_breaks: [DEBUG] Graph break: ...".
_PYLOG = re.compile(r"^(?:\[[^\]]*\] )?torch\.\S*\.__(graph_breaks|recompiles): \[\w+\] ?(.*)$")
_RECOMPILE_START = re.compile(r"^Recompiling function (\S+) in (\S+):(\d+)")
# The guard's text runs to the end; its "  # source" tail is cut by ``without_comment``, not by
# the pattern: a lazy group before an optional "\s{2,}#" tail tried every split of a run of
# spaces (300,000 spaces took over 60 s).
_GUARD = re.compile(r"^\s*- (?:(\d+/\d+): )?(.*)$")
_TRIGGERED = "triggered by the following guard failure"
# torch/_dynamo/convert_frame.py (torch 2.6+, "cache_size_limit" before): a warning of the
# torch._dynamo logger, shown whatever TORCH_LOGS says: "[0/2] torch._dynamo hit
# config.recompile_limit (2)", then "   function: 'forward' (file.py:115)" and "   last reason:
# 0/1: n == 3  # ..." lines with the same compile id.
_LIMIT = re.compile(r"^[VIWEDC]\d{4} [\d:.]+\s+\d+ \S+\] \[([!\d/_]+)\] (.*)$")
_LIMIT_HEAD = re.compile(r"torch\._dynamo hit config\.(\w+) \((\d+)\)")
_LIMIT_FUNCTION = re.compile(r"^\s*function: '([^']+)' \(?([^)\s]+)")
_LIMIT_REASON = re.compile(r"^\s*last reason: (?:\d+/\d+: )?(.*)$")
# torch/_dynamo/symbolic_convert.py (raise_loop_graph_break, torch 2.8+): the break record's
# debug context "frame skipped: forward file.py line 104)" names the frame run eagerly instead.
_SKIPPED = re.compile(r"frame skipped: (\S+) (\S+) line (\d+)")


def read_torch_logs(path: Path) -> TorchLogs:
    """Read a TORCH_LOGS capture (plain or gzip). Binary input is a one-line TraceError; a file
    that is empty, not a regular file or not readable is read as no records, with a warning."""
    if (problem := _not_readable(path)) is not None:
        return dataclasses.replace(parse_torch_logs(""), warnings=(f"{problem}: no TORCH_LOGS records read",))
    data = read_bytes(path, MAX_LOG_BYTES)
    if b"\x00" in data[:65536]:
        raise TraceError(path, "not a TORCH_LOGS text file (binary data)")
    text = bytes(data).decode("utf-8", errors="replace")
    if text.count("\ufffd") > MAX_BAD_BYTES_SHARE * max(len(text), 1):
        raise TraceError(path, "not a TORCH_LOGS text file (not UTF-8 text)")
    return parse_torch_logs(text)


def _not_readable(path: Path) -> str | None:
    """Why ``path`` gives no log to read (empty, a pipe or device, no permission), or None. The
    file is opened non-blocking and checked with fstat: opening a FIFO with no writer, or
    reading it, would block the command. A missing file or a directory stays an error."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except PermissionError:
        return "cannot be read (permission denied)"
    except OSError as e:
        raise os_error(path, e) from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if stat.S_ISDIR(info.st_mode):
        raise TraceError(path, "is a directory with no TORCH_TRACE logs (dedicated_log_torch_trace_*.log) in "
                               "it; expected a TORCH_LOGS capture file or a TORCH_TRACE directory")
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (a pipe, socket or device)"
    if info.st_size == 0:
        return "the file is empty"
    return None


def _cut_long_lines(lines: list[str]) -> int:
    """Cut every line longer than ``MAX_LINE_CHARS`` in place; the number cut."""
    cut = 0
    for i, line in enumerate(lines):
        if len(line) > MAX_LINE_CHARS:
            lines[i] = line[:MAX_LINE_CHARS]
            cut += 1
    return cut


def _tagged(line: str) -> tuple[str, str | None, str] | None:
    """(artifact, compile id, message) of a record line, None for any other line."""
    if m := _GLOG.match(line):
        return m.group(2), m.group(1), m.group(3)
    if m := _PYLOG.match(line):
        return m.group(1), None, m.group(2)
    return None


def _records(lines: list[str]) -> tuple[list[LogRecord], list[str]]:
    """Group tagged lines into records; tagged lines before any record start are not understood."""
    records: list[LogRecord] = []
    stray: list[str] = []
    current: LogRecord | None = None
    for number, line in enumerate(lines, 1):
        tag = _tagged(line.rstrip("\r"))
        if tag is None:
            continue
        artifact, cid, message = tag
        starts = BREAK_START.match(message) if artifact == "graph_breaks" else _RECOMPILE_START.match(message)
        if starts:
            current = LogRecord(artifact, cid)
            records.append(current)
        elif current is None or current.artifact != artifact or (cid is not None and current.compile_id != cid):
            if message.strip():
                stray.append(f"line {number}: {message.strip()[:120]}")
            continue
        current.lines.append(message)
    return records, stray


def _recompile_row(r: LogRecord) -> dict[str, str | int | None]:
    head = _RECOMPILE_START.match(r.lines[0])
    assert head is not None  # a recompile record starts with its header
    guards: list[str] = []
    in_guards = False
    for line in r.lines[1:]:
        if _TRIGGERED in line:
            in_guards = True
        elif in_guards and (m := _GUARD.match(line)):
            text = without_comment(m.group(2)).strip()
            if text.startswith(("User stack trace", "File ")) or not text:
                in_guards = not text.startswith("User stack trace")
                continue
            guards.append(text)
    return {LogRecompileCol.COMPILE_ID: r.compile_id, LogRecompileCol.REGION: compile_region(r.compile_id),
            LogRecompileCol.FUNCTION: head.group(1), LogRecompileCol.LOCATION: f"{head.group(2)}:{head.group(3)}",
            LogRecompileCol.GUARD: guards[0] if guards else None, LogRecompileCol.GUARDS: len(guards)}


def _limit_rows(lines: list[str]) -> list[dict[str, str | None]]:
    """The recompile-limit warnings: the limit, the function, the last guard that failed."""
    rows: list[dict[str, str | None]] = []
    current: dict[str, str | None] | None = None
    for line in lines:
        m = _LIMIT.match(line.rstrip("\r"))
        if m is None:
            continue
        cid, message = m.group(1), m.group(2)
        if head := _LIMIT_HEAD.search(message):
            current = {LogFallbackCol.COMPILE_ID: cid, LogFallbackCol.REGION: compile_region(cid),
                       LogFallbackCol.KIND: FallbackKind.RECOMPILE_LIMIT, LogFallbackCol.FUNCTION: None,
                       LogFallbackCol.LOCATION: None,
                       LogFallbackCol.REASON: f"hit config.{head.group(1)} ({head.group(2)})"}
            rows.append(current)
        elif current is not None and current[LogFallbackCol.COMPILE_ID] == cid:
            if f := _LIMIT_FUNCTION.match(message):
                current[LogFallbackCol.FUNCTION], current[LogFallbackCol.LOCATION] = f.group(1), f.group(2)
            elif (r := _LIMIT_REASON.match(message)) and (reason := without_comment(r.group(1))):
                current[LogFallbackCol.REASON] = f"{current[LogFallbackCol.REASON]}; last guard failure: {reason}"
    return rows


def _skip_row(r: LogRecord) -> dict[str, str | None] | None:
    """A break record that says the frame was skipped: the frame and the break type behind it
    (the header line before the ``Explanation:`` that says so)."""
    for i, line in enumerate(r.lines):
        if m := _SKIPPED.search(line):
            kind = next((r.lines[j - 1].strip() for j in range(i, 0, -1)
                         if r.lines[j].strip().startswith("Explanation:") and r.lines[j - 1].strip()), None)
            return {LogFallbackCol.COMPILE_ID: r.compile_id, LogFallbackCol.REGION: compile_region(r.compile_id),
                    LogFallbackCol.KIND: FallbackKind.FRAME_SKIPPED, LogFallbackCol.FUNCTION: m.group(1),
                    LogFallbackCol.LOCATION: f"{m.group(2)}:{m.group(3)}", LogFallbackCol.REASON: kind}
    return None


def parse_torch_logs(text: str) -> TorchLogs:
    """Breaks and recompiles from the text of a TORCH_LOGS capture; never raises on content."""
    lines = text.splitlines()
    cut = _cut_long_lines(lines)
    records, stray = _records(lines)
    breaks = [break_row(r) for r in records if r.artifact == "graph_breaks"]
    recompiles = [_recompile_row(r) for r in records if r.artifact == "recompiles"]
    skips = [row for r in records if r.artifact == "graph_breaks" and (row := _skip_row(r)) is not None]
    fallbacks = skips + _limit_rows(lines)
    warnings = [f"TORCH_LOGS line not understood, {s}" for s in stray[:MAX_LINE_WARNINGS]]
    if len(stray) > MAX_LINE_WARNINGS:
        warnings.append(f"{len(stray) - MAX_LINE_WARNINGS} more TORCH_LOGS lines not understood")
    if not records and not fallbacks and lines:
        warnings.append("no graph break or recompile records: a run with neither, or a log written "
                        "without TORCH_LOGS=\"graph_breaks,recompiles\"")
    if cut:
        warnings.append(f"{cut} line{'s' if cut > 1 else ''} longer than {MAX_LINE_CHARS} characters, "
                        f"cut to {'their' if cut > 1 else 'its'} first {MAX_LINE_CHARS}")
    if lines and not text.endswith("\n") and _tagged(lines[-1]) is not None:
        warnings.append("the log ends mid-line: its last record may be cut")
    return TorchLogs(
        breaks=pl.DataFrame(breaks or None, schema=BREAK_SCHEMA, orient="row"),
        recompiles=pl.DataFrame(recompiles or None, schema=RECOMPILE_SCHEMA, orient="row"),
        fallbacks=pl.DataFrame(fallbacks or None, schema=FALLBACK_SCHEMA, orient="row"),
        warnings=tuple(warnings),
        lines=len(lines),
    )
