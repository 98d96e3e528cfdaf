"""The trace as SQL tables, and a DuckDB query over them (``tracewhy sql``).

Tables: slices, kernels, copies, ops, memory, steps, gaps, findings, their columns named as in
the model and the analyses' declared result schemas (``SQL_SCHEMAS``), times in int64 ns as
``ts_ns``/``dur_ns``, names as plain strings. A table is built only when a query names it and
reaches DuckDB through the Arrow C stream of its polars frame, without a copy and without
pyarrow. DuckDB is an optional extra: it is imported when a query runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import polars as pl

from tracewhy.analyses.families import classify_kernels
from tracewhy.analyses.gaps import GAPS_SCHEMA, GapCol, GapsResult
from tracewhy.analyses.kernels import KernelCol
from tracewhy.analyses.ops import OpCol
from tracewhy.analyses.steps import STEPS_SCHEMA, StepsResult
from tracewhy.errors import UsageError
from tracewhy.model.schema import (
    COPY_ATTRS_SCHEMA,
    GPU_ACTIVITY_KINDS,
    KERNEL_ATTRS_SCHEMA,
    MEMORY_SCHEMA,
    OP_ATTRS_SCHEMA,
    SLICES_SCHEMA,
    Col,
    CopyAttrCol,
    Kind,
    LaunchAttrCol,
)
from tracewhy.model.trace import Trace
from tracewhy.rows import Rows


class Table:
    """The names a query uses for the tables."""

    SLICES: Final = "slices"
    KERNELS: Final = "kernels"
    COPIES: Final = "copies"
    OPS: Final = "ops"
    MEMORY: Final = "memory"
    STEPS: Final = "steps"
    GAPS: Final = "gaps"
    FINDINGS: Final = "findings"


class FindingCol:
    """Columns of the findings table: one row per finding of ``diagnose``, in its order."""

    RANK: Final = "rank"  # 1 = the first finding diagnose prints
    CODE: Final = "code"
    SEVERITY: Final = "severity"
    STATEMENT: Final = "statement"
    RECOVERABLE: Final = "recoverable_ns_per_step"
    NEXT_STEP: Final = "next_step"


#: The columns every GPU activity table (kernels, copies) takes from the slices.
_GPU_COLUMNS: Final = (Col.ID, Col.NAME, Col.TS, Col.DUR, Col.PID, Col.TID, Col.DEVICE, Col.STREAM,
                       Col.CORRELATION, Col.EXTERNAL_ID, Col.LAUNCH, Col.OP)
#: The columns the ops table takes from the slices: op_id is the enclosing CPU op.
_OP_COLUMNS: Final = (Col.ID, Col.NAME, Col.TS, Col.DUR, Col.PID, Col.TID, Col.DEPTH, Col.PARENT, Col.OP,
                      Col.CORRELATION, Col.EXTERNAL_ID)


def _strings(schema: pl.Schema) -> dict[str, pl.DataType]:
    """A schema with its categorical and enum columns as plain strings (what SQL compares)."""
    return {name: pl.String() if isinstance(dtype, (pl.Categorical, pl.Enum)) else dtype
            for name, dtype in schema.items()}


def _pick(schema: pl.Schema, names: tuple[str, ...]) -> dict[str, pl.DataType]:
    plain = _strings(schema)
    return {name: plain[name] for name in names}


def _attrs(schema: pl.Schema) -> dict[str, pl.DataType]:
    """A side table's attribute columns (all but its slice id)."""
    return {name: dtype for name, dtype in _strings(schema).items() if name != Col.ID}


#: The columns steps and gaps share so that they join: a step's position in time order.
STEP_INDEX: Final = GapCol.STEP

#: Every table's columns and dtypes, declared once; ``sql_tables`` builds exactly these.
SQL_SCHEMAS: Final[dict[str, pl.Schema]] = {
    Table.SLICES: pl.Schema(_strings(SLICES_SCHEMA)),
    Table.KERNELS: pl.Schema({
        **_pick(SLICES_SCHEMA, _GPU_COLUMNS[:2]), KernelCol.FAMILY: pl.String(), KernelCol.RULE: pl.String(),
        **_pick(SLICES_SCHEMA, _GPU_COLUMNS[2:]), **_attrs(KERNEL_ATTRS_SCHEMA),
    }),
    Table.COPIES: pl.Schema({
        **_pick(SLICES_SCHEMA, _GPU_COLUMNS[:1]), Col.KIND: pl.String(), **_pick(SLICES_SCHEMA, _GPU_COLUMNS[1:]),
        **_attrs(COPY_ATTRS_SCHEMA),
    }),
    Table.OPS: pl.Schema({
        **_pick(SLICES_SCHEMA, _OP_COLUMNS), OpCol.CPU_SELF: pl.Int64(), OpCol.GPU_SELF: pl.Int64(),
        **_attrs(OP_ATTRS_SCHEMA),
    }),
    Table.MEMORY: pl.Schema(_strings(MEMORY_SCHEMA)),
    Table.STEPS: pl.Schema({STEP_INDEX: pl.Int64(), **STEPS_SCHEMA}),
    # A gap's start is ts_ns here, as every interval's is in SQL (start_ns in gaps --json).
    Table.GAPS: pl.Schema({Col.TS if name == GapCol.START else name: dtype for name, dtype in GAPS_SCHEMA.items()}),
    Table.FINDINGS: pl.Schema({
        FindingCol.RANK: pl.Int64(), FindingCol.CODE: pl.String(), FindingCol.SEVERITY: pl.String(),
        FindingCol.STATEMENT: pl.String(), FindingCol.RECOVERABLE: pl.Int64(), FindingCol.NEXT_STEP: pl.String(),
    }),
}

SQL_TABLES: Final = tuple(SQL_SCHEMAS)

#: What a row of each table is, and where its columns come from (docs/commands/sql.md's reference says it).
TABLE_ROWS: Final[dict[str, str]] = {
    Table.SLICES: "one per timed event of every kind (the model's slices table): op_id is the innermost CPU op "
                  "around a slice or its launch, launch_id a GPU activity's runtime call, parent_id the enclosing "
                  "host slice",
    Table.KERNELS: "one per kernel, with the family and rule `kernels` gives it and its launch attributes "
                   "(null where the trace has none)",
    Table.COPIES: "one per memcpy and memset, with bytes, direction (copy_kind) and memory kinds",
    Table.OPS: "one per CPU op, with its self times as `ops` measures them (CPU self: its span less the CPU ops "
               "nested in it; GPU self: device time launched with it innermost) and its recorded attributes",
    Table.MEMORY: "one per allocator event (profile_memory); bytes is negative for a free",
    Table.STEPS: "one per step in time order, as `steps` measures it; step joins gaps.step",
    Table.GAPS: "one per GPU idle gap as `gaps` explains it (ts_ns is its start), with its time per class",
    Table.FINDINGS: "one per finding of `diagnose`, in its order (rank 1 first)",
}

#: What a table is built from, called at most once, only when a query names the table.
Builder = Callable[[], pl.DataFrame]


def sql_tables(trace: Trace, steps: Callable[[], StepsResult], gaps: Callable[[], GapsResult],
               findings: Builder) -> dict[str, Builder]:
    """Each table's builder. ``steps`` and ``gaps`` give the analyses (with the step options the
    caller chose); ``findings`` builds the findings table (findings are judged in a later stage)."""
    return {
        Table.SLICES: lambda: trace.slices.with_columns(pl.col(Col.KIND, Col.NAME).cast(pl.String)),
        Table.KERNELS: lambda: kernel_rows(trace),
        Table.COPIES: lambda: copy_rows(trace),
        Table.OPS: lambda: op_rows(trace),
        Table.MEMORY: lambda: trace.memory,
        Table.STEPS: lambda: steps().table.with_row_index(STEP_INDEX).with_columns(pl.col(STEP_INDEX).cast(pl.Int64)),
        Table.GAPS: lambda: gaps().gaps.rename({GapCol.START: Col.TS}).select(*SQL_SCHEMAS[Table.GAPS]),
        Table.FINDINGS: findings,
    }


def kernel_rows(trace: Trace) -> pl.DataFrame:
    """One row per kernel, with its family and rule (as ``kernels`` classifies it) and launch
    attributes (null where the trace has none)."""
    k = trace.of_kind(Kind.KERNEL).select(*_GPU_COLUMNS).with_columns(pl.col(Col.NAME).cast(pl.String))
    k = k.join(classify_kernels(trace), on=Col.ID, how="left").join(trace.kernel_attrs, on=LaunchAttrCol.ID, how="left")
    return k.select(*SQL_SCHEMAS[Table.KERNELS])


def copy_rows(trace: Trace) -> pl.DataFrame:
    """One row per memcpy and memset, with bytes, direction and memory kinds."""
    kinds = [k for k in GPU_ACTIVITY_KINDS if k is not Kind.KERNEL]
    c = trace.of_kind(*kinds).select(Col.KIND, *_GPU_COLUMNS)
    c = c.join(trace.copy_attrs, on=CopyAttrCol.ID, how="left")
    c = c.with_columns(pl.col(Col.KIND, Col.NAME, CopyAttrCol.COPY_KIND, CopyAttrCol.SRC_MEM,
                              CopyAttrCol.DST_MEM).cast(pl.String))
    return c.select(*SQL_SCHEMAS[Table.COPIES])


def op_rows(trace: Trace) -> pl.DataFrame:
    """One row per CPU op, with its self times as ``ops`` defines them: CPU self is its span less
    the CPU ops nested in it; GPU self is the device time launched with it innermost."""
    trace.require_whole()
    s = trace.slices
    ops = s.filter(pl.col(Col.KIND) == Kind.CPU_OP.value).select(*_OP_COLUMNS)
    children = ops.group_by(Col.OP).agg(pl.col(Col.DUR).sum().alias("_child_ns"))
    launched = (
        s.filter(pl.col(Col.KIND).is_in([k.value for k in GPU_ACTIVITY_KINDS]))
        .group_by(Col.OP).agg(pl.col(Col.DUR).sum().alias(OpCol.GPU_SELF))
    )
    ops = (
        ops.join(children, left_on=Col.ID, right_on=Col.OP, how="left")
        .join(launched, left_on=Col.ID, right_on=Col.OP, how="left")
        .with_columns(
            pl.col(Col.NAME).cast(pl.String),
            (pl.col(Col.DUR) - pl.col("_child_ns").fill_null(0)).clip(lower_bound=0).alias(OpCol.CPU_SELF),
            pl.col(OpCol.GPU_SELF).fill_null(0).cast(pl.Int64),
        )
        .join(trace.op_attrs, on=Col.ID, how="left")
    )
    return ops.select(*SQL_SCHEMAS[Table.OPS])


@dataclass(frozen=True)
class SqlResult(Rows, rows="table"):
    """A query's rows (``table``), DuckDB's type of each column, and the tables it read."""

    query: str
    table: pl.DataFrame
    column_types: tuple[str, ...]
    tables_used: tuple[str, ...]


INSTALL_HINT: Final = ("tracewhy sql needs DuckDB: pip install 'tracewhy[sql]' "
                       "(from a clone: pip install '.[sql]')")


def referenced_tables(query: str) -> tuple[str, ...]:
    """The tracewhy tables a query names. DuckDB says which (CTE names are not tables), binding
    the query against stand-in tables; where that binding fails (a join USING a column, which
    the stand-ins lack) every table whose name appears as a word is taken: building one more
    table costs time, never a wrong answer. A syntax error is the user's, reported here."""
    duckdb = _duckdb()
    try:
        names = {name.lower() for name in duckdb.get_table_names(query)}
    except duckdb.ParserException as e:
        raise UsageError(_one_line(e)) from None
    except duckdb.Error:
        names = {word.lower() for word in _WORD.findall(query)}
    return tuple(t for t in SQL_TABLES if t in names)


_WORD: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


#: The connection's settings, DuckDB's own (duckdb.org/docs/stable/operations_manual/securing_duckdb):
#: no file, URL or extension reached (read_text/read_csv/COPY TO/ATTACH/INSTALL/LOAD refused), no
#: Python variable read as a table, and the configuration locked so a query cannot SET it back.
#: The trace's tables are registered Arrow streams, which these settings leave readable.
SANDBOX: Final[dict[str, bool]] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "python_enable_replacements": False,
    "lock_configuration": True,
}


def run_query(query: str, builders: Mapping[str, Builder]) -> SqlResult:
    """Run ``query``, one statement, in a fresh in-memory DuckDB sandboxed by ``SANDBOX`` with
    the tables it names registered: only the trace's tables are visible. Errors in the query,
    and an escape the sandbox refuses, are UsageErrors of one line.
    """
    duckdb = _duckdb()
    _one_statement(duckdb, query)
    used = referenced_tables(query)
    con = duckdb.connect(config=dict(SANDBOX))
    try:
        for name in used:
            con.register(name, _ArrowStream(builders[name]()))
        try:
            relation = con.sql(query)
            if relation is None:  # a statement without a result (CREATE, SET on older DuckDB)
                return SqlResult(query, pl.DataFrame(), (), used)
            relation = _returnable(relation)
            types = tuple(str(t) for t in relation.types)
            frame = pl.DataFrame(relation)
        except duckdb.Error as e:
            raise UsageError(_one_line(e)) from None
        except pl.exceptions.PanicException as e:  # a type polars cannot import that _returnable missed
            raise UsageError(f"sql: a result column cannot be returned ({_one_line(e)}); CAST it to VARCHAR") from None
    finally:
        con.close()
    plain = _plain_numbers(frame)
    types = tuple(t if plain.schema[name] == frame.schema[name] else _DECIMAL_AS[type(plain.schema[name])]
                  for name, t in zip(frame.columns, types, strict=True))
    return SqlResult(query, plain, types, used)


def _one_statement(duckdb: Any, query: str) -> None:
    """A UsageError unless ``query`` is exactly one statement: DuckDB runs every statement of a
    string and returns the last, so a SELECT could ride behind anything else."""
    try:
        count = len(duckdb.extract_statements(query))
    except duckdb.ParserException as e:
        raise UsageError(_one_line(e)) from None
    if count != 1:
        raise UsageError(f"sql: give one statement per call ({count} found)")


class _ArrowStream:
    """A polars frame seen only through the Arrow PyCapsule stream: DuckDB reads a polars
    DataFrame itself through pyarrow, which tracewhy does not require."""

    def __init__(self, frame: pl.DataFrame) -> None:
        self.frame = frame

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        return self.frame.__arrow_c_stream__(requested_schema)


#: DuckDB types polars cannot import from Arrow (its import panics): returned as their text.
_AS_TEXT: Final = ("INTERVAL", "UNION")


def _returnable(relation: Any) -> Any:
    """The relation as a polars frame can take it: repeated column names numbered (``id``,
    ``id_2``; a join's two ``id`` columns would collide in the frame and in JSON rows), and
    columns of the ``_AS_TEXT`` types, alone or nested, cast to VARCHAR."""
    names: list[str] = list(relation.columns)
    unique = _numbered(names)
    as_text = [any(word in str(t) for word in _AS_TEXT) for t in relation.types]
    if unique == names and not any(as_text):
        return relation
    return relation.project(", ".join(
        f"{f'CAST(#{i} AS VARCHAR)' if text else f'#{i}'} AS {_quoted(name)}"
        for i, (name, text) in enumerate(zip(unique, as_text, strict=True), 1)
    ))


def _numbered(names: list[str]) -> list[str]:
    """Names made unique by a suffix ``_2``, ``_3``... on the second and later of a name."""
    taken = set(names)
    out: list[str] = []
    for name in names:
        candidate, n = name, 1
        while candidate in out or (candidate != name and candidate in taken):
            n += 1
            candidate = f"{name}_{n}"
        out.append(candidate)
    return out


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


#: The type a decimal column is reported as once ``_plain_numbers`` has converted it.
_DECIMAL_AS: Final[dict[type[pl.DataType], str]] = {pl.Int64: "BIGINT", pl.Float64: "DOUBLE"}


def _plain_numbers(frame: pl.DataFrame) -> pl.DataFrame:
    """DuckDB sums integers as HUGEINT, which arrives as a decimal: whole decimals become int64
    (floats when they do not fit), others floats, so sums print and serialize as numbers."""
    columns = []
    for name, dtype in frame.schema.items():
        if not isinstance(dtype, pl.Decimal):
            continue
        col = pl.col(name)
        if dtype.scale == 0:
            as_int = frame.get_column(name).cast(pl.Int64, strict=False)
            fits = as_int.null_count() == frame.get_column(name).null_count()
            columns.append(col.cast(pl.Int64) if fits else col.cast(pl.Float64))
        else:
            columns.append(col.cast(pl.Float64))
    return frame.with_columns(columns) if columns else frame


def _one_line(error: Exception) -> str:
    """DuckDB's message on one line, without its LINE/caret picture of the query."""
    lines = [line.strip() for line in str(error).splitlines()]
    kept = [line for line in lines if line and not line.startswith("LINE ") and set(line) != {"^"}]
    text = " ".join(kept)
    if "Catalog Error" in text:
        text += f" (tables: {', '.join(SQL_TABLES)})"
    return f"sql: {text}"


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    return duckdb
