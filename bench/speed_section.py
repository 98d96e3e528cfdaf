"""Write the README's Speed section from the result pages the benchmarks in ``bench/`` wrote.

Each benchmark runs tracewhy side by side with its peer in one run and writes a Markdown page
(``results_*.md``). This script reads the tables on those pages, never a figure typed by hand,
and writes one row per target of the speed work into the README between its speed markers: the
workload, tracewhy's figure, the peer's in the same run, the target, whether it is met, and the
page the figures come from. Rerun it after any benchmark; ``tests/test_speed_section.py`` fails
when the README and the pages disagree.

Usage: python bench/speed_section.py [--no-write]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pages import write_between_markers  # bench/ is a folder of scripts, not a package

BENCH = Path(__file__).resolve().parent
README = BENCH.parent / "README.md"
MARKERS = ("<!-- speed:start -->", "<!-- speed:end -->")
#: Whole-process targets of the speed work, each checked below against its page.
READ_MB_S = 200.0
READ_RSS_PER_FILE = 1.5
READ_MIN_MB = 200.0
SMALL_S = 0.5
NSYS_DIAGNOSE_S = 12.0
NSYS_DIAGNOSE_RSS_PER_FILE = 2.0
CACHE_HIT_X = 20.0
HTA_X = 10.0

Row = dict[str, str]


@dataclass(frozen=True)
class Table:
    """One Markdown table of a result page: its header cells and its rows keyed by them."""

    header: tuple[str, ...]
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Line:
    """One row of the Speed section."""

    workload: str
    tracewhy: str
    peer: str
    target: str
    met: bool
    page: str


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(page: Path) -> Iterator[Table]:
    """Every pipe table on ``page``, in order."""
    block: list[str] = []
    for line in [*page.read_text(encoding="utf-8").splitlines(), ""]:
        if line.lstrip().startswith("|"):
            block.append(line)
            continue
        if len(block) >= 2 and set(block[1].replace("|", "").strip()) <= set("-: "):
            header = tuple(_cells(block[0]))
            rows = tuple(dict(zip(header, _cells(b), strict=False)) for b in block[2:])
            yield Table(header, rows)
        block = []


def table_with(page: Path, *columns: str) -> Table:
    """The first table on ``page`` whose header holds every one of ``columns``."""
    for t in tables(page):
        if all(c in t.header for c in columns):
            return t
    raise LookupError(f"{page.name}: no table with the columns {', '.join(columns)}")


def number(cell: str) -> float:
    """The first number in a cell (``1,009``, ``**14.2x**``, ``0.45 (rc 0)``)."""
    m = re.search(r"-?\d[\d,]*(?:\.\d+)?", cell)
    if m is None:
        raise ValueError(f"no number in {cell!r}")
    return float(m.group().replace(",", ""))


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def kineto_read(page: Path) -> Iterator[Line]:
    """Whole-process read rate and peak RSS of ``tracewhy`` rows against the peers' rows in the same run.

    Only files of ``READ_MIN_MB`` or more: below that the interpreter and imports, not the read,
    set a whole process's rate (the small-trace row covers those).
    """
    t = table_with(page, "file", "uncompressed MB", "tool", "wall s", "peak RSS MB")
    by_file: dict[str, dict[str, Row]] = {}
    for r in t.rows:
        by_file.setdefault(r["file"], {})[r["tool"]] = r
    for tools in by_file.values():
        ours = tools.get("tracewhy")
        if ours is None:
            continue
        mb, wall, rss = number(ours["uncompressed MB"]), number(ours["wall s"]), number(ours["peak RSS MB"])
        if mb < READ_MIN_MB:
            continue
        peers = [f"{tool} {number(r['wall s']):.2f} s" for tool, r in tools.items()
                 if tool in ("json.loads", "HTA")]
        rate = mb / wall
        yield Line(f"Kineto read, {mb:,.0f} MB JSON (`kernels --no-cache --json`)",
                   f"{wall:.2f} s = {rate:.0f} MB/s, peak {rss / mb:.2f}x the file",
                   ", ".join(peers) or "none in this run",
                   f">= {READ_MB_S:.0f} MB/s, <= {READ_RSS_PER_FILE}x",
                   rate >= READ_MB_S and rss / mb <= READ_RSS_PER_FILE, page.name)


def hta_ratio(page: Path) -> Iterator[Line]:
    """How many times faster than HTA's construction, whole process, per file."""
    t = table_with(page, "file", "HTA / tracewhy (target >= 10)")
    for r in t.rows:
        x = number(r["HTA / tracewhy (target >= 10)"])
        yield Line(f"Kineto read against HTA: {r['file']}", f"{x:.1f}x faster", "HTA", f">= {HTA_X:.0f}x",
                   x >= HTA_X, page.name)


#: How ``bench_nsys_scale.py`` marks a row of nsys kept from an earlier page (nsys not installed).
_KEPT = re.compile(r" \(earlier run, kept[^)]*\)$")


def _nsys_rows(page: Path) -> dict[str, Row]:
    """The page's rows by what they time; a kept row under its plain label, its peer cell saying so."""
    t = table_with(page, "what", "median wall s", "peak RSS MB (max)", "RSS / file")
    return {_KEPT.sub("", r["what"]): {**r, "kept": "yes" if _KEPT.search(r["what"]) else ""} for r in t.rows}


def _peer(name: str, row: Row, wall: str) -> str:
    return f"{name} {wall} s" + (" (an earlier run: nsys not installed for this one)" if row.get("kept") else "")


def nsys_large(page: Path) -> Iterator[Line]:
    """``kernels`` against ``nsys stats`` and ``diagnose`` against ``nsys analyze`` on the large export."""
    rows = _nsys_rows(page)
    size = re.search(r"(\d[\d,]*) MB", page.read_text(encoding="utf-8"))
    label = f"{size.group(1)} MB nsys export" if size else "large nsys export"
    kern, stats = rows["tracewhy kernels --json"], rows["nsys stats --report cuda_gpu_kern_sum"]
    k, s = number(kern["median wall s"]), number(stats["median wall s"])
    yield Line(f"{label}, `kernels`", f"{k:.2f} s, peak {number(kern['RSS / file']):.2f}x the file",
               _peer("`nsys stats`", stats, f"{s:.2f}"), ">= 1.5x faster", s / k >= 1.5, page.name)
    diag, analyze = rows["tracewhy diagnose --json"], rows["nsys analyze (6 rules)"]
    d, a, per_file = number(diag["median wall s"]), number(analyze["median wall s"]), number(diag["RSS / file"])
    yield Line(f"{label}, `diagnose`", f"{d:.1f} s, peak {per_file:.2f}x the file",
               _peer("`nsys analyze`", analyze, f"{a:.1f}"),
               f"<= {NSYS_DIAGNOSE_S:.0f} s, <= {NSYS_DIAGNOSE_RSS_PER_FILE:.0f}x",
               d <= NSYS_DIAGNOSE_S and per_file <= NSYS_DIAGNOSE_RSS_PER_FILE, page.name)


def small_trace(page: Path) -> Iterator[Line]:
    """The slowest command on a small trace, whole process, text and ``--json``."""
    t = table_with(page, "command", "text wall s", "--json wall s")
    trace = re.search(r"Trace: (\S+?)(?: decompressed)? \((\d+(?:\.\d+)?) MB\)", page.read_text(encoding="utf-8"))
    label = f"{trace.group(1)} ({trace.group(2)} MB)" if trace else page.name
    walls: dict[str, float] = {}
    refused: list[str] = []  # the bench's input is not this command's (roofline on an nsys export): not timed work
    for r in t.rows:
        cells = [r["text wall s"], r.get("--json wall s", "")]
        if any("(rc " in c for c in cells):
            refused.append(r["command"])
            continue
        walls[r["command"]] = max(number(c) for c in cells if c)
    slow = sorted((w, c) for c, w in walls.items() if w > SMALL_S)
    worst_s, worst = max((w, c) for c, w in walls.items())
    over = (f"; {len(slow)} over, the slowest {', '.join(f'{c} {w:.2f} s' for w, c in reversed(slow[-3:]))}"
            if slow else "")
    floor = re.search(r"`python -c 'import polars, numpy'` (\d+\.\d+)", page.read_text(encoding="utf-8"))
    ours = f"{len(walls)} commands{over}" if slow else f"{len(walls)} commands, the slowest {worst} {worst_s:.2f} s"
    if refused:
        ours += f" ({', '.join(refused)}: input refused, not counted)"
    yield Line(f"every command on {label}", ours,
               f"`import polars, numpy` alone {number(floor.group(1)):.2f} s" if floor else "none in this run",
               f"<= {SMALL_S} s each",
               not slow, page.name)


def cache_hit(page: Path) -> Iterator[Line]:
    """A cache hit against a cold read of the largest trace on the page."""
    col = next(c for c in table_with(page, "file", "MB on disk").header if c.startswith("**no cache / hit**"))
    t = table_with(page, "file", "MB on disk", col)
    r = max(t.rows, key=lambda r: number(r["MB on disk"]))
    x = number(r[col])
    yield Line(f"parse-cache hit, {number(r['MB on disk']):,.0f} MB trace", f"{x:.1f}x faster than a cold read",
               "tracewhy cold, parse cache off", f">= {CACHE_HIT_X:.0f}x", x >= CACHE_HIT_X, page.name)


#: (page, reader) in the order the section lists them; a missing page is an error, not a skip.
SOURCES: tuple[tuple[str, Callable[[Path], Iterator[Line]]], ...] = (
    ("results_read_throughput.md", kineto_read),
    ("results.md", hta_ratio),
    ("results_nsys_scale.md", nsys_large),
    ("results_startup.md", small_trace),
    ("results_startup_nsys.md", small_trace),
    ("results_cache.md", cache_hit),
)


def section(bench: Path = BENCH) -> list[str]:
    """The section's lines: one table row per target, then how many are met."""
    lines = [Line(*x.__dict__.values()) for page, read in SOURCES for x in read(bench / page)]
    out = ["| workload | tracewhy | peer, same run | target | met | page |", "|---|---|---|---|---|---|"]
    out += [f"| {x.workload} | {x.tracewhy} | {x.peer} | {x.target} | {_yes(x.met)} | "
            f"[{x.page}](bench/{x.page}) |" for x in lines]
    return [*out, "", f"{sum(x.met for x in lines)} of {len(lines)} targets met; written by "
            "`python bench/speed_section.py` from the pages named, do not edit."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    lines = section()
    print("\n".join(lines))
    if not args.no_write:
        write_between_markers(README, MARKERS, lines)


if __name__ == "__main__":
    main()
