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
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Final

from tracewhy.errors import TraceError
from tracewhy.model.ncu import NCol, NcuReport, RCol
from tracewhy.readers import ncu_units as u
from tracewhy.readers.ncu_common import (
    LaunchRecord,
    build_report,
    parse_dim3,
    plain_rule_text,
)
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
    start = _header_line(lines)
    if start is None:
        raise TraceError(
            path,
            'no ncu CSV table found: expected a header line starting with "ID" '
            "(export with: ncu --import REPORT.ncu-rep --csv --page details > REPORT.csv)",
        )
    table = [ln for ln in lines[start:] if ln.strip() and not ln.lstrip().startswith(_NOISE_PREFIXES)]
    rows = list(csv.reader(table))
    header = [h.strip() for h in rows[0]]
    index = {h.lower(): i for i, h in enumerate(header) if h}
    body = [r for r in rows[1:] if [c.strip() for c in r] != header]  # repeated headers
    if "invocations" in index:
        raise TraceError(path, "is an ncu summary (--print-summary); export --page details or --page raw")
    if "metric name" in index and "metric value" in index:
        return _details(path, index, body)
    return _raw(path, header, index, body)


def _header_line(lines: list[str]) -> int | None:
    for i, line in enumerate(lines):
        s = line.lstrip("\ufeff \t")
        if s.startswith('"ID"') or s.startswith("ID,"):
            return i
    return None


def _cell(row: list[str], index: dict[str, int], name: str) -> str:
    i = index.get(name.lower())
    return row[i].strip() if i is not None and i < len(row) else ""


def _launch_id(text: str) -> int | None:
    value = u.parse_number(text)
    return int(value) if value is not None and value == int(value) and value >= 0 else None


def _identity(row: list[str], index: dict[str, int]) -> dict[str, object]:
    ident: dict[str, object] = {}
    for column, name in ((NCol.PROCESS, "Process ID"), (NCol.CONTEXT, "Context"),
                         (NCol.STREAM, "Stream"), (NCol.DEVICE, "Device")):
        value = u.parse_number(_cell(row, index, name))
        if value is not None:
            ident[column] = int(value)
    cc = _cell(row, index, "CC")
    if cc:
        ident[NCol.CC] = cc
    for prefix, name in (("block", "Block Size"), ("grid", "Grid Size")):
        dims = parse_dim3(_cell(row, index, name))
        if dims is not None:
            ident[f"{prefix}_x"], ident[f"{prefix}_y"], ident[f"{prefix}_z"] = dims
    return ident


def _value(text: str, unit: str) -> tuple[float | str, str]:
    number = u.parse_number(text)
    if number is None:
        return text, "text"
    return u.normalize(number, unit)


def _details(path: Path, index: dict[str, int], body: list[list[str]]) -> NcuReport:
    records: dict[int, LaunchRecord] = {}
    skipped = 0
    for row in body:
        launch = _launch_id(_cell(row, index, "ID"))
        name = _cell(row, index, "Kernel Name")
        if launch is None or not name:
            skipped += 1  # program output interleaved with the table, or a cut-off line
            continue
        rec = records.get(launch)
        if rec is None:
            rec = records[launch] = LaunchRecord(launch, name, identity=_identity(row, index))
        rule = _cell(row, index, "Rule Name")
        metric = _cell(row, index, "Metric Name")
        if rule or (not metric and _cell(row, index, "Rule Description")):
            _add_rule(rec, row, index, rule)
            continue
        if not metric:
            skipped += 1
            continue
        value = _value(_cell(row, index, "Metric Value"), _cell(row, index, "Metric Unit"))
        if "__" in metric:  # a metric name (--metrics) rather than a section label
            rec.metrics.setdefault(metric, value)
        else:
            rec.labels.setdefault(metric, []).append(value)
    warnings = (f"{skipped} lines that are not table rows were skipped",) if skipped else ()
    return build_report(path, "ncu-csv-details", list(records.values()), warnings=warnings)


def _add_rule(rec: LaunchRecord, row: list[str], index: dict[str, int], rule: str) -> None:
    message = plain_rule_text(_cell(row, index, "Rule Description"))
    if not message:
        return
    speedup = u.parse_number(_cell(row, index, "Estimated Speedup"))
    speedup_type = _cell(row, index, "Estimated Speedup Type").lower() or None
    rec.rules.append({
        RCol.RULE: rule or "unnamed",
        RCol.SECTION: _cell(row, index, "Section Name") or None,
        RCol.TITLE: None,  # the CSV carries only the description
        RCol.MESSAGE: message,
        RCol.SEVERITY: _SEVERITY.get(_cell(row, index, "Rule Type").lower(), "none"),
        RCol.SPEEDUP_TYPE: speedup_type if speedup_type in ("local", "global") else None,
        RCol.SPEEDUP_PCT: speedup,
    })


def _raw(path: Path, header: list[str], index: dict[str, int], body: list[list[str]]) -> NcuReport:
    metric_columns = [(i, h) for i, h in enumerate(header) if h and h.lower() not in _IDENTITY]
    if "id" not in index or "kernel name" not in index or not metric_columns:
        raise TraceError(path, "CSV header is not an ncu details or raw page (no Kernel Name / metric columns)")
    units: list[str] = [""] * len(header)
    records: list[LaunchRecord] = []
    skipped = 0
    for row in body:
        launch = _launch_id(_cell(row, index, "ID"))
        if launch is None:
            if not _cell(row, index, "ID") and not records:
                units = [c.strip() for c in row] + [""] * max(0, len(header) - len(row))
            else:
                skipped += 1
            continue
        name = _cell(row, index, "Kernel Name")
        if not name:
            skipped += 1
            continue
        rec = LaunchRecord(launch, name, identity=_identity(row, index))
        for i, metric in metric_columns:
            if i < len(row) and row[i].strip():
                rec.metrics[metric] = _value(row[i], units[i] if i < len(units) else "")
        records.append(rec)
    warnings = (f"{skipped} lines that are not table rows were skipped",) if skipped else ()
    return build_report(path, "ncu-csv-raw", records, warnings=warnings)
