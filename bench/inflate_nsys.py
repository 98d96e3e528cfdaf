"""Inflate a real Nsight Systems export into a large, realistic one for benchmarks.

Every activity table of the export (kernels, CUDA runtime and driver calls, memcpy, memset,
synchronization, CUDA events, NVTX, OS runtime, profiler overhead, scheduling and sampling
records: whatever the file holds) is replicated N times. Copy k is shifted in time by k spans
of the original activity (plus a 1 ms gap), and its correlation ids and NVTX range ids by k
times (the largest id + 1), so every kernel still links to its own launch in its own process,
and ranges, syncs and copies interleave as they did. StringIds, processes, threads, devices and
metadata are kept once; ANALYSIS_DETAILS is widened when the copies run past the session.

SQLite does the copying (INSERT ... SELECT over an attached source), so a 250x copy of a 2.7 MB
export (0.6 GB, 1 M kernels) takes a few tens of seconds and little memory.

Usage: python bench/inflate_nsys.py [--export FILE.sqlite[.gz]] [--copies N] OUT.sqlite
(default export: nsysai_mfu_2gpu_before in ../shared/traces/nsys; write OUT outside the repo.)
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

REPO = Path(__file__).resolve().parent.parent
DEFAULT_EXPORT = REPO.parent / "shared" / "traces" / "nsys" / "nsysai_mfu_2gpu_before.sqlite.gz"
#: Tables holding timed events; every one the export has is replicated.
ACTIVITY_PREFIXES: Final = ("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS", "OSRT_API", "PROFILER_OVERHEAD",
                            "SCHED_EVENTS", "COMPOSITE_EVENTS", "CUDA_GPU_MEMORY_USAGE_EVENTS",
                            "CUDA_GRAPH_", "CUDNN_EVENTS", "CUBLAS_EVENTS", "MPI_", "UCX_")
TIME_COLUMNS: Final = ("start", "end", "timestamp")
#: Columns whose values must stay unique per copy (links between tables, range identity).
ID_COLUMNS: Final = ("correlationId", "rangeId")
GAP_NS: Final = 1_000_000


def activity_tables(conn: sqlite3.Connection) -> list[str]:
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return [n for n in names if n.startswith(ACTIVITY_PREFIXES)]


def columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]


def extent(conn: sqlite3.Connection, tables: list[str], cols: tuple[str, ...], what: str) -> tuple[int, int]:
    """min and max of ``what`` (min/max) over those columns of those tables, integers only."""
    lows, highs = [], []
    for t in tables:
        for c in (c for c in columns(conn, t) if c in cols):
            lo, hi = conn.execute(f'SELECT min("{c}"), max("{c}") FROM "{t}" WHERE typeof("{c}") = ?',
                                  ("integer",)).fetchone()
            if lo is not None:
                lows.append(lo)
                highs.append(hi)
    return (min(lows), max(highs)) if lows else (0, 0)


def inflate(src: Path, out: Path, copies: int) -> dict[str, int]:
    """Write ``copies`` copies of ``src``'s activity into ``out``; rows per table after."""
    out.unlink(missing_ok=True)
    shutil.copyfile(src, out)
    conn = sqlite3.connect(out)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -200000")
    tables = activity_tables(conn)
    first, last = extent(conn, tables, TIME_COLUMNS, "time")
    shift = last - first + GAP_NS
    id_step = {c: extent(conn, tables, (c,), c)[1] + 1 for c in ID_COLUMNS}
    conn.execute("ATTACH DATABASE ? AS src", (f"{src.resolve().as_uri()}?mode=ro",))
    conn.execute(f"CREATE TEMP TABLE k AS WITH RECURSIVE s(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM s "
                 f"WHERE k < {copies - 1}) SELECT k FROM s")
    for t in tables:
        cols = columns(conn, t)
        exprs = []
        for c in cols:
            if c in TIME_COLUMNS:
                exprs.append(f'CASE WHEN typeof(o."{c}") = \'integer\' THEN o."{c}" + k.k * {shift} END')
            elif c in id_step:
                exprs.append(f'CASE WHEN typeof(o."{c}") = \'integer\' THEN o."{c}" + k.k * {id_step[c]} '
                             f'ELSE o."{c}" END')
            else:
                exprs.append(f'o."{c}"')
        names = ", ".join(f'"{c}"' for c in cols)
        conn.execute(f'INSERT INTO main."{t}" ({names}) SELECT {", ".join(exprs)} '
                     f'FROM temp.k AS k CROSS JOIN src."{t}" AS o ORDER BY k.k, o.rowid')
        conn.commit()
    end = last + (copies - 1) * shift
    if "ANALYSIS_DETAILS" in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}:
        conn.execute("UPDATE ANALYSIS_DETAILS SET stopTime = max(stopTime, ?), "
                     "duration = max(stopTime, ?) - startTime", (end, end))
    conn.commit()
    counts = {t: conn.execute(f'SELECT count(*) FROM main."{t}"').fetchone()[0] for t in tables}
    conn.execute("DETACH DATABASE src")
    conn.close()
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--export", type=Path, default=DEFAULT_EXPORT)
    ap.add_argument("--copies", type=int, default=250)
    args = ap.parse_args()
    if args.copies < 1:
        sys.exit("--copies must be at least 1")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tracewhy-inflate-") as tmp:
        src = args.export
        if src.read_bytes()[:2] == b"\x1f\x8b":
            src = Path(tmp) / "base.sqlite"
            with gzip.open(args.export, "rb") as g, open(src, "wb") as f:
                shutil.copyfileobj(g, f)
        counts = inflate(src, args.out, args.copies)
    for t, n in counts.items():
        print(f"{t:40} {n:>12,}")
    print(f"{args.out}: {args.out.stat().st_size / 1e6:.0f} MB, {args.copies} copies, "
          f"{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
