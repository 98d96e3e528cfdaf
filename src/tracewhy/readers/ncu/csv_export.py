"""Nsight Compute CSV exports: the details page (long) and the raw page (wide).

What real exports look like (all handled here, by header name, never by column position):

- A UTF-8 BOM, then ``==PROF==`` lines and the program's own stdout before the table (and
  ``==PROF== Disconnected`` after it): ``ncu --csv`` writes everything to one stream.
- Details page: one row per (launch, metric) with ``Section Name, Metric Name, Metric Unit,
  Metric Value``; since ncu 2023 also rule rows with ``Rule Name, Rule Type, Rule
  Description, Estimated Speedup Type, Estimated Speedup``, and the metric rows then stop
  after ``Metric Value`` (16 fields under a 20-field header, seen in 2025.x output).
- Raw page: one row per launch, one column per metric name, units in the second row.
- Identity columns changed: ncu <= 2022 had ``Kernel Time`` (a timestamp) after ``Kernel
  Name``; 2023+ have ``Block Size, Grid Size, Device, CC`` instead.
- Values auto-scaled per row (``usecond``, ``Gbyte/second``) and printed in the host locale
  (``"134,221,568"``).
- Several exports in one file (``ncu --csv ... >> all.csv``): each header block is its own
  run, numbered from ID 0 again; they are kept apart as runs (``NcuRun``), never merged.

Hostile cells become warnings, never crashes: "nan", "-nan" (C's printf for a NaN
with its sign bit set), "inf" or 20-digit integers in ID / Process ID / Stream, negative
durations, units the reader does not know.
"""

from __future__ import annotations

import contextlib
import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from tracewhy.errors import TraceError
from tracewhy.model.ncu import NcuCol, NcuReport, NcuRun, RuleCol
from tracewhy.readers.ncu import units as u
from tracewhy.readers.ncu.common import (
    LaunchRecord,
    Problems,
    build_report,
    parse_dim3,
    plain_rule_text,
)
from tracewhy.readers.ncu.sniff import is_header_line
from tracewhy.readers.source import read_bytes

#: Columns that describe the launch rather than a metric (matched case-insensitively).
_IDENTITY: Final = frozenset(
    c.lower()
    for c in (
        "ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time",
        "Context", "Stream", "Block Size", "Grid Size", "Device", "CC", "Section Name",
        "Metric Name", "Metric Unit", "Metric Value", "Rule Name", "Rule Type",
        "Rule Description", "Estimated Speedup Type", "Estimated Speedup", "Function Name",
        "Demangled Name", "Mangled Name",
    )
)
#: ncu's rule type column: OPT(imization), WRN, INF(o), ERR; full words in some versions.
_SEVERITY: Final = {
    "opt": "optimization", "optimization": "optimization", "wrn": "warning", "warning": "warning",
    "inf": "info", "info": "info", "err": "error", "error": "error", "ok": "ok",
}
#: Lines ncu writes around the table on the same stream.
_NOISE_PREFIXES: Final = ("==PROF==", "==WARNING==", "==ERROR==", "==INFO==")


Rows = list[tuple[int, list[str]]]  # (1-based line in the file, fields)


@contextlib.contextmanager
def _field_limit(size: int) -> Iterator[None]:
    # csv refuses fields over 131072 characters by default; a templated kernel name can be
    # longer. The file is already in memory, so its own length is a safe bound.
    old = csv.field_size_limit()
    csv.field_size_limit(max(old, size + 1))
    try:
        yield
    finally:
        csv.field_size_limit(old)


def read_ncu_csv(path: str | Path) -> NcuReport:
    """Read a details-page or raw-page CSV that ``ncu --csv`` (or ``ncu --import --csv``) wrote."""
    path = Path(path)
    raw = read_bytes(path)
    if not raw:
        raise TraceError(path, "file is empty")
    if b"\x00" in raw[:4096]:
        raise TraceError(path, "is binary, not an ncu CSV export (for .ncu-rep files, see --help)")
    text = bytes(raw).decode("utf-8-sig", errors="replace")
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if is_header_line(line)]
    if not starts:
        raise TraceError(
            path,
            'no ncu CSV table found: expected a header line starting with "ID" (or with an "ID" column '
            'elsewhere, beside "Kernel Name"); export with: '
            "ncu --import REPORT.ncu-rep --csv --page details > REPORT.csv",
        )
    problems = Problems()
    records: list[LaunchRecord] = []
    runs: list[NcuRun] = []
    skipped = 0
    with _field_limit(len(text)):
        for k, start in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else len(lines)
            block = _block(lines, start, end, last=k + 1 == len(starts))
            header = [h.strip().lstrip("\ufeff") for h in block[0][1]]
            index = {h.lower(): i for i, h in enumerate(header) if h}
            if "invocations" in index:
                raise TraceError(path, "is an ncu summary (--print-summary); export --page details or --page raw")
            run = len(runs)
            if "metric name" in index and "metric value" in index:
                fmt, (found, lost) = "ncu-csv-details", _details(index, block[1:], run, problems)
            else:
                fmt, (found, lost) = "ncu-csv-raw", _raw(path, header, index, block[1:], run, problems)
            skipped += lost
            if found:
                runs.append(NcuRun(run, fmt, 0, start + 1))
                records.extend(found)
            elif len(starts) > 1:
                problems.add("header blocks without a usable launch row, skipped", f"line {start + 1}", "block")
    warnings: list[str] = []
    if len(runs) > 1:
        # ncu writes one header per run; two headers mean exports appended into one file.
        lines_at = ", ".join(str(r.line) for r in runs[:5]) + (", ..." if len(runs) > 5 else "")
        warnings.append(f"{len(runs)} ncu runs in one file (headers at lines {lines_at}): each is read as its "
                        "own run; later runs' launch IDs are numbered on after the earlier runs'")
    if skipped:
        warnings.append(f"{skipped} lines that are not table rows were skipped")
    return build_report(path, runs[0].format if runs else "ncu-csv-details", records,
                        warnings=tuple(warnings), problems=problems, runs=tuple(runs))


def _block(lines: list[str], start: int, end: int, last: bool) -> Rows:
    """One header block's rows, with their line numbers; ncu's own messages left out."""
    numbered = [(i + 1, lines[i].lstrip("\ufeff")) for i in range(start, end)]
    numbered = [(n, ln) for n, ln in numbered if ln.strip() and not ln.lstrip().startswith(_NOISE_PREFIXES)]
    if not last:
        # What follows the last quoted row is the next run's program output, which precedes
        # its header just as the first run's does (and is not counted as skipped there either).
        while len(numbered) > 1 and not numbered[-1][1].lstrip().startswith('"'):
            numbered.pop()
    reader = csv.reader(ln for _, ln in numbered)
    out: Rows = []
    for row in reader:
        out.append((numbered[min(reader.line_num, len(numbered)) - 1][0], row))
    return out


def _cell(row: list[str], index: dict[str, int], name: str) -> str:
    i = index.get(name.lower())
    return row[i].strip() if i is not None and i < len(row) else ""


def _launch_id(row: list[str], index: dict[str, int], line: int, problems: Problems) -> int | None:
    text = _cell(row, index, "ID")
    value, problem = u.parse_whole(text)
    if value is not None and value < 0:
        problem = "negative"
    if problem:
        problems.add(f"rows skipped: ID {problem}", f"line {line}: {text[:40]!r}")
        return None
    return value


def _identity(row: list[str], index: dict[str, int], where: str, problems: Problems) -> dict[str, object]:
    ident: dict[str, object] = {}
    for column, name in ((NcuCol.PROCESS, "Process ID"), (NcuCol.CONTEXT, "Context"),
                         (NcuCol.STREAM, "Stream"), (NcuCol.DEVICE, "Device")):
        text = _cell(row, index, name)
        value, problem = u.parse_whole(text)
        if value is not None:
            ident[column] = value
        elif problem:
            problems.add(f"{name} {problem}, left empty", f"{where}: {text[:40]!r}", "launch")
    cc = _cell(row, index, "CC")
    if cc:
        ident[NcuCol.CC] = cc
    for prefix, name in (("block", "Block Size"), ("grid", "Grid Size")):
        dims = parse_dim3(_cell(row, index, name))
        if dims is not None:
            ident[f"{prefix}_x"], ident[f"{prefix}_y"], ident[f"{prefix}_z"] = dims
    return ident


def _value(rec: LaunchRecord, key: str, text: str, unit: str) -> tuple[float | str, str]:
    number = u.parse_number(text)
    if number is None:
        return text, "text"
    value = u.normalize(number, unit)
    if value[1] == u.UNKNOWN:
        rec.units.setdefault(key, unit)
    return value


def _details(index: dict[str, int], body: Rows, run: int, problems: Problems) -> tuple[list[LaunchRecord], int]:
    records: dict[int, LaunchRecord] = {}
    skipped = 0
    for line, row in body:
        name = _cell(row, index, "Kernel Name")
        if not _cell(row, index, "ID") or not name:
            skipped += 1  # program output interleaved with the table, or a cut-off line
            continue
        launch = _launch_id(row, index, line, problems)
        if launch is None:
            continue
        rec = records.get(launch)
        if rec is not None and rec.name != name:
            # One ID is one launch in a details export: rows naming another kernel under it
            # would otherwise be merged into the first, their values dropped without a word.
            problems.add("rows skipped: an ID that an earlier launch of another kernel has",
                         f"line {line}: ID {launch}")
            continue
        if rec is None:
            where = f"ID {launch} at line {line}"
            rec = records[launch] = LaunchRecord(launch, name, run=run, where=where,
                                                 identity=_identity(row, index, where, problems))
        rule = _cell(row, index, "Rule Name")
        metric = _cell(row, index, "Metric Name")
        if rule or (not metric and _cell(row, index, "Rule Description")):
            _add_rule(rec, row, index, rule)
            continue
        if not metric:
            skipped += 1
            continue
        value = _value(rec, metric, _cell(row, index, "Metric Value"), _cell(row, index, "Metric Unit"))
        if "__" in metric:  # a metric name (--metrics) rather than a section label
            rec.metrics.setdefault(metric, value)
        else:
            rec.labels.setdefault(metric, []).append(value)
    return list(records.values()), skipped


def _add_rule(rec: LaunchRecord, row: list[str], index: dict[str, int], rule: str) -> None:
    message = plain_rule_text(_cell(row, index, "Rule Description"))
    if not message:
        return
    speedup = u.parse_number(_cell(row, index, "Estimated Speedup"))
    speedup_type = _cell(row, index, "Estimated Speedup Type").lower() or None
    rec.rules.append({
        RuleCol.RULE: rule or "unnamed",
        RuleCol.SECTION: _cell(row, index, "Section Name") or None,
        RuleCol.TITLE: None,  # the CSV carries only the description
        RuleCol.MESSAGE: message,
        RuleCol.SEVERITY: _SEVERITY.get(_cell(row, index, "Rule Type").lower(), "none"),
        RuleCol.SPEEDUP_TYPE: speedup_type if speedup_type in ("local", "global") else None,
        RuleCol.SPEEDUP_PCT: speedup,
    })


def _raw(path: Path, header: list[str], index: dict[str, int], body: Rows, run: int,
         problems: Problems) -> tuple[list[LaunchRecord], int]:
    metric_columns = [(i, h) for i, h in enumerate(header) if h and h.lower() not in _IDENTITY]
    if "id" not in index or "kernel name" not in index or not metric_columns:
        raise TraceError(path, "CSV header is not an ncu details or raw page (no Kernel Name / metric columns)")
    units: list[str] = [""] * len(header)
    records: list[LaunchRecord] = []
    skipped = 0
    for line, row in body:
        if not _cell(row, index, "ID"):
            if not records:
                units = [c.strip() for c in row] + [""] * max(0, len(header) - len(row))
            else:
                skipped += 1
            continue
        name = _cell(row, index, "Kernel Name")
        if not name:
            skipped += 1
            continue
        launch = _launch_id(row, index, line, problems)
        if launch is None:
            continue
        where = f"ID {launch} at line {line}"
        rec = LaunchRecord(launch, name, run=run, where=where, identity=_identity(row, index, where, problems))
        for i, metric in metric_columns:
            if i < len(row) and row[i].strip():
                rec.metrics[metric] = _value(rec, metric, row[i], units[i] if i < len(units) else "")
        records.append(rec)
    return records, skipped
