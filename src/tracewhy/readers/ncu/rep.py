"""Nsight Compute ``.ncu-rep`` reports, through NVIDIA's ``ncu_report`` module (extra ``[ncu]``).

``ncu_report`` (PyPI ``ncu-report``; import name ``ncu_report``) opens reports without a GPU,
but it loads a truncated or foreign file silently, as a report with fewer (or no) launches.
So the file's framing is walked here first: ``NVR\\0``, a length-prefixed ``FileHeader``, then
blocks of a length-prefixed ``BlockHeader`` followed by ``PayloadSize`` bytes of
length-prefixed messages (the layout of the ``.proto`` files ncu ships in
``extras/FileFormat``; true of every report here, ncu 2020.3 to 2024.3). The walk also yields
what the Python module does not expose: the ncu version, the profiler command line, and each
launch's ``ClockStatus`` (whether ncu locked the clocks while profiling it).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from tracewhy.errors import TraceError, install_hint
from tracewhy.model.ncu import NcuCol, NcuReport, RuleCol
from tracewhy.readers.native_stderr import captured_fd2
from tracewhy.readers.ncu import units as u
from tracewhy.readers.ncu.common import (
    BREAKDOWN_PATTERNS,
    FIELDS,
    LaunchRecord,
    Problems,
    build_report,
    plain_rule_text,
)
from tracewhy.readers.ncu.sniff import MAGIC

INSTALL_HINT: Final = (
    f"reading .ncu-rep needs NVIDIA's ncu_report module: {install_hint('ncu')} "
    "(or pip install ncu-report); or export CSV instead with: "
    "ncu --import {path} --csv --page details > {stem}.csv"
)
#: BlockHeader fields (FileFormat/ProfilerReport.proto).
_NUM_SOURCES, _NUM_RESULTS, _SESSION, _PAYLOAD_SIZE = 1, 2, 3, 5
_NUM_RANGE_RESULTS, _NUM_CMDLIST_RESULTS, _NUM_GRAPH_RESULTS = 7, 8, 9
#: ReportSessionDetails fields: VersionInfo (repeated), ProfilerCmdline.
_VERSION_INFO, _CMDLINE = 8, 11
#: ProfileResult.ClockStatus, and ProfilerClockStatusMessage.ExecutedLocked.
_CLOCK_STATUS, _EXECUTED_LOCKED = 25, 2
#: Refuse absurd lengths rather than allocating them (a corrupt length prefix).
_MAX_MESSAGE: Final = 1 << 31


@dataclass
class Framing:
    """What the file's own framing says, independent of ncu_report."""

    version: str | None = None
    cmdline: str | None = None
    clocks_locked: list[bool | None] = field(default_factory=list)  # per kernel result, in order
    results: int = 0


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("varint runs past the end of its message")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i
        if shift > 63:
            raise ValueError("varint longer than 64 bits")


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """Top-level (field number, value) pairs of one protobuf message."""
    out: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            out.append((number, value))
        elif wire == 2:
            size, i = _varint(buf, i)
            if i + size > len(buf):
                raise ValueError("length-delimited field runs past the end of its message")
            out.append((number, buf[i : i + size]))
            i += size
        elif wire == 5:
            out.append((number, buf[i : i + 4]))
            i += 4
        elif wire == 1:
            out.append((number, buf[i : i + 8]))
            i += 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return out


def _read_exact(f: IO[bytes], n: int, what: str) -> bytes:
    # A damaged length can claim far more than the file holds: compare before allocating it.
    here = f.tell()
    left = f.seek(0, os.SEEK_END) - here
    f.seek(here)
    if n > left:
        raise EOFError(f"file ends inside {what} ({left} of {n} bytes)")
    data = f.read(n)
    if len(data) != n:
        raise EOFError(f"file ends inside {what} ({len(data)} of {n} bytes)")
    return data


def _message(f: IO[bytes], what: str) -> bytes | None:
    prefix = f.read(4)
    if not prefix:
        return None
    if len(prefix) < 4:
        raise EOFError(f"file ends inside the length of {what}")
    (size,) = struct.unpack("<I", prefix)
    if size > _MAX_MESSAGE:
        raise ValueError(f"{what} claims {size} bytes")
    return _read_exact(f, size, what)


def _session(details: bytes, framing: Framing) -> None:
    for number, value in _fields(details):
        if number == _CMDLINE and isinstance(value, bytes):
            framing.cmdline = value.decode("utf-8", "replace")
        elif number == _VERSION_INFO and isinstance(value, bytes):
            info = dict(_fields(value))
            provider, version = info.get(1), info.get(2)
            if isinstance(provider, bytes) and isinstance(version, bytes) and b"Compute" in provider:
                framing.version = version.decode("utf-8", "replace")


def scan_framing(path: Path) -> Framing:
    """Walk the report's blocks; raise TraceError naming the problem if the file is cut or foreign."""
    framing = Framing()
    try:
        with open(path, "rb") as f:
            if f.read(4) != MAGIC:
                raise TraceError(path, "not an Nsight Compute report (.ncu-rep files start with 'NVR')")
            if _message(f, "the file header") is None:
                raise EOFError("file ends after its first 4 bytes")
            block = 0
            while (header := _message(f, f"block {block} header")) is not None:
                fields = dict(_fields(header))
                session = fields.get(_SESSION)
                if isinstance(session, bytes):
                    _session(session, framing)
                counts = [_int(fields, k) for k in (_NUM_SOURCES, _NUM_RESULTS, _NUM_RANGE_RESULTS,
                                                    _NUM_CMDLIST_RESULTS, _NUM_GRAPH_RESULTS)]
                sources, results = counts[0], counts[1]
                payload = _int(fields, _PAYLOAD_SIZE)
                used = 0
                for k in range(sum(counts)):
                    msg = _message(f, f"block {block} payload")
                    if msg is None:
                        raise EOFError(f"file ends inside block {block} payload")
                    used += 4 + len(msg)
                    if sources <= k < sources + results:
                        framing.results += 1
                        framing.clocks_locked.append(_clock_locked(msg))
                if used != payload:
                    raise ValueError(f"block {block} payload is {used} bytes, its header says {payload}")
                block += 1
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a directory, expected an .ncu-rep file") from None
    except PermissionError:
        raise TraceError(path, "permission denied") from None
    except EOFError as e:
        raise TraceError(path, f"truncated Nsight Compute report: {e}") from None
    except (ValueError, struct.error) as e:
        raise TraceError(path, f"corrupt Nsight Compute report: {e}") from None
    return framing


def _int(fields: dict[int, int | bytes], number: int) -> int:
    value = fields.get(number, 0)
    return value if isinstance(value, int) else 0


def _clock_locked(result: bytes) -> bool | None:
    for number, value in _fields(result):
        if number == _CLOCK_STATUS and isinstance(value, bytes):
            status = dict(_fields(value))
            locked = status.get(_EXECUTED_LOCKED)
            return None if locked is None else bool(locked)
    return None


def load_module(path: Path) -> Any:
    """NVIDIA's ncu_report module, or a TraceError saying how to install it or export CSV."""
    try:
        return importlib.import_module("ncu_report")
    except ImportError:
        raise TraceError(path, INSTALL_HINT.format(path=path.name, stem=path.stem)) from None


_WANTED: Final = frozenset(m for spec in FIELDS for m in spec.metrics) | {
    "launch__grid_dim_x", "launch__grid_dim_y", "launch__grid_dim_z",
    "launch__block_dim_x", "launch__block_dim_y", "launch__block_dim_z",
    "launch__device_id", "launch__stream_id", "launch__context_id",
    "device__attribute_display_name", "device__attribute_compute_capability_major",
    "device__attribute_compute_capability_minor",
}
_IDENTITY_METRICS: Final = {
    "launch__grid_dim_x": NcuCol.GRID_X, "launch__grid_dim_y": NcuCol.GRID_Y,
    "launch__grid_dim_z": NcuCol.GRID_Z, "launch__block_dim_x": NcuCol.BLOCK_X,
    "launch__block_dim_y": NcuCol.BLOCK_Y, "launch__block_dim_z": NcuCol.BLOCK_Z,
    "launch__device_id": NcuCol.DEVICE, "launch__stream_id": NcuCol.STREAM,
    "launch__context_id": NcuCol.CONTEXT,
}
_BREAKDOWN_ANY: Final = re.compile("|".join(p.pattern for _, p in BREAKDOWN_PATTERNS))


_SURROGATES: Final = "strings with lone UTF-16 surrogates, shown with U+FFFD"


def _clean(value: object, problems: Problems, where: str) -> str:
    """A string from ncu_report that can be printed and written as UTF-8.

    ncu_report hands over whatever bytes a rule script or a kernel name held; one carrying a
    lone surrogate (half of a UTF-16 pair) made every output fail with UnicodeEncodeError.
    """
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        problems.add(_SURROGATES, where, "string")
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _metric_value(module: Any, rec: LaunchRecord, name: str, metric: Any,
                  problems: Problems) -> tuple[float | str, str] | None:
    if metric is None or not metric.has_value():
        return None
    if metric.kind() == module.IMetric.ValueKind_STRING:
        return _clean(metric.as_string(), problems, rec.where), "text"
    value = float(metric.as_double())
    if math.isnan(value):
        return None
    unit = _clean(metric.unit() or "", problems, rec.where)
    got = u.normalize(value, unit)
    if got[1] == u.UNKNOWN:
        rec.units[name] = unit
    return got


def _severities(module: Any) -> dict[int, str]:
    names = {"MsgType_OPTIMIZATION": "optimization", "MsgType_WARNING": "warning",
             "MsgType_ERR": "error", "MsgType_OK": "ok", "MsgType_NONE": "none"}
    return {int(getattr(module, k)): v for k, v in names.items() if hasattr(module, k)}


def _speedup_types(module: Any) -> dict[int, str]:
    names = {"SpeedupType_LOCAL": "local", "SpeedupType_GLOBAL": "global"}
    return {int(getattr(module, k)): v for k, v in names.items() if hasattr(module, k)}


def _rules(action: Any, severities: dict[int, str], speedups: dict[int, str], problems: Problems,
           where: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for d in action.rule_results_as_dicts():
        msg = d.get("rule_message") or {}
        title = plain_rule_text(_clean(msg.get("title") or "", problems, where))
        text = plain_rule_text(_clean(msg.get("message") or "", problems, where))
        if not title and not text:
            continue  # ncu stores empty placeholder results for rules that found nothing
        est = d.get("speedup_estimation") or {}
        speedup = est.get("speedup")
        out.append({
            RuleCol.RULE: _clean(d.get("rule_identifier") or "unnamed", problems, where),
            RuleCol.SECTION: None if d.get("section_identifier") is None
            else _clean(d.get("section_identifier"), problems, where),
            RuleCol.TITLE: title or None,
            RuleCol.MESSAGE: text,
            RuleCol.SEVERITY: severities.get(int(msg.get("type", -1)), "none"),
            RuleCol.SPEEDUP_TYPE: speedups.get(int(est.get("type", -1))),
            RuleCol.SPEEDUP_PCT: float(speedup) if isinstance(speedup, (int, float)) else None,
        })
    return out


def _record(module: Any, action: Any, launch_id: int, rule_maps: tuple[dict[int, str], dict[int, str]],
            problems: Problems) -> LaunchRecord:
    names = set(action.metric_names())
    wanted = sorted(n for n in names if n in _WANTED or _BREAKDOWN_ANY.match(n))
    where = f"launch {launch_id}"
    rec = LaunchRecord(launch_id, _clean(action.name(), problems, where), where=where)
    with contextlib.suppress(AttributeError, TypeError):  # ncu_report before 2023 has one name
        rec.identity[NcuCol.DEMANGLED] = _clean(action.name(module.IAction.NameBase_DEMANGLED), problems, where)
    for name in wanted:
        got = _metric_value(module, rec, name, action.metric_by_name(name), problems)
        if got is not None:
            rec.metrics[name] = got
    for metric, column in _IDENTITY_METRICS.items():
        value = rec.metrics.pop(metric, None)
        if value is not None and isinstance(value[0], float):
            rec.identity[column] = value[0]  # build_report refuses inf and values beyond int64
    display = rec.metrics.pop("device__attribute_display_name", None)
    if display is not None:
        rec.identity[NcuCol.DEVICE_NAME] = str(display[0])
    major = rec.metrics.pop("device__attribute_compute_capability_major", None)
    minor = rec.metrics.pop("device__attribute_compute_capability_minor", None)
    if major is not None and minor is not None:
        with contextlib.suppress(ValueError, OverflowError):  # inf, or text where a number belongs
            rec.identity[NcuCol.CC] = f"{int(float(major[0]))}.{int(float(minor[0]))}"
    try:
        rec.rules = _rules(action, *rule_maps, problems, where)
    except Exception as e:  # ncu_report raises its own types on rule data it cannot decode
        problems.add(f"rule results unreadable ({type(e).__name__})", where, "launch")
    return rec


#: The line abseil prints before the first log message of a process: not a problem with the file.
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog()"


def read_ncu_rep(path: str | Path) -> NcuReport:
    """Read every kernel launch of an ``.ncu-rep`` file (all ranges, in file order)."""
    path = Path(path)
    framing = scan_framing(path)
    module = load_module(path)
    # ncu_report's protobuf layer logs a damaged message to fd 2 itself: kept, said as a warning.
    with captured_fd2() as native:
        try:
            context = module.load_report(str(path))
        except Exception as e:  # the module's loader raises bare RuntimeErrors
            raise TraceError(path, f"ncu_report could not open it: {' '.join(str(e).split())[:200]}") from None
        actions = [context.range_by_idx(r).action_by_idx(a)
                   for r in range(context.num_ranges())
                   for a in range(context.range_by_idx(r).num_actions())]
    native = [line for line in native if not line.startswith(_ABSL_PREAMBLE)]
    if not actions:
        said = f" (ncu_report: {native[0][:200]})" if native else ""
        raise TraceError(path, f"report contains no profiled kernel launches{said}")
    notes: list[str] = []
    if native:
        notes.append(f"ncu_report's parser reported {len(native)} problem line(s) reading the file, such as "
                     f"{native[0][:200]!r}: some results may be missing")
    if framing.results != len(actions):
        notes.append(f"file frames {framing.results} kernel results, ncu_report shows {len(actions)}; "
                     "clock-lock status not attributed")
    rule_maps = (_severities(module), _speedup_types(module))
    problems = Problems()
    records = []
    for i, action in enumerate(actions):
        rec = _record(module, action, i, rule_maps, problems)
        if framing.results == len(actions):
            rec.identity[NcuCol.CLOCKS_LOCKED] = framing.clocks_locked[i]
        records.append(rec)
    return build_report(path, "ncu-rep", records, tool_version=framing.version,
                        profiler_cmdline=framing.cmdline, warnings=tuple(notes), problems=problems)
