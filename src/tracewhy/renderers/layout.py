"""Tables that fit the terminal without cutting a number: every terminal table is a ``Layout``
(its columns, what kind of value each holds, and which may leave a narrow terminal, the least
needed first) filled row by row, and laid out when it is printed, for the width it gets.

At a width where the table does not fit, in this order: headers wrap, step names shorten to
``#N`` (the caption says what ``#N`` is), free text wraps, the droppable columns leave (the
caption names them), and only then are names cut in the middle. Numbers, units and short labels
are never cut or wrapped. Under ``whole_names`` (``--wide``, piped output) nothing is dropped
or cut: the table is as wide as its content."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from tracewhy.renderers.names import ShownName, cut_middle, name_cells
from tracewhy.renderers.wrap import printable_lines, wrap_text
from tracewhy.units import names_whole, printable

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

#: What a column holds. number: a number with its unit (right-aligned, never cut); label: a short
#: word or code (never cut); name: a kernel, op, annotation or file name (shortened, cut last);
#: step: a step's name (``ProfilerStep#6``, shown as ``#6`` when space is short); text: free
#: text (wrapped, a number and its unit kept on one line).
Kind = Literal["number", "label", "name", "step", "text"]
#: Table looks: boxed (rich's default), simple (a rule under the header, no borders), plain
#: (no header, no borders: a list of ``key value`` lines).
Look = Literal["boxed", "simple", "plain"]

#: A name column is cut no narrower than this (or its longest name, if shorter).
NAME_FLOOR: Final = 16
#: On a terminal, a name column is no wider than this: a longer name keeps its head and tail
#: (what tells it apart) in this many characters rather than push every other column out.
NAME_WIDTH: Final = 60
#: A free-text column wraps no narrower than this (or its longest line, if shorter).
TEXT_FLOOR: Final = 20
#: A cell holds at most this many characters, the rest cut with an ellipsis, even under
#: ``--wide``: the longest real names (C++ template kernels) are under 2,000, and a 50 MB line
#: of a log would otherwise be laid out (wrapped, measured) whole. ``--json`` keeps it whole.
MAX_CELL_CHARS: Final = 4_000
#: How a table says that it left columns out, and how to see them.
DROPPED_NOTE: Final = "not shown at this width: {columns} (--wide, --json or a wider terminal shows them)"

_STEP: Final = re.compile(r"^(?P<marker>.*\S)#(?P<number>\d+)(?P<rest>.*)$")


@dataclass(frozen=True)
class Column:
    header: str
    kind: Kind = "number"
    justify: Literal["left", "right"] | None = None  # default: numbers right, the rest left
    style: str | None = None


def number(header: str) -> Column:
    return Column(header, "number")


def label(header: str, justify: Literal["left", "right"] | None = None) -> Column:
    return Column(header, "label", justify)


def name(header: str) -> Column:
    return Column(header, "name")


def step(header: str = "step") -> Column:
    return Column(header, "step")


def text(header: str, style: str | None = None) -> Column:
    return Column(header, "text", style=style)


@dataclass(frozen=True)
class Layout:
    """One table's columns, in display order, and ``drop``: the headers of the columns that may
    leave a narrow terminal, the least needed first (the others always stay)."""

    columns: tuple[Column, ...]
    drop: tuple[str, ...] = ()
    look: Look = "boxed"
    show_lines: bool = False

    def __post_init__(self) -> None:
        unknown = [h for h in self.drop if h not in {c.header for c in self.columns}]
        if unknown:
            raise ValueError(f"layout: drop names no column: {unknown}")

    def table(self, title: str | None = None, caption: str | None = None, omit: Sequence[str] = (),
              notes: dict[str, str] | None = None, rename: dict[str, str] | None = None) -> FitTable:
        """An empty table of this layout; ``omit``: columns this table does not have (no GPU
        columns on a CPU-only trace); ``notes``: caption lines about a column, shown while it is;
        ``rename``: headers this table shows in place of the layout's (``per step``)."""
        return FitTable(self, title, caption, tuple(omit), notes or {}, rename or {})


@dataclass
class _Plan:
    columns: list[int]
    widths: dict[int, int]
    compact_steps: bool = False
    dropped: list[str] = field(default_factory=list)


class FitTable:
    """A table laid out for the width it is printed at (``Layout``): rows are added with
    ``add_row``, one cell per column of the layout that is not omitted."""

    def __init__(self, layout: Layout, title: str | None, caption: str | None, omit: tuple[str, ...],
                 notes: dict[str, str], rename: dict[str, str]) -> None:
        self.layout = layout
        self.title = title
        self.caption = caption
        self.notes = notes
        self.columns = [c for c in layout.columns if c.header not in omit]
        self.headers = [rename.get(c.header, c.header) for c in self.columns]
        self.rows: list[tuple[str | Text | None, ...]] = []
        self._names: dict[tuple[int, bool], list[ShownName]] = {}

    def add_row(self, *cells: str | Text | None) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"row of {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(tuple(_bounded(c) for c in cells))

    # --- measuring ---------------------------------------------------------------------------

    def _raw(self, index: int) -> list[str]:
        """The column's cells as text (names, steps and text made printable; none shown as -)."""
        kind = self.columns[index].kind
        if kind in ("name", "step", "text"):
            return [_plain(row[index], lines=kind == "text") for row in self.rows]
        return ["" if v is None else printable(v) if isinstance(v, str) else v.plain
                for v in (row[index] for row in self.rows)]

    def names(self, index: int) -> list[ShownName]:
        key = (index, names_whole())
        if key not in self._names:
            self._names[key] = name_cells([_plain(row[index]) for row in self.rows])
        return self._names[key]

    def _content(self, index: int, compact: bool = False) -> int:
        from rich.cells import cell_len

        column = self.columns[index]
        if column.kind == "name":
            values = [n.text for n in self.names(index)]
        elif column.kind == "step" and compact:
            values = [_compact_step(v) for v in self._raw(index)]
        else:
            values = [line for v in self._raw(index) for line in v.split("\n")]
        return max((cell_len(v) for v in values), default=1)

    def _tells_nothing(self, header: str) -> bool:
        index = next((i for i, c in enumerate(self.columns) if c.header == header), None)
        if index is None:
            return False
        values = {v.strip() for v in self._raw(index)}
        return values <= {"", "-"} or (len(values) == 1 and len(self.rows) > 1)

    def _step_marker(self, index: int) -> str | None:
        """The marker every step name of the column has (``ProfilerStep``), or None when they do
        not all read ``MARKER#N``: then they cannot be shortened to ``#N`` without loss."""
        found = {m.group("marker") if m else None for v in self._raw(index) if v != "-"
                 for m in [_STEP.match(v)]}
        return found.pop() if len(found) == 1 and None not in found else None

    def _overhead(self, count: int) -> int:
        """Cells of one line that are not column content: borders and padding."""
        look = self.layout.look
        edges = 0 if look != "boxed" else 2 + count - 1
        if look == "boxed":
            return edges + 2 * count
        if look == "simple":  # a space between columns, padding (0, 0, 0, 1) but at the left edge
            return 2 * max(count - 1, 0)
        return 2 * count - 2 if count else 0  # plain: padding (0, 1), no pad at the edges

    def _plan(self, width: int | None) -> _Plan:
        cols = list(range(len(self.columns)))
        header_full = {i: len(self.headers[i]) if self.layout.look != "plain" else 0 for i in cols}
        header_word = {i: max((len(w) for w in self.headers[i].split()), default=0)
                       if self.layout.look != "plain" else 0 for i in cols}
        natural = {i: self._content(i) for i in cols}
        if width is not None:
            natural.update({i: min(natural[i], NAME_WIDTH) for i in cols if self.columns[i].kind == "name"})
        plan = _Plan(cols, {i: max(natural[i], header_full[i]) for i in cols})

        def total() -> int:
            return sum(plan.widths[i] for i in plan.columns) + self._overhead(len(plan.columns))

        if width is None or total() <= width:
            return plan
        plan.widths = {i: max(natural[i], header_word[i]) for i in cols}
        steps = [i for i in cols if self.columns[i].kind == "step" and self._step_marker(i) is not None]
        if steps and total() > width:
            plan.compact_steps = True
            for i in steps:
                plan.widths[i] = max(self._content(i, compact=True), header_word[i])
        for i in cols:
            if self.columns[i].kind == "text" and total() > width:
                plan.widths[i] = max(min(natural[i], TEXT_FLOOR), header_word[i])
        # Droppable columns that tell the rows nothing (empty, or one value in every row: the
        # device of a one-GPU trace) leave first.
        idle = [h for h in self.layout.drop if self._tells_nothing(h)]
        for header in (*idle, *(h for h in self.layout.drop if h not in idle)):
            if total() <= width:
                break
            index = next((i for i in plan.columns if self.columns[i].header == header), None)
            if index is not None:
                plan.columns.remove(index)
                plan.dropped.append(self.headers[index])
        # Step names that do not read MARKER#N are cut as names are.
        names = [i for i in plan.columns if self.columns[i].kind == "name"
                 or (self.columns[i].kind == "step" and i not in steps)]
        if names and total() > width:
            floor = {i: max(min(natural[i], NAME_FLOOR), header_word[i]) for i in names}
            room = width - (total() - sum(plan.widths[i] for i in names))
            spare = max(room - sum(floor.values()), 0)
            want = {i: natural[i] - floor[i] for i in names}
            for i in names:
                share = spare * want[i] // max(sum(want.values()), 1)
                plan.widths[i] = floor[i] + min(share, want[i])
        # What is left goes back: to headers that wrapped, then to text that wrapped.
        for i in plan.columns:
            grow = min(max(width - total(), 0), max(header_full[i] - plan.widths[i], 0))
            plan.widths[i] += grow
        texts = {i: natural[i] - plan.widths[i] for i in plan.columns
                 if self.columns[i].kind == "text" and natural[i] > plan.widths[i]}
        spare = max(width - total(), 0)
        for i, lacking in texts.items():  # shared by what each lacks, so no column wraps alone
            plan.widths[i] += min(lacking, spare * lacking // sum(texts.values()))
        return plan

    # --- drawing -----------------------------------------------------------------------------

    def build(self, width: int | None) -> Table:
        """The rich table for ``width`` columns (None: as wide as its content)."""
        from rich import box
        from rich.table import Table
        from rich.text import Text

        plan = self._plan(None if names_whole() else width)
        look = self.layout.look
        shown = {self.columns[i].header for i in plan.columns}
        notes = [self.caption] if self.caption else []
        notes += [note for header, note in self.notes.items() if header in shown]
        if plan.compact_steps:
            markers = sorted({m for i in plan.columns if self.columns[i].kind == "step"
                              for m in [self._step_marker(i)] if m})
            notes += [f"#N: {printable(m)}#N" for m in markers]
        if plan.dropped:
            notes.append(DROPPED_NOTE.format(columns=", ".join(plan.dropped)))
        table_width = sum(plan.widths[i] for i in plan.columns) + self._overhead(len(plan.columns))
        t = Table(
            title=_annotation(self.title, table_width, "table.title"),
            caption=_annotation("\n".join(notes), table_width, "table.caption") if notes else None,
            show_header=look != "plain", show_lines=self.layout.show_lines,
            box=None if look == "plain" else box.SIMPLE_HEAD if look == "simple" else box.HEAVY_HEAD,
            padding=(0, 0, 0, 1) if look == "simple" else (0, 1), pad_edge=look == "boxed",
            show_edge=look == "boxed",
        )
        for i in plan.columns:
            c = self.columns[i]
            justify = c.justify or ("right" if c.kind == "number" else "left")
            t.add_column(Text(self.headers[i], justify=justify, no_wrap=False), justify=justify,
                         width=plan.widths[i], style=c.style, no_wrap=c.kind != "text",
                         overflow="fold" if c.kind == "text" else "ellipsis")
        for r, row in enumerate(self.rows):
            t.add_row(*(self._cell(i, r, row[i], plan) for i in plan.columns))
        return t

    def _cell(self, index: int, row: int, value: str | Text | None, plan: _Plan) -> Text:
        from rich.text import Text

        kind = self.columns[index].kind
        width = plan.widths[index]
        if kind == "name":
            return Text(self.names(index)[row].cut(width), no_wrap=True, end="")
        if kind == "step":
            shown = _plain(value)
            shown = _compact_step(shown) if plan.compact_steps and self._step_marker(index) else shown
            return Text(cut_middle(shown, width), no_wrap=True, end="")
        if kind == "text":
            style = value.style if isinstance(value, Text) else ""
            return Text("\n".join(wrap_text(_plain(value, lines=True), width)), style=style, end="")
        if isinstance(value, str) or value is None:
            return Text(printable(value or ""), no_wrap=True, end="")
        return value

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        from rich.measure import Measurement

        plan = self._plan(None if names_whole() else options.max_width)
        width = sum(plan.widths[i] for i in plan.columns) + self._overhead(len(plan.columns))
        return Measurement(width, width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.build(options.max_width)


def _plain(value: str | Text | None, lines: bool = False) -> str:
    """A cell's text, printable; ``lines``: its own line breaks kept (free text)."""
    if value is None:
        return "-"
    if not isinstance(value, str):
        return value.plain
    return printable_lines(value) if lines else printable(value)


def _bounded(value: str | Text | None) -> str | Text | None:
    """The cell cut to ``MAX_CELL_CHARS`` characters, its last one an ellipsis."""
    if value is None or len(value) <= MAX_CELL_CHARS:
        return value
    if isinstance(value, str):
        return value[:MAX_CELL_CHARS - 1] + "…"
    cut = value[:MAX_CELL_CHARS - 1]
    cut.append("…")
    return cut


def _compact_step(value: str) -> str:
    m = _STEP.match(value)
    return f"#{m.group('number')}{m.group('rest')}" if m else value


def _annotation(text: str | None, width: int, style: str) -> Text | None:
    from rich.text import Text

    if not text:
        return None
    return Text("\n".join(wrap_text(printable_lines(text), max(width, 1))), style=style, justify="center")
