"""A ``TORCH_TRACE`` directory (one ``dedicated_log_torch_trace[_rank_N]_*.log`` per process,
plain or gzip) or one such file, read into ``model/torch_logs``' tables: every compile id with
its frame, attempts, graphs, phase times and cache results, the graph breaks with their reasons
and user frames, the recompiles with the guard that failed, and per rank what it compiled and
how that differs from the other ranks.

Everything is taken from the entries' structure, never from log wording: the compile id is the
envelope's ``frame_id``/``frame_compile_id`` (``compiled_autograd_id`` first when set), the rank
its ``rank``; a graph is a ``dynamo_output_graph`` entry, a break a ``dynamo_graph_break_reason``
artifact, a cache result a ``fx_graph_cache_*``/``aotautograd_cache_*`` artifact, times and the
recompile reason the ``compilation_metrics`` entry (torch 2.5+ writes ``*_us`` fields, earlier
ones ``*_time_s``). Only a break's own payload text is parsed, by the TORCH_LOGS reader's rules
(it is the same text).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import polars as pl

from tracewhy.errors import TraceError
from tracewhy.model.torch_logs import (
    BREAK_SCHEMA,
    COMPILE_SCHEMA,
    FALLBACK_SCHEMA,
    RANK_SCHEMA,
    RECOMPILE_SCHEMA,
    LogCompileCol,
    LogRankCol,
    LogRecompileCol,
    TorchLogs,
)
from tracewhy.readers.limits import INT64_MAX
from tracewhy.readers.source import os_error
from tracewhy.readers.torch_logs.reader import MAX_LINE_CHARS
from tracewhy.readers.torch_logs.records import LogRecord, break_row, without_comment
from tracewhy.readers.torch_trace.lines import LineCounts, iter_torch_trace
from tracewhy.readers.torch_trace.sniff import LOG_PREFIX

#: More rank logs than this in one directory is not one job's TORCH_TRACE output.
MAX_LOG_FILES: Final = 65_536
#: Warnings kept per kind; the rest are counted.
MAX_WARNINGS: Final = 8
#: The cache results an artifact name ends with.
_CACHE_STATES: Final = ("hit", "miss", "bypass")
_CACHES: Final = {"fx_graph_cache_": LogCompileCol.FX_GRAPH_CACHE,
                  "aotautograd_cache_": LogCompileCol.AOT_AUTOGRAD_CACHE}
# A recompile reason's guard line: "1/0: ___stack2 == 0.88   # source  # file:line in fn"
# (torch 2.6+), "- 0/0: guard" in older logs; the compile id the guard failed in is dropped.
_GUARD_ID = re.compile(r"(?:- )?(?:\d+/\d+: )?")
#: No compile in a log takes longer than this; a larger value is not a duration.
_MAX_DURATION_S: Final = 1e7


@dataclass
class _Compile:
    key: tuple[int, int, int | None]  # frame id, frame compile id, compiled autograd id
    attempts: int = 0
    graphs: int = 0
    breaks: int = 0
    function: str | None = None
    location: str | None = None
    times: dict[str, int | None] = field(default_factory=dict)
    backward_ns: int | None = None
    caches: dict[str, list[str]] = field(default_factory=dict)
    recompile_reason: str | None = None
    failure: str | None = None

    @property
    def compile_id(self) -> str:
        frame, compile_, autograd = self.key
        return f"{'' if autograd is None else f'!{autograd}/'}{frame}/{compile_}"

    @property
    def region(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"


@dataclass
class _RankLog:
    path: Path
    rank: int | None = None
    other_ranks: set[int] = field(default_factory=set)
    compiles: dict[tuple[int, int, int | None], _Compile] = field(default_factory=dict)
    breaks: list[dict[str, str | None]] = field(default_factory=list)
    strings: dict[int, str] = field(default_factory=dict)
    counts: LineCounts = field(default_factory=LineCounts)


def read_torch_trace(path: Path) -> TorchLogs:
    """Read a TORCH_TRACE directory (or one of its log files). A directory without such logs, or
    a file that cannot be read, is a one-line TraceError; lines not understood are warnings."""
    files = _log_files(path)
    logs = [_read_one(f) for f in files]
    logs.sort(key=lambda r: (r.rank is not None, r.rank or 0, r.path.name))
    warnings = _warnings(logs)
    reference = min((r for r in logs if r.rank is not None), key=lambda r: r.rank or 0, default=logs[0])
    compiles = [_compile_row(r.rank, c) for r in logs for c in r.compiles.values()]
    ranks = _rank_rows(logs)
    if not any(r.compiles for r in logs):
        warnings.append("no compile in these logs: TORCH_TRACE was set, but torch.compile compiled nothing")
    tables = {r.rank: _rank_tables(r) for r in logs if r.rank is not None}
    breaks, recompiles = _rank_tables(reference)
    return TorchLogs(
        breaks=breaks,
        recompiles=recompiles,
        fallbacks=pl.DataFrame(None, schema=FALLBACK_SCHEMA),
        warnings=tuple(warnings),
        lines=sum(r.counts.lines for r in logs),
        compiles=pl.DataFrame(compiles or None, schema=COMPILE_SCHEMA, orient="row"),
        ranks=pl.DataFrame(ranks or None, schema=RANK_SCHEMA, orient="row"),
        rank=reference.rank,
        rank_tables=tables,
    )


def _rank_tables(log: _RankLog) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A rank's breaks and recompiles, as the TORCH_LOGS reader makes them."""
    return (pl.DataFrame(log.breaks or None, schema=BREAK_SCHEMA, orient="row"),
            pl.DataFrame(_recompile_rows(log) or None, schema=RECOMPILE_SCHEMA, orient="row"))


def is_log_name(name: str) -> bool:
    return name.startswith(LOG_PREFIX) and name.endswith((".log", ".log.gz"))


def _log_files(path: Path) -> list[Path]:
    if not path.is_dir():
        if not path.exists():
            raise TraceError(path, "no such file or directory")
        return [path]
    try:
        names = []
        for entry in path.iterdir():
            if is_log_name(entry.name) and entry.is_file():
                names.append(entry)
                if len(names) > MAX_LOG_FILES:
                    raise TraceError(path, f"more than {MAX_LOG_FILES} TORCH_TRACE logs in one directory: refusing")
    except OSError as e:
        raise os_error(path, e) from None
    if not names:
        raise TraceError(path, f"no TORCH_TRACE logs ({LOG_PREFIX}*.log) in this directory: give the "
                               "directory TORCH_TRACE named, or a TORCH_LOGS capture file")
    return sorted(names)


def _read_one(path: Path) -> _RankLog:
    log = _RankLog(path)
    for envelope, payload in iter_torch_trace(path, log.counts):
        _take(log, envelope, payload)
    return log


def _take(log: _RankLog, envelope: dict[str, Any], payload: str) -> None:
    """Record what one entry says in ``log``."""
    if (interned := envelope.get("str")) is not None:
        if isinstance(interned, list) and len(interned) == 2 and isinstance(interned[0], str) \
                and _count(interned[1]) is not None:
            log.strings[interned[1]] = interned[0][:MAX_LINE_CHARS]
        return
    rank = _count(envelope.get("rank"))
    if rank is not None:
        if log.rank is None:
            log.rank = rank
        elif rank != log.rank:
            log.other_ranks.add(rank)
    c = _compile_of(log, envelope)
    if c is None:
        return
    if (attempt := _count(envelope.get("attempt"))) is not None:
        c.attempts = max(c.attempts, attempt + 1)
    if isinstance(start := envelope.get("dynamo_start"), dict):
        _frame_from_stack(log, c, start.get("stack"))
    elif "dynamo_output_graph" in envelope:
        c.graphs += 1
    elif isinstance(metrics := envelope.get("compilation_metrics"), dict):
        _take_metrics(c, metrics)
    elif isinstance(metrics := envelope.get("bwd_compilation_metrics"), dict):
        ns = _duration_ns(metrics, "duration_us", "inductor_compile_time_s")
        if ns is not None:
            c.backward_ns = (c.backward_ns or 0) + ns
    elif isinstance(artifact := envelope.get("artifact"), dict) and isinstance(name := artifact.get("name"), str):
        _take_artifact(log, c, name, payload)


def _take_artifact(log: _RankLog, c: _Compile, name: str, payload: str) -> None:
    if name == "dynamo_graph_break_reason":
        c.breaks += 1
        # The payload is the TORCH_LOGS record, then Dynamo's own traceback: only the first is
        # about user code.
        user_part = payload.split("\nTraceback (most recent call last):", 1)[0]
        lines = [line[:MAX_LINE_CHARS] for line in user_part.split("\n")]
        if lines and lines[0].startswith("Graph break"):
            log.breaks.append(break_row(LogRecord("graph_breaks", c.compile_id, lines)))
        return
    if name == "recompile_reasons" and c.recompile_reason is None and payload:
        c.recompile_reason = payload[:MAX_LINE_CHARS]
        return
    for prefix, column in _CACHES.items():
        state = name.removeprefix(prefix)
        if state != name and state in _CACHE_STATES:
            c.caches.setdefault(column, []).append(state)


def _take_metrics(c: _Compile, m: dict[str, Any]) -> None:
    """A compile's ``compilation_metrics``: the frame, the phases' times (each phase's own:
    Dynamo's time holds AOT autograd's, which holds Inductor's), the recompile reason, a failure."""
    if isinstance(name := m.get("co_name"), str):
        c.function = name[:MAX_LINE_CHARS]
    line = _count(m.get("co_firstlineno"))
    if isinstance(file := m.get("co_filename"), str) and line is not None:
        c.location = f"{file[:MAX_LINE_CHARS]}:{line}"
    total = _duration_ns(m, "dynamo_cumulative_compile_time_us", "entire_frame_compile_time_s")
    backend = _duration_ns(m, "aot_autograd_cumulative_compile_time_us", "backend_compile_time_s")
    inductor = _duration_ns(m, "inductor_cumulative_compile_time_us", "inductor_compile_time_s")
    c.times = {LogCompileCol.COMPILE_NS: total, LogCompileCol.INDUCTOR_NS: inductor,
               LogCompileCol.DYNAMO_NS: _minus(total, backend),
               LogCompileCol.AOT_AUTOGRAD_NS: _minus(backend, inductor)}
    if isinstance(reason := m.get("recompile_reason"), str) and reason:
        c.recompile_reason = reason[:MAX_LINE_CHARS]
    fail_type, fail_reason = m.get("fail_type"), m.get("fail_reason")
    if isinstance(fail_type, str) and fail_type:
        c.failure = f"{fail_type}: {fail_reason}"[:MAX_LINE_CHARS] if isinstance(fail_reason, str) else fail_type


def _compile_of(log: _RankLog, envelope: dict[str, Any]) -> _Compile | None:
    frame, compile_ = _count(envelope.get("frame_id")), _count(envelope.get("frame_compile_id"))
    if frame is None or compile_ is None:
        return None
    key = (frame, compile_, _count(envelope.get("compiled_autograd_id")))
    if key not in log.compiles:
        log.compiles[key] = _Compile(key)
    return log.compiles[key]


def _frame_from_stack(log: _RankLog, c: _Compile, stack: object) -> None:
    """The compiled frame from ``dynamo_start``'s stack (its last frame), until the metrics say."""
    if not isinstance(stack, list) or not stack or not isinstance(top := stack[-1], dict):
        return
    file, line = log.strings.get(_count(top.get("filename")) or -1), _count(top.get("line"))
    if c.function is None and isinstance(name := top.get("name"), str):
        c.function = name[:MAX_LINE_CHARS]
    if c.location is None and file is not None and line is not None:
        c.location = f"{file}:{line}"


def _count(value: object) -> int | None:
    """A non-negative integer from the log, or None (JSON gives any type, any size)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX else None


def _duration_ns(m: dict[str, Any], us_key: str, s_key: str) -> int | None:
    """A duration from ``us_key`` (microseconds) or, in older logs, ``s_key`` (seconds)."""
    for key, seconds_per_unit in ((us_key, 1e-6), (s_key, 1.0)):
        value = m.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
                and 0 <= value * seconds_per_unit <= _MAX_DURATION_S:
            return round(value * seconds_per_unit * 1e9)
    return None


def _minus(a: int | None, b: int | None) -> int | None:
    return None if a is None else a - (b or 0) if b is None or b <= a else None


def _guards(reason: str) -> list[str]:
    """The failed guards of a recompile reason (the lines before its user stack)."""
    guards = []
    for line in reason.split("\n"):
        if line.startswith("User stack trace") or line.startswith(" "):
            break
        text = without_comment(line[_GUARD_ID.match(line).end():]).strip()  # type: ignore[union-attr]
        if text:
            guards.append(text)
    return guards


def _compile_row(rank: int | None, c: _Compile) -> dict[str, Any]:
    guards = _guards(c.recompile_reason) if c.recompile_reason else []
    return {LogCompileCol.RANK: rank, LogCompileCol.COMPILE_ID: c.compile_id, LogCompileCol.REGION: c.region,
            LogCompileCol.ATTEMPTS: c.attempts, LogCompileCol.FUNCTION: c.function,
            LogCompileCol.LOCATION: c.location, LogCompileCol.GRAPHS: c.graphs, LogCompileCol.GRAPH_BREAKS: c.breaks,
            LogCompileCol.COMPILE_NS: c.times.get(LogCompileCol.COMPILE_NS),
            LogCompileCol.DYNAMO_NS: c.times.get(LogCompileCol.DYNAMO_NS),
            LogCompileCol.AOT_AUTOGRAD_NS: c.times.get(LogCompileCol.AOT_AUTOGRAD_NS),
            LogCompileCol.INDUCTOR_NS: c.times.get(LogCompileCol.INDUCTOR_NS), LogCompileCol.BACKWARD_NS: c.backward_ns,
            LogCompileCol.FX_GRAPH_CACHE: ", ".join(c.caches.get(LogCompileCol.FX_GRAPH_CACHE, [])) or None,
            LogCompileCol.AOT_AUTOGRAD_CACHE: ", ".join(c.caches.get(LogCompileCol.AOT_AUTOGRAD_CACHE, [])) or None,
            LogCompileCol.RECOMPILE_GUARD: guards[0] if guards else None, LogCompileCol.FAILURE: c.failure}


def _recompile_rows(log: _RankLog) -> list[dict[str, Any]]:
    rows = []
    for c in log.compiles.values():
        if c.recompile_reason:
            guards = _guards(c.recompile_reason)
            rows.append({LogRecompileCol.COMPILE_ID: c.compile_id, LogRecompileCol.REGION: c.region,
                         LogRecompileCol.FUNCTION: c.function, LogRecompileCol.LOCATION: c.location,
                         LogRecompileCol.GUARD: guards[0] if guards else None, LogRecompileCol.GUARDS: len(guards)})
    return rows


def _signature(log: _RankLog) -> tuple[tuple[str, ...], int, tuple[str, ...], int]:
    """What must agree across ranks: the compile ids that made a graph, the graphs, the break
    locations, the recompiles (times and cache results may differ)."""
    compiled = tuple(sorted(c.compile_id for c in log.compiles.values() if c.graphs))
    breaks = tuple(sorted(str(b.get("location")) for b in log.breaks))
    return compiled, sum(c.graphs for c in log.compiles.values()), breaks, \
        sum(1 for c in log.compiles.values() if c.recompile_reason)


def _rank_rows(logs: list[_RankLog]) -> list[dict[str, Any]]:
    signatures = [_signature(r) for r in logs]
    # A log with no rank beside ranked ones is another process (a launcher, a worker that never
    # joined the group): it is listed, not compared.
    compared = [r.rank is not None for r in logs] if any(r.rank is not None for r in logs) else [True] * len(logs)
    common = Counter(s for s, c in zip(signatures, compared, strict=True) if c).most_common()
    # The signature most ranks share; on a tie, the one of the first rank that has a tied one.
    top = [s for s, n in common if n == common[0][1]]
    reference = next(s for s, c in zip(signatures, compared, strict=True) if c and s in top)
    ref_ranks = [str(r.rank) for r, s, c in zip(logs, signatures, compared, strict=True) if c and s == reference]
    rows = []
    for log, sig, c in zip(logs, signatures, compared, strict=True):
        ns = [v for c in log.compiles.values() for v in (c.times.get(LogCompileCol.COMPILE_NS), c.backward_ns)
              if v is not None]
        rows.append({LogRankCol.RANK: log.rank, LogRankCol.COMPILES: len(log.compiles), LogRankCol.GRAPHS: sig[1],
                     LogRankCol.GRAPH_BREAKS: len(log.breaks), LogRankCol.RECOMPILES: sig[3],
                     LogRankCol.COMPILE_NS: sum(ns) if ns else None,
                     LogRankCol.DIFFERS: None if sig == reference or not c else _difference(sig, reference, ref_ranks)})
    return rows


def _difference(sig: tuple[tuple[str, ...], int, tuple[str, ...], int],
                ref: tuple[tuple[str, ...], int, tuple[str, ...], int], ref_ranks: list[str]) -> str:
    who = f"rank{'s' if len(ref_ranks) > 1 else ''} {', '.join(ref_ranks[:4])}{', ...' if len(ref_ranks) > 4 else ''}"
    parts = []
    if extra := [c for c in sig[0] if c not in ref[0]]:
        parts.append(f"compiles {', '.join(extra[:6])} that {who} do{'es' if len(ref_ranks) == 1 else ''} not")
    if missing := [c for c in ref[0] if c not in sig[0]]:
        parts.append(f"lacks {', '.join(missing[:6])}")
    if sig[1] != ref[1]:
        parts.append(f"{_n(sig[1], 'graph')} ({who}: {ref[1]})")
    if sig[2] != ref[2]:
        where = f" at {', '.join(dict.fromkeys(sig[2]))}" if sig[2] else ""
        parts.append(f"{_n(len(sig[2]), 'graph break')}{where} ({who}: {len(ref[2])})")
    if sig[3] != ref[3]:
        parts.append(f"{_n(sig[3], 'recompile')} ({who}: {ref[3]})")
    return "; ".join(parts)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _warnings(logs: list[_RankLog]) -> list[str]:
    out: list[str] = []
    for log in logs:
        out += [f"{log.path.name}: {w}" for w in log.counts.warnings()]
        if log.other_ranks:
            out.append(f"{log.path.name}: entries of rank{'s' if len(log.other_ranks) > 1 else ''} "
                       f"{', '.join(map(str, sorted(log.other_ranks)[:4]))} in the log of rank {log.rank}")
        if not log.counts.entries:
            out.append(f"{log.path.name}: no TORCH_TRACE entries (an empty log, or not a TORCH_TRACE log)")
    seen = Counter(r.rank for r in logs if r.rank is not None)
    out += [f"{n} logs of rank {rank}: several runs in one directory?" for rank, n in sorted(seen.items()) if n > 1]
    if len(out) > MAX_WARNINGS:
        out = [*out[:MAX_WARNINGS], f"{len(out) - MAX_WARNINGS} more warnings about these logs"]
    return out
