"""Result tables that cross a module boundary have declared schemas, and only the declaring
module spells their column names.

Each such result declares a column class (``StepCol``, ``WindowCol``, ``GapCol``, ...) and
``*_SCHEMA`` objects next to it. The first tests run every declared result on a real trace and
compare its tables with the declared schemas, names, order and dtypes. The source check reads
every module of the package and fails on a string literal, used as a column reference, that
names a declared result column outside the module that declares it: consumers write
``pl.col(StepCol.STEADY)``, never ``pl.col("steady")``. The checked names come from the
declared classes, so the check grows with them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Final

import polars as pl
import pytest
from tests.conftest import ROOT, shared_trace

import tracewhy
from tracewhy.analyses import account, blocks, gaps, kernels, ops, overlap, steps, what_if
from tracewhy.model import schema
from tracewhy.model.trace import Trace

#: A trace with steps, gaps, collectives overlapping compute, annotated blocks and op shapes.
TRACE: Final = "hta/a100_ddp2_rank0_nccl2.17.json.gz"
#: The modules that declare result column classes (``*Col``) and schemas (``*_SCHEMA``).
DECLARING: Final = (steps, gaps, overlap, kernels, ops, blocks, account, what_if)
PACKAGE: Final = ROOT / "src" / "tracewhy"


@cache
def _trace() -> Trace:
    return tracewhy.load(shared_trace(TRACE))


@cache
def _steps() -> steps.StepsResult:
    return steps.steps(_trace(), steps.StepsOptions(warmup=1))


@cache
def _tables() -> tuple[tuple[str, pl.DataFrame, pl.Schema], ...]:
    return tuple(_each_table())


def _each_table() -> Iterator[tuple[str, pl.DataFrame, pl.Schema]]:
    trace, st = _trace(), _steps()
    yield "steps", st.table, steps.STEPS_SCHEMA
    yield "step_windows", steps.step_windows(trace, st), steps.WINDOWS_SCHEMA
    g = gaps.gaps(trace, st)
    yield "gaps.gaps", g.gaps, gaps.GAPS_SCHEMA
    yield "gaps.per_step", g.per_step, gaps.GAP_STEPS_SCHEMA
    yield "gaps.short", g.short, gaps.GAP_SHORT_SCHEMA
    o = overlap.overlap(trace, steps_result=st)
    yield "overlap.devices", o.devices, overlap.OVERLAP_DEVICES_SCHEMA
    yield "overlap.steps", o.steps, overlap.OVERLAP_STEPS_SCHEMA
    yield "overlap.steady", o.steady, overlap.OVERLAP_STEADY_SCHEMA
    yield "overlap.collectives", o.collectives, overlap.OVERLAP_COLLECTIVES_SCHEMA
    yield "overlap.streams", o.streams, overlap.OVERLAP_STREAMS_SCHEMA
    yield "overlap.concurrency", o.concurrency, overlap.OVERLAP_CONCURRENCY_SCHEMA
    yield "overlap.bandwidth", o.bandwidth, overlap.BANDWIDTH_SCHEMA
    k = kernels.kernels(trace)
    yield "kernels.by_name", k.by_name, kernels.KERNELS_BY_NAME_SCHEMA
    yield "kernels.by_family", k.by_family, kernels.KERNELS_BY_FAMILY_SCHEMA
    yield "ops", ops.ops(trace).table, ops.OPS_SCHEMA
    yield "ops by shapes", ops.ops(trace, ops.OpsOptions(by_shapes=True)).table, ops.OPS_BY_SHAPES_SCHEMA
    b = blocks.blocks(trace, steps_result=st)
    yield "blocks.table", b.table, blocks.BLOCKS_SCHEMA
    yield "blocks.instances", b.instances, blocks.BLOCK_INSTANCES_SCHEMA
    model = account.step_model(trace, steps_result=st)
    a = account.step_account(trace, model=model)
    yield "account.windows", a.windows, account.ACCOUNT_WINDOWS_SCHEMA
    yield "account.parts", a.parts, account.ACCOUNT_PARTS_SCHEMA
    yield "account.per_step", a.per_step, account.ACCOUNT_PER_STEP_SCHEMA
    yield "account.evidence", a.evidence, account.ACCOUNT_EVIDENCE_SCHEMA
    yield "what_if.table", what_if.what_if(model, a).table, what_if.WHAT_IF_SCHEMA
    yield "what_if.part_gains", what_if.part_gains(model, [(p, k) for p, k in a.parts.select(
        account.AccountCol.PART, account.AccountCol.KIND).iter_rows()]), what_if.PART_GAINS_SCHEMA


@pytest.mark.parametrize("name", [
    "steps", "step_windows", "gaps.gaps", "gaps.per_step", "gaps.short", "overlap.devices", "overlap.steps",
    "overlap.steady", "overlap.collectives", "overlap.streams", "overlap.concurrency", "overlap.bandwidth",
    "kernels.by_name",
    "kernels.by_family", "ops", "ops by shapes", "blocks.table", "blocks.instances", "account.windows",
    "account.parts", "account.per_step", "account.evidence", "what_if.table", "what_if.part_gains",
])
def test_each_result_table_has_its_declared_schema(name: str) -> None:
    table, declared = next((t, s) for n, t, s in _tables() if n == name)
    assert table.height > 0, f"{name} is empty on {TRACE}: the schema check would be vacuous"
    assert table.schema == declared


def test_every_declared_schema_is_checked() -> None:
    checked = {id(s) for _, _, s in _tables()}
    declared = {f"{m.__name__}.{n}" for m in DECLARING for n, v in vars(m).items()
                if n.endswith("_SCHEMA") and not n.startswith("_") and isinstance(v, pl.Schema)
                and id(v) not in checked}
    assert declared == set()


def test_the_steady_span_is_the_steady_windows_extent() -> None:
    w = steps.step_windows(_trace(), _steps())
    steady = w.filter(pl.col(steps.WindowCol.STEADY))
    assert 0 < steady.height < w.height  # warm-up excluded, so the span is not the whole capture
    lo, hi = steady.row(0, named=True), steady.row(-1, named=True)
    span = (lo[steps.WindowCol.WINDOW_START], hi[steps.WindowCol.WINDOW_END])
    assert steps.steady_span(w) == span
    assert steps.steady_span(_steps().table, start=steps.StepCol.TS) == span  # one process: same windows
    assert steps.steady_span(w.head(0)) is None


# --- the source check ---------------------------------------------------------------------------

#: Model column names (model/schema.py declares them; result classes reuse them: StepCol.TS is
#: Col.TS). The model's own rule covers them.
MODEL_NAMES: Final = frozenset(
    v for c in vars(schema).values() if isinstance(c, type) and c.__name__.endswith("Col")
    for k, v in vars(c).items() if k.isupper() and isinstance(v, str)
)
#: Declared names that other, not yet declared tables also use for their own columns, in their own
#: meaning (nvtx ranges' count and total_ns, collectives' start_ns, per-step tables' step): a literal
#: of one of them does not say which table it reads. Each must still be declared (checked below).
SHARED_NAMES: Final = frozenset({
    "count", "total_ns", "mean_ns", "min_ns", "max_ns", "share", "calls", "family", "rule", "step", "start_ns",
    "time_ns", "level", "instances", "gpu_time_ns", "gpu_busy_ns", "ns", "ns_per_step", "gb_per_s",
})
#: Calls whose string arguments (and keyword arguments, and items of list or tuple arguments) name columns.
COLUMN_CALLS: Final = frozenset({
    "col", "get_column", "select", "sort", "alias", "drop", "group_by", "join", "join_asof", "unique", "over",
    "drop_nulls", "partition_by", "rename", "with_columns", "item", "explode",
})


def _declared() -> dict[str, set[str]]:
    """Each declared result column name, with the modules (dotted names) whose column classes
    spell it (a class that reuses another's constant, ``GapCol.STEADY = StepCol.STEADY``, does not)."""
    out: dict[str, set[str]] = {}
    for module in DECLARING:
        path = Path(str(module.__file__))
        for cls in ast.parse(path.read_text()).body:
            if not (isinstance(cls, ast.ClassDef) and cls.name.endswith("Col")):
                continue
            for node in cls.body:
                value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    out.setdefault(value.value, set()).add(module.__name__)
    return out


def _checked() -> dict[str, set[str]]:
    return {n: m for n, m in _declared().items() if n not in MODEL_NAMES and n not in SHARED_NAMES
            and not n.startswith("_")}


def _column_literals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of every string used as a column reference: an argument of a COLUMN_CALLS
    call, a subscript (``row["steady"]``), or the left side of ``in frame.columns``."""

    def strings(node: ast.AST) -> Iterator[ast.Constant]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            for e in node.elts:
                yield from strings(e)
        elif isinstance(node, ast.Dict):  # rename({old: new})
            for item in [*node.keys, *node.values]:
                if item is not None:
                    yield from strings(item)

    for node in ast.walk(tree):
        found: list[ast.Constant] = []
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in COLUMN_CALLS:
                for a in [*node.args, *(k.value for k in node.keywords)]:
                    found += strings(a)
        elif isinstance(node, ast.Subscript) and not _is_literal_type(node):
            found += strings(node.slice)
        elif (isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops)
              and any(isinstance(c, ast.Attribute) and c.attr == "columns" for c in node.comparators)):
            found += strings(node.left)
        for c in found:
            yield c.lineno, str(c.value)


def _is_literal_type(node: ast.Subscript) -> bool:
    """``Literal["number", "label"]``: a type's values, not a column looked up."""
    f = node.value
    return (f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "") == "Literal"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def test_no_module_spells_another_modules_result_columns() -> None:
    checked = _checked()
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for line, text in _column_literals(ast.parse(path.read_text(), str(path))):
            if text in checked and module not in checked[text]:
                owner = " or ".join(sorted(checked[text]))
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {text!r} is a column of {owner}: use its constant")
    assert wrong == []


def test_the_source_check_sees_what_it_must() -> None:
    # The check finds a bare column name in each place a consumer writes one...
    source = ('pl.col("steady"); t.get_column("window_end_ns"); t.select(["gap_class"]); row["window_start_ns"]\n'
              'x = "comm_exposed_ns" in t.columns; t.join(w, on=["step_id"]); t.rename({"span_ns": "x"})\n')
    found = {text for _, text in _column_literals(ast.parse(source))}
    assert found == {"steady", "window_end_ns", "gap_class", "window_start_ns", "comm_exposed_ns", "step_id",
                     "span_ns", "x"}
    assert found - {"x"} <= set(_checked())
    # ...and the checked list comes from the declared classes: the windows' end and the steady flag
    # are in it, a temporary column is not, and every shared name is a declared one.
    assert {steps.WindowCol.WINDOW_END, steps.StepCol.STEADY, gaps.GapCol.GAP_CLASS} <= set(_checked())
    assert set(_declared()) >= SHARED_NAMES
    assert _checked()[steps.StepCol.STEADY] == {steps.__name__}
