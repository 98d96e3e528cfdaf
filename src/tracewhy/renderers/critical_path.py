"""``critical-path`` output: the JSON payload (per step: total, composition, what lies on the
path and what removing it would save), the report's section and the terminal tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final, TypedDict, cast

from tracewhy.renderers.layout import Layout, label, name, number
from tracewhy.units import fmt_ns, fmt_pct, printable

if TYPE_CHECKING:
    import polars as pl
    from rich.console import RenderableType

    from tracewhy.analyses.critical_path import CriticalPathResult
    from tracewhy.renderers.json_schema import rows

#: The columns of ``on_path[]`` and ``gains[]`` in the payload (the step is the enclosing entry).
_ON_PATH_FIELDS = ("id", "name", "kind", "category", "family", "ts_ns", "dur_ns", "on_path_ns")
_GAIN_FIELDS = ("category", "name", "count", "on_path_ns", "gain_ns")
#: Columns of ``critical_path_items`` beside category, name, count and on_path_ns.
GAIN_PER_STEP: Final = "gain_ns_per_step"  # mean saving over the steps where it was replayed
REPLAYED: Final = "replayed_steps"


class Composition(TypedDict):
    """A step's path time by category (analyses.critical_path.Category), ns each."""

    host_ops: int
    launch_overhead: int
    kernels: int
    communication: int
    copies: int
    sync: int
    kernel_gap: int
    idle: int
    #: The kernels' time by family.
    kernel_families: dict[str, int]


class OnPathItem(TypedDict):
    """A slice on the path."""

    id: int | None
    name: str | None
    kind: str | None
    category: str
    family: str | None
    ts_ns: int | None
    dur_ns: int | None
    #: Its time on the path.
    on_path_ns: int


class PathGain(TypedDict):
    """A name on the path: its instances' time on it, and the step time saved if they took none;
    or (category ``part``) a part of the step account: its time on the path, and the step time
    saved with the fix ``diagnose`` predicts for it (the finding that explains it says the same)."""

    #: A category, or ``part``.
    category: str
    name: str | None
    count: int
    on_path_ns: int
    #: Null where not replayed.
    gain_ns: int | None


class _PathStep(TypedDict):
    #: The step's index among the trace's steps.
    step: int
    number: int | None
    steady: bool
    window_start_ns: int
    window_end_ns: int
    window_ns: int
    #: The time the path covers: the window's length when ``determined``.
    total_ns: int
    determined: bool
    composition: Composition


class PathStep(_PathStep):
    """One step's critical path."""

    #: The slices on the path, in time order.
    on_path: list[OnPathItem]
    gains: list[PathGain]


class CriticalPathPayload(TypedDict):
    """``critical-path``: the critical path of each step, what it is made of, what lies on it and
    what removing each item would save."""

    marker: str
    note: str | None
    #: Edges left out because their end precedes their start (host and GPU clocks disagree).
    dropped_edges: int
    steps: list[PathStep]


class CriticalPathReport(TypedDict):
    """The report's critical-path section: the steps without their lists, and the items summed
    over the steps."""

    marker: str
    note: str | None
    dropped_edges: int
    steps: list[_PathStep]
    #: The categories in stacking order.
    categories: list[str]
    steps_total: int
    items: Annotated[pl.DataFrame, rows({"category": pl.String(), "name": pl.String(), "count": pl.Int64(),
                                         "on_path_ns": pl.Int64(), GAIN_PER_STEP: pl.Int64(), REPLAYED: pl.Int64()},
                                        "what lies on the path summed over the steps, most time on it first")]
    #: Which steps were analysed, when not all were.
    scope: str | None


def critical_path_payload(r: CriticalPathResult) -> CriticalPathPayload:
    """The JSON of ``critical-path``: ``steps[]``, each with its window, ``total_ns`` (the time the
    path covers: the window's length when ``determined``), ``composition`` (ns per category, and
    per kernel family under ``kernel_families``), ``on_path[]`` (slices, in time order) and
    ``gains[]`` (per name on the path, ``gain_ns``: step time saved if all its instances in the
    step took no time, null where not replayed)."""
    from tracewhy.analyses.critical_path import PathCol

    on_path = r.on_path.partition_by(PathCol.STEP, as_dict=True, maintain_order=True)
    gains = r.gains.partition_by(PathCol.STEP, as_dict=True, maintain_order=True)
    steps: list[PathStep] = [
        {**step, "on_path": _rows(on_path.get((step["step"],)), _ON_PATH_FIELDS),
         "gains": _rows(gains.get((step["step"],)), _GAIN_FIELDS)}
        for step in _path_steps(r)
    ]
    return {"marker": r.marker, "note": r.note, "dropped_edges": r.dropped_edges, "steps": steps}


def _path_steps(r: CriticalPathResult) -> list[_PathStep]:
    """Each step's window, the time the path covers and its composition."""
    from tracewhy.analyses.critical_path import CATEGORIES, CATEGORY_NS, PathCol

    families = r.families.partition_by(PathCol.STEP, as_dict=True, maintain_order=True)
    out: list[_PathStep] = []
    for row in r.steps.iter_rows(named=True):
        fam = families.get((row[PathCol.STEP],))
        composition: dict[str, Any] = {c: row[CATEGORY_NS[c]] for c in CATEGORIES}
        composition["kernel_families"] = dict(fam.select(PathCol.FAMILY, PathCol.NS).iter_rows()) \
            if fam is not None else {}
        out.append({
            "step": row[PathCol.STEP], "number": row[PathCol.NUMBER], "steady": row[PathCol.STEADY],
            "window_start_ns": row[PathCol.WINDOW_START], "window_end_ns": row[PathCol.WINDOW_END],
            "window_ns": row[PathCol.WINDOW], "total_ns": row[PathCol.TOTAL], "determined": row[PathCol.DETERMINED],
            "composition": cast("Composition", composition),
        })
    return out


def critical_path_report_payload(r: CriticalPathResult, top: int) -> CriticalPathReport:
    """The report's section: the ``critical-path --json`` document without its per-step lists,
    with ``items`` instead (what lies on the path summed over the steps, the ``top`` with most
    time on it), the categories in stacking order, and ``scope``: which steps were analysed
    when not all were."""
    from tracewhy.analyses.critical_path import CATEGORIES, MAX_PATH_STEPS

    shown, total = r.steps.height, r.steps_total
    return {
        "marker": r.marker, "note": r.note, "dropped_edges": r.dropped_edges, "steps": _path_steps(r),
        "categories": list(CATEGORIES), "steps_total": total, "items": critical_path_items(r).head(top),
        "scope": f"The path of {shown} of the {total} steps (steady ones first); tracewhy critical-path "
                 f"analyses up to {MAX_PATH_STEPS}." if shown < total else None,
    }


def critical_path_items(r: CriticalPathResult) -> pl.DataFrame:
    """What lies on the path, summed over the analysed steps, by time on it: category, name,
    count, on_path_ns, and the step time saved per step if the item took no time
    (``GAIN_PER_STEP``, the mean over the ``REPLAYED`` steps where it was replayed)."""
    import polars as pl

    from tracewhy.analyses.critical_path import PART_GAIN_CATEGORY, PathCol
    from tracewhy.model.schema import Col

    return r.gains.filter(pl.col(PathCol.CATEGORY) != PART_GAIN_CATEGORY).group_by(PathCol.CATEGORY, Col.NAME).agg(
        pl.col(PathCol.COUNT).sum(), pl.col(PathCol.ON_PATH).sum(),
        pl.col(PathCol.GAIN).mean().round(0).cast(pl.Int64).alias(GAIN_PER_STEP),
        pl.col(PathCol.GAIN).is_not_null().sum().cast(pl.Int64).alias(REPLAYED),
    ).sort(PathCol.ON_PATH, PathCol.CATEGORY, Col.NAME, descending=[True, False, False])


def _rows(frame: Any, fields: tuple[str, ...]) -> list[Any]:
    if frame is None:
        return []
    listed: list[Any] = frame.select(fields).to_dicts()
    return listed


def _steps_layout() -> Layout:
    """``critical-path`` per step: the step, its total and the categories that hold most of a step
    stay; the window (the total covers it) and the waits leave a narrow terminal first."""
    from tracewhy.analyses.critical_path import CATEGORIES, Category

    least_first = (Category.KERNEL_GAP, Category.SYNC, Category.IDLE, Category.COPIES, Category.LAUNCH,
                   Category.COMMUNICATION, Category.HOST_OPS, Category.KERNELS)
    columns = (label("step", "right"), number("window"), number("total"), *(number(_header(c)) for c in CATEGORIES))
    return Layout(columns, drop=("window", *(_header(c) for c in least_first if c in CATEGORIES)))


def _header(category: str) -> str:
    return category.replace("_", " ")


#: ``critical-path``: what lies on the path; the count leaves first.
ITEMS_TABLE: Final = Layout(
    (name("name"), label("category"), number("count"), number("on path"), number("saves/step")), drop=("count",))


def render_critical_path(r: CriticalPathResult, top: int) -> RenderableType:
    """Per step a line of totals, then the composition over all steps, then the items on the
    path with the most time and what removing each would save."""
    from rich.console import Group
    from rich.text import Text

    from tracewhy.analyses.critical_path import CATEGORIES, CATEGORY_NS, PathCol

    parts: list[RenderableType] = []
    if r.steps.height == 0:
        parts.append(Text(f"no steps to analyse ({printable(r.marker)})"))
    else:
        t = _steps_layout().table(f"critical path per step ({r.marker})",
                                  "total: the time the path covers; it equals the window where every wait on it "
                                  "is explained by the trace")
        for row in r.steps.head(top).iter_rows(named=True):
            step_number = row[PathCol.NUMBER]
            step_label = f"#{step_number}" if step_number is not None else str(row[PathCol.STEP])
            t.add_row(step_label + ("" if row[PathCol.STEADY] else " (warm-up)"), fmt_ns(row[PathCol.WINDOW]),
                      fmt_ns(row[PathCol.TOTAL]) + ("" if row[PathCol.DETERMINED] else " *"),
                      *(_share(row[CATEGORY_NS[c]], row[PathCol.TOTAL]) for c in CATEGORIES))
        parts.append(t)
        parts.append(_items_table(r, top))
        part_rows = _parts_table(r)
        if part_rows is not None:
            parts.append(part_rows)
    if r.note:
        parts.append(Text(f"note: {printable(r.note)}", style="yellow"))
    return Group(*parts)


def _share(ns: int, total: int) -> str:
    return f"{fmt_ns(ns)} ({fmt_pct(ns / total)})" if ns and total else "-"


def _items_table(r: CriticalPathResult, top: int) -> RenderableType:
    """What lies on the path, summed over the steps, by time on it; the saving summed where it
    was replayed in every step."""
    from rich.text import Text

    from tracewhy.analyses.critical_path import PathCol
    from tracewhy.model.schema import Col

    if r.gains.height == 0:
        return Text("nothing recorded lies on the path")
    steps = r.steps.height
    by_item = critical_path_items(r)
    t = ITEMS_TABLE.table(f"on the path, over {steps} step(s)",
                          notes={"saves/step": "saves: step time saved per step if the item took no time "
                                               "(replayed in the steps shown)"})
    for row in by_item.head(top).iter_rows(named=True):
        replayed = row[REPLAYED]
        saves = "-" if not replayed else fmt_ns(row[GAIN_PER_STEP]) + (
            "" if replayed == steps else f" ({replayed} steps)")
        t.add_row(row[Col.NAME], row[PathCol.CATEGORY], str(row[PathCol.COUNT]),
                  fmt_ns(row[PathCol.ON_PATH]), saves)
    return t


#: ``critical-path``: the step account's parts and what their fix saves.
PARTS_TABLE: Final = Layout((name("part"), number("on path"), number("fix saves/step")), drop=())


def _parts_table(r: CriticalPathResult) -> RenderableType | None:
    """The step account's largest avoidable parts, summed over the steps where they were replayed:
    time on the path and the step time the fix diagnose predicts for each saves."""
    import polars as pl

    from tracewhy.analyses.critical_path import PART_GAIN_CATEGORY, PathCol
    from tracewhy.model.schema import Col

    rows = r.gains.filter(pl.col(PathCol.CATEGORY) == PART_GAIN_CATEGORY)
    if rows.height == 0:
        return None
    by_part = rows.group_by(Col.NAME).agg(
        pl.col(PathCol.ON_PATH).mean().round(0).cast(pl.Int64), pl.col(PathCol.GAIN).mean().round(0).cast(pl.Int64),
        pl.len().alias(REPLAYED)).sort(PathCol.ON_PATH, Col.NAME, descending=[True, False])
    steps = int(by_part.get_column(REPLAYED).max())  # type: ignore[arg-type]
    t = PARTS_TABLE.table(f"step account parts, mean over the {steps} steps it replays",
                          notes={"fix saves/step": "fix saves: step time saved with the fix diagnose predicts for "
                                                   "the part (tracewhy account TRACE)"})
    for row in by_part.iter_rows(named=True):
        t.add_row(row[Col.NAME], fmt_ns(row[PathCol.ON_PATH]), fmt_ns(row[PathCol.GAIN]) if row[PathCol.GAIN]
                  is not None else "-")
    return t
