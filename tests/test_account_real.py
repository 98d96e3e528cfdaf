"""The step account on every trace in ../shared/traces: the parts of each analysed step add up
to the step's window as the raw events give it (the file's own step markers, DataLoader fetches
or optimizer steps, read here without tracewhy), and the account names where at least 80% of
the step goes on every trace with steps or iterations."""

from __future__ import annotations

import gzip
import itertools
import json
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from conftest import GENERATED, SHARED, TRACES, account_of
from tracewhy.analyses import api_names
from tracewhy.analyses.account import AccountCol, AccountResult
from tracewhy.analyses.iterations import WindowSource
from tracewhy.errors import TraceError

US = 1000
#: Files beside the traces that are no profiler trace (reference outputs, an execution trace,
#: a memory-timeline export): tracewhy refuses them, and so does this sweep.
NOT_TRACES = re.compile(r"reference|expected|overlaid|execution_trace|memory_timeline_raw|result_check")
#: Kineto's host categories: "cpu_op" and "user_annotation" since PyTorch 1.10, "Operator" before.
HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation", "operator"})
#: The share of the mean step the account must name (everything but ``unexplained``).
MIN_NAMED_SHARE = 0.8
#: How far a step's parts may be from its window in the raw events.
ADD_UP_TOLERANCE = 0.01


def _traces() -> list[str]:
    found = sorted(p for p in TRACES.glob("*/*") if p.name.endswith((".json.gz", ".sqlite.gz"))
                   and not NOT_TRACES.search(p.name)) if SHARED.is_dir() else []
    return [str(p.relative_to(TRACES)) for p in found] + [
        f"generated/{p.name}" for p in sorted(GENERATED.glob("*.pt.trace.json.gz"))]


def _path(relative: str) -> Path:
    return GENERATED / relative.removeprefix("generated/") if relative.startswith("generated/") else TRACES / relative


def _account(relative: str) -> AccountResult:
    try:
        return account_of(_path(relative))
    except TraceError as e:
        pytest.skip(f"not a profiler trace: {e}")


@pytest.mark.slow
@pytest.mark.parametrize("relative", _traces())
def test_parts_add_up_to_the_raw_windows_and_are_named(relative: str, tmp_path: Path) -> None:
    r = _account(relative)
    per_step = dict(r.per_step.group_by(AccountCol.STEP).agg(pl.col(AccountCol.NS).sum()).iter_rows())
    for row in r.windows.iter_rows(named=True):
        assert per_step[row[AccountCol.STEP]] == row[AccountCol.WINDOW]  # never more, never less
    assert int(r.parts.get_column(AccountCol.NS_PER_STEP).sum()) == pytest.approx(r.mean_step_ns, abs=len(r.parts))
    if r.source == WindowSource.WHOLE_TRACE:
        return  # no steps or iterations: one window, its length the trace's own span
    raw = _raw_windows(_path(relative), r, tmp_path)
    checked = 0
    for row in r.windows.iter_rows(named=True):
        length = raw.get(round(row[AccountCol.WINDOW_START] / US))
        if length is not None:
            assert abs(per_step[row[AccountCol.STEP]] - length) <= ADD_UP_TOLERANCE * length + 2 * US
            checked += 1
    assert checked > 0 or r.windows.height == r.steps_found == 1  # a lone step has no next marker
    assert r.named_share >= MIN_NAMED_SHARE


def _raw_windows(path: Path, r: AccountResult, tmp_path: Path) -> dict[int, int]:
    """Window start (µs, rounded) -> length (ns) from the raw file: consecutive marker starts
    (steps, fetches) or ends (optimizer steps) on one thread. Times stay in µs floats here (as
    ns, a 2021 epoch timestamp has more digits than a float holds)."""
    spans = _sqlite_spans(path, tmp_path) if path.name.endswith(".sqlite.gz") else _json_spans(path)
    if r.source == WindowSource.DATALOADER:
        chosen = [s for s in spans if api_names.is_dataloader(s[0])]
    elif r.source == WindowSource.OPTIMIZER:
        chosen = [s for s in spans if api_names.is_optimizer_step(s[0])]
    else:
        marker = re.compile(rf"^{re.escape(r.marker)}(#?\d+)?({api_names.OP_RANGE_SUFFIX[:-1]})?$")
        chosen = [s for s in spans if marker.match(s[0])]
    out: dict[int, int] = {}
    for _, group in itertools.groupby(sorted(chosen, key=lambda s: (s[3], s[1])), key=lambda s: s[3]):
        spans_ = list(group)
        edge = [s[1] + s[2] for s in spans_] if r.source == WindowSource.OPTIMIZER else [s[1] for s in spans_]
        edge = sorted(set(edge))
        for a, b in itertools.pairwise(edge):
            out[round(a)] = round((b - a) * US)
    return out


def _json_spans(path: Path) -> list[tuple[str, float, float, Any]]:
    """(name, start µs, dur µs, thread) of the host slices of a Kineto file."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return [(str(e["name"]), float(e["ts"]), float(e.get("dur", 0)), (e.get("pid"), e.get("tid")))
            for e in events if e.get("ph") == "X" and str(e.get("cat")).lower() in HOST_CATEGORIES]


def _sqlite_spans(path: Path, tmp_path: Path) -> list[tuple[str, float, float, Any]]:
    """(name, start µs, dur µs, thread) of the NVTX ranges of an nsys export."""
    db = tmp_path / "raw.sqlite"
    with gzip.open(path) as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    has_strings = con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'StringIds'").fetchone()[0]
    text = "COALESCE(n.text, s.value)" if has_strings else "n.text"
    join = "LEFT JOIN StringIds s ON s.id = n.textId" if has_strings else ""
    rows = con.execute(f"SELECT {text}, n.start, n.end - n.start, n.globalTid FROM NVTX_EVENTS n {join} "
                       "WHERE n.end IS NOT NULL").fetchall()
    con.close()
    return [(str(name), start / US, dur / US, tid) for name, start, dur, tid in rows if name is not None]
