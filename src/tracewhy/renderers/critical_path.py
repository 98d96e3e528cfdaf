"""``critical-path`` output: the JSON payload (per step: total, composition, what lies on the
path and what removing it would save), the report's section and the terminal tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from tracewhy.renderers.layout import Layout, label, name, number
from tracewhy.units import fmt_ns, fmt_pct, printable

if TYPE_CHECKING:
    import polars as pl
    from rich.console import RenderableType

    from tracewhy.analyses.critical_path import CriticalPathResult

#: The columns of ``on_path[]`` and ``gains[]`` in the payload (the step is the enclosing entry).
_ON_PATH_FIELDS = ("id", "name", "kind", "category", "family", "ts_ns", "dur_ns", "on_path_ns")
_GAIN_FIELDS = ("category", "name", "count", "on_path_ns", "gain_ns")
#: Columns of ``critical_path_items`` beside category, name, count and on_path_ns.
GAIN_PER_STEP: Final = "gain_ns_per_step"  # mean saving over the steps where it was replayed
REPLAYED: Final = "replayed_steps"


def critical_path_payload(r: CriticalPathResult, per_step_lists: bool = True) -> dict[str, Any]:
    """The JSON of ``critical-path``: ``steps[]``, each with its window, ``total_ns`` (the time the
    path covers: the window's length when ``determined``), ``composition`` (ns per category, and
    per kernel family under ``kernel_families``), ``on_path[]`` (slices, in time order) and
    ``gains[]`` (per name on the path, ``gain_ns``: step time saved if all its instances in the
    step took no time, null where not replayed); without ``per_step_lists``, neither list."""
    from tracewhy.analyses.critical_path import CATEGORIES, CATEGORY_NS, PathCol

    on_path = r.on_path.partition_by(PathCol.STEP, as_dict=True, maintain_order=True)
    gains = r.gains.partition_by(PathCol.STEP, as_dict=True, maintain_order=True)
    families = r.families.partition_by(PathCol.STEP, as_dict=True, maintain_order=True)
    steps: list[dict[str, Any]] = []
    for row in r.steps.iter_rows(named=True):
        key = (row[PathCol.STEP],)
        fam = families.get(key)
        composition: dict[str, Any] = {c: row[CATEGORY_NS[c]] for c in CATEGORIES}
        composition["kernel_families"] = dict(fam.select(PathCol.FAMILY, PathCol.NS).iter_rows()) \
            if fam is not None else {}
        step = {
            **{k: v for k, v in row.items() if not k.endswith("_ns") or k in (
                PathCol.WINDOW_START, PathCol.WINDOW_END, PathCol.WINDOW, PathCol.TOTAL)},
            "composition": composition,
        }
        if per_step_lists:
            step.update(on_path=_rows(on_path.get(key), _ON_PATH_FIELDS), gains=_rows(gains.get(key), _GAIN_FIELDS))
        steps.append(step)
    return {"marker": r.marker, "note": r.note, "dropped_edges": r.dropped_edges, "steps": steps}


def critical_path_report_payload(r: CriticalPathResult, rows: int) -> dict[str, Any]:
    """The report's section: the ``critical-path --json`` document without its per-step lists,
    with ``items`` instead (what lies on the path summed over the steps, the ``rows`` with most
    time on it), the categories in stacking order, and ``scope``: which steps were analysed
    when not all were."""
    from tracewhy.analyses.critical_path import CATEGORIES

    payload = critical_path_payload(r, per_step_lists=False)
    shown, total = r.steps.height, r.steps_total
    payload.update(
        categories=list(CATEGORIES), steps_total=total, items=critical_path_items(r).head(rows),
        scope=f"The path of {shown} of the {total} steps (steady ones first); tracewhy critical-path "
              "analyses every step." if shown < total else None,
    )
    return payload


def critical_path_items(r: CriticalPathResult) -> pl.DataFrame:
    """What lies on the path, summed over the analysed steps, by time on it: category, name,
    count, on_path_ns, and the step time saved per step if the item took no time
    (``GAIN_PER_STEP``, the mean over the ``REPLAYED`` steps where it was replayed)."""
    import polars as pl

    from tracewhy.analyses.critical_path import PathCol
    from tracewhy.model.schema import Col

    return r.gains.group_by(PathCol.CATEGORY, Col.NAME).agg(
        pl.col(PathCol.COUNT).sum(), pl.col(PathCol.ON_PATH).sum(),
        pl.col(PathCol.GAIN).mean().round(0).cast(pl.Int64).alias(GAIN_PER_STEP),
        pl.col(PathCol.GAIN).is_not_null().sum().cast(pl.Int64).alias(REPLAYED),
    ).sort(PathCol.ON_PATH, PathCol.CATEGORY, Col.NAME, descending=[True, False, False])


def _rows(frame: Any, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    if frame is None:
        return []
    rows: list[dict[str, Any]] = frame.select(fields).to_dicts()
    return rows


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
