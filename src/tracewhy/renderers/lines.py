"""``lines``: the JSON payload, the terminal tables, and the stacks as a folded flame graph or a
speedscope profile. Takes a finished LinesResult, never a trace."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final, TypedDict

from tracewhy import __version__
from tracewhy.renderers.layout import FitTable, Layout, name, number
from tracewhy.units import fmt_ns, fmt_pct, printable

if TYPE_CHECKING:  # types only: importing the analysis here would load it for every renderer
    import polars as pl
    from rich.console import RenderableType

    from tracewhy.analyses.lines import LINE_ROWS_SCHEMA, LinesResult
    from tracewhy.renderers.json_schema import rows

#: ``--weight``: what a flame graph's widths are.
WEIGHTS: Final = ("host", "gpu")
SPEEDSCOPE_SCHEMA: Final = "https://www.speedscope.app/file-format-schema.json"


class LinesPayload(TypedDict):
    """``lines``: per Python source line, calls, host self and total time, the GPU time of the work
    launched under it, sync points, ops and its share of the steady steps."""

    #: Where the frames came from: "python_function", "call_stack" or "none".
    source: str
    include_library: bool
    sort_by: str
    gpu_time_ns: int
    #: The steady steps' windows' length; null without steps.
    steady_window_ns: int | None
    note: str | None
    #: With --logs: compiled kernel runs seen in the trace and how many were traced to source lines.
    compiled_kernel_runs: int | None
    compiled_attributed: int | None
    lines: Annotated[pl.DataFrame, rows(LINE_ROWS_SCHEMA, "one row per source line, in sort_by order")]


def lines_payload(r: LinesResult) -> LinesPayload:
    """The JSON of ``lines``: every row in ``sort_by`` order (``lines[]``)."""
    from tracewhy.analyses.lines import LineCol  # loaded already: ``r`` comes from it

    return {"source": r.source, "include_library": r.include_library, "sort_by": r.sort_by,
            "gpu_time_ns": r.gpu_time_ns, "steady_window_ns": r.steady_window_ns, "note": r.note,
            "compiled_kernel_runs": r.compiled_kernel_runs, "compiled_attributed": r.compiled_attributed,
            "lines": r.table.drop(LineCol.FRAME)}


def render_lines(r: LinesResult, top: int) -> RenderableType:
    """The top rows by ``sort_by``, and by host self time too when that is not the order."""
    from rich.console import Group
    from rich.text import Text

    from tracewhy.analyses.lines import LineCol

    scope = "all code" if r.include_library else "user code (--all adds library code)"
    parts: list[RenderableType] = [_table(r, r.table.head(top), f"Python lines by {r.sort_by}, {scope}")]
    if r.sort_by != LineCol.HOST_SELF and r.table.height:
        by_host = r.table.sort(LineCol.HOST_SELF, descending=True, maintain_order=True).head(top)
        parts.append(_table(r, by_host, "by host self time"))
    if r.compiled_kernel_runs is not None:
        parts.append(Text(f"compiled kernels: {r.compiled_attributed} of {r.compiled_kernel_runs} runs traced to "
                          "source lines (rows marked compiled)"))
    if r.note:
        parts.append(Text(f"note: {printable(r.note)}", style="yellow"))
    return Group(*parts)


#: ``lines``: the self times (where a line's own time goes) and its share stay; the counts and
#: the totals leave a narrow terminal first.
LINES_TABLE: Final = Layout(
    (name("line"), number("calls"), number("host self"), number("host total"), number("GPU self"),
     number("GPU total"), number("syncs"), number("ops"), number("step share")),
    drop=("ops", "syncs", "calls", "host total", "GPU total"))


def _table(r: LinesResult, rows: Any, title: str) -> FitTable:
    from tracewhy.analyses.lines import SOURCE_FRAMES, LineCol

    gpu = r.gpu_time_ns > 0
    frames = r.source == SOURCE_FRAMES
    t = LINES_TABLE.table(title, "self: time not in a listed frame below"
                          + ("; GPU: work launched under the line" if gpu else "")
                          + "; share: host total over the steady steps"
                          + ("; def N: the function's first line (no line of a call is recorded); running at "
                             "start: open before profiling began, its line unknown" if frames else ""),
                          omit=() if gpu else ("GPU self", "GPU total"))
    for row in rows.iter_rows(named=True):
        gpu_cells = (fmt_ns(row[LineCol.GPU_SELF]), fmt_ns(row[LineCol.GPU])) if gpu else ()
        t.add_row(location(row[LineCol.FILE], row[LineCol.LINE], row[LineCol.FUNCTION], row[LineCol.LINE_KIND]),
                  str(row[LineCol.CALLS]), fmt_ns(row[LineCol.HOST_SELF]), fmt_ns(row[LineCol.HOST_TOTAL]),
                  *gpu_cells, str(row[LineCol.SYNCS]), str(row[LineCol.OPS]), fmt_pct(row[LineCol.STEP_SHARE]))
    return t


def location(file: str, line: int, function: str, kind: str | None = None) -> str:
    """``file:line function`` for the line of a call, ``file:line def function`` for where the
    function starts, ``file function (running at start)`` for a frame open before profiling
    began (its line then was the profiler's start); a frame without a file: its name alone."""
    from tracewhy.analyses.source_lines import LineKind

    if not file:
        return function
    if kind == LineKind.DEF:
        return f"{file}:{line} def {function}"
    if kind == LineKind.AT_START:
        return f"{file} {function} (running at start)"
    if kind == LineKind.COMPILED:
        return f"{file}:{line} {function} (compiled)"
    return f"{file}:{line} {function}"


def _labels(r: LinesResult) -> dict[int, str]:
    from tracewhy.analyses.lines import LineCol

    cols = r.table.select(LineCol.FRAME, LineCol.FILE, LineCol.LINE, LineCol.FUNCTION, LineCol.LINE_KIND)
    return {frame: location(file, line, function, kind) for frame, file, line, function, kind in cols.iter_rows()}


def _weighted(r: LinesResult, weight: str) -> list[tuple[list[int], int]]:
    from tracewhy.analyses.lines import StackCol

    column = StackCol.HOST if weight == "host" else StackCol.GPU
    return [(frames, w) for frames, w in r.stacks.select(StackCol.FRAMES, column).iter_rows() if w > 0]


def folded_stacks(r: LinesResult, weight: str = "host") -> str:
    """Brendan Gregg's folded format, one ``root;...;leaf WEIGHT`` line per stack (weights in
    ns), which flamegraph.pl, inferno and speedscope read. ``;`` in a name would split a frame,
    so it becomes ``,``."""
    labels = {k: v.replace(";", ",").replace("\n", " ") for k, v in _labels(r).items()}
    return "".join(f"{';'.join(labels[f] for f in frames)} {w}\n" for frames, w in _weighted(r, weight))


def speedscope_profile(r: LinesResult, weight: str = "host", name: str = "tracewhy lines") -> dict[str, Any]:
    """A speedscope file (``SPEEDSCOPE_SCHEMA``): the stacks as one sampled profile in
    nanoseconds, each stack a sample weighted by its self time."""
    from tracewhy.analyses.lines import LineCol

    weighted = _weighted(r, weight)
    used = sorted({f for frames, _ in weighted for f in frames})
    index = {f: i for i, f in enumerate(used)}
    rows = {row[LineCol.FRAME]: row for row in r.table.iter_rows(named=True)}
    frames = []
    for f in used:
        row = rows[f]
        frame: dict[str, Any] = {"name": row[LineCol.FUNCTION]}
        if row[LineCol.FILE]:
            frame.update(file=row[LineCol.FILE], line=row[LineCol.LINE])
        frames.append(frame)
    total = sum(w for _, w in weighted)
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "shared": {"frames": frames},
        "profiles": [{
            "type": "sampled", "name": f"{name} ({weight} time)", "unit": "nanoseconds",
            "startValue": 0, "endValue": total,
            "samples": [[index[f] for f in stack] for stack, _ in weighted],
            "weights": [w for _, w in weighted],
        }],
        "name": name,
        "activeProfileIndex": 0,
        "exporter": f"tracewhy {__version__}",
    }


def speedscope_bytes(r: LinesResult, weight: str, name: str) -> bytes:
    """``speedscope_profile`` as the file's bytes."""
    import msgspec

    return msgspec.json.encode(speedscope_profile(r, weight, name=name))
