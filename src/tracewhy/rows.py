"""What every result shares: its main rows. A result is sized and iterable over those rows,
indexable (``r[0]``, ``r[i:j]``, and ``r["name"]`` by its key where rows have one), gives them as
one table (``to_polars()``, ``to_pandas()``), and keeps its first ``n`` (``top(n)``).

A result class names its rows once, where it is declared::

    @dataclass(frozen=True)
    class StepsResult(Rows, rows="table", key="name"): ...

``rows`` is the field holding them (a dotted path for a nested one: ``"result.per_step"``), a
polars DataFrame (a row is a dict of its columns) or a sequence (of findings, devices, ...: a row
is the item); ``key`` the column or attribute ``r["..."]`` looks rows up by; ``ranked_by`` the
column whose largest values ``top`` keeps (the rows stay in their order), where the rows are not
already largest first. polars is imported only when a table is asked for: results without
tables (``which``'s) are made in runs that never import it.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Iterator, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from tracewhy.errors import install_hint

if TYPE_CHECKING:
    import polars as pl

R = TypeVar("R", bound="Rows")

#: What ``to_pandas`` needs beyond polars: pandas, and pyarrow, which polars converts through.
PANDAS_MODULES = ("pandas", "pyarrow")


class Rows:
    """A result with main rows (see the module's docstring). Always true, as before it had a
    length: test ``len(result)`` for rows."""

    _rows_path: ClassVar[tuple[str, ...]] = ()
    _key_path: ClassVar[tuple[str, ...]] = ()
    _ranked_by: ClassVar[str | None] = None

    def __init_subclass__(cls, *, rows: str | None = None, key: str | None = None, ranked_by: str | None = None,
                          **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if rows is not None:  # (a subclass of a result keeps its parent's rows)
            cls._rows_path = tuple(rows.split("."))
            cls._key_path = tuple(key.split(".")) if key else ()
            cls._ranked_by = ranked_by

    # --- the rows --------------------------------------------------------------------------------

    def _rows(self) -> Any:
        if not self._rows_path:
            raise TypeError(f"{type(self).__name__} names no rows (class {type(self).__name__}(Rows, rows=...))")
        value: Any = self
        for name in self._rows_path:
            value = getattr(value, name)
        return value

    def __len__(self) -> int:
        rows = self._rows()
        return int(rows.height) if _is_frame(rows) else len(rows)

    def __bool__(self) -> bool:
        return True

    def __iter__(self) -> Iterator[Any]:
        rows = self._rows()
        return rows.iter_rows(named=True) if _is_frame(rows) else iter(rows)

    def __getitem__(self, index: int | slice | str) -> Any:
        """Row ``index``; rows ``i:j`` (a DataFrame's slice, or a list); by key, the first row
        whose key is ``index`` (a KeyError naming the keys spelt closest when none is)."""
        if isinstance(index, str):
            return self._by_key(index)
        rows = self._rows()
        if not _is_frame(rows):
            return list(rows)[index] if isinstance(index, slice) else rows[index]
        if isinstance(index, slice):
            return rows[index]
        i = index + rows.height if index < 0 else index
        if not 0 <= i < rows.height:
            raise IndexError(f"row {index} of {rows.height}")
        return rows.row(i, named=True)

    def __contains__(self, item: object) -> bool:
        """For a key (a string, where rows have a key): whether a row has it; else whether
        ``item`` is one of the rows."""
        if isinstance(item, str) and self._key_path:
            return item in self._keys()
        return any(row == item for row in self)

    def _keys(self) -> list[Any]:
        rows = self._rows()
        if _is_frame(rows):
            return list(rows.get_column(self._key_path[0]).to_list())
        return [_plain(_attr(row, self._key_path)) for row in rows]

    def _by_key(self, key: str) -> Any:
        if not self._key_path:
            raise TypeError(f"{type(self).__name__}'s rows have no key: index them by number")
        keys = self._keys()
        for i, k in enumerate(keys):
            if k == key:
                return self[i]
        import difflib  # (only for a key that is not there)

        close = difflib.get_close_matches(key, [str(k) for k in keys if k is not None], n=3)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise KeyError(f"no row with {'.'.join(self._key_path)} {key!r}{hint}")

    # --- as a table ------------------------------------------------------------------------------

    def to_polars(self) -> pl.DataFrame:
        """The rows as one polars DataFrame: the table itself, or one row per item with its
        plain fields (strings, numbers, flags; enums as their values; a nested record's fields
        as ``record_field``)."""
        import polars as pl

        rows = self._rows()
        if _is_frame(rows):
            return rows  # type: ignore[no-any-return]
        return pl.DataFrame([_flat(row) for row in rows], infer_schema_length=None)

    def to_pandas(self) -> Any:
        """The rows as a pandas DataFrame (``to_polars()`` converted), or an ImportError naming
        the extra to install."""
        return frame_to_pandas(self.to_polars())

    def top(self: R, n: int | None) -> R:
        """This result with its first ``n`` rows only (None: all), the rest of it whole. Where the
        result ranks its rows by a column (gaps by duration), the ``n`` largest, in row order."""
        if n is None:
            return self
        if n < 0:
            raise ValueError(f"top must be >= 0, got {n}")
        rows = self._rows()
        if _is_frame(rows):
            if self._ranked_by is not None:
                import polars as pl

                kept = rows.with_row_index("_row").sort(self._ranked_by, descending=True, maintain_order=True) \
                    .head(n).get_column("_row").sort()
                rows = rows.select(pl.all().gather(kept))
            else:
                rows = rows.head(n)
        else:
            rows = type(rows)(rows[:n]) if isinstance(rows, (list, tuple)) else list(rows)[:n]
        topped: R = _replaced(self, self._rows_path, rows)
        return topped


def frame_to_pandas(frame: pl.DataFrame) -> Any:
    """``frame`` as a pandas DataFrame; an ImportError naming the extra to install when pandas or
    pyarrow is missing, rather than polars' own message."""
    for module in PANDAS_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            raise ImportError(f"to_pandas needs pandas and pyarrow, and {module} is missing: "
                              f"{install_hint('pandas')}") from None
    return frame.to_pandas()


def _is_frame(value: Any) -> bool:
    """Whether ``value`` is a polars DataFrame; a run that never imported polars holds none."""
    polars = sys.modules.get("polars")
    return polars is not None and isinstance(value, polars.DataFrame)


def _attr(value: Any, path: Sequence[str]) -> Any:
    for name in path:
        value = value[name] if isinstance(value, dict) else getattr(value, name)
    return value


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def _flat(row: Any, prefix: str = "") -> dict[str, Any]:
    """A row item's plain values by name: a record's (dataclass, or dict) scalar fields, lists of
    scalars, and nested records' fields under ``record_field``; tables and mappings left out."""
    if dataclasses.is_dataclass(row) and not isinstance(row, type):
        items = [(f.name, getattr(row, f.name)) for f in dataclasses.fields(row)]
    elif isinstance(row, dict):
        items = list(row.items())
    else:
        return {prefix.rstrip("_") or "value": _plain(row)}
    out: dict[str, Any] = {}
    for name, value in items:
        value = _plain(value)
        if value is None or isinstance(value, (str, int, float, bool)):
            out[prefix + name] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(_plain(v), (str, int, float, bool)) for v in value):
            out[prefix + name] = [_plain(v) for v in value]
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(_flat(value, f"{prefix}{name}_"))
    return out


def _replaced(value: Any, path: Sequence[str], new: Any) -> Any:
    """``value`` with the field at ``path`` (nested dataclasses) set to ``new``."""
    head, *rest = path
    return dataclasses.replace(value, **{head: _replaced(getattr(value, head), rest, new) if rest else new})
