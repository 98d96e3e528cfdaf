"""Per-slice lookups the step account's rules read (``account_parts``): each slice's kind name,
each kernel's family and each copy's attributes by slice id, held as codes rather than a Python
object per slice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.families import Family
from tracewhy.model.schema import Col, CopyAttrCol, Kind

I64 = npt.NDArray[np.int64]

#: Each kind's name at its code (the kind column's physical value).
_KIND_NAMES: Final = np.array([k.value for k in Kind], dtype=object)


class KindNames:
    """Slices' kind names by slice id, read through their codes (an object array of them was a
    pointer a slice: 67 MB on the 8 M slices of a large export)."""

    def __init__(self, codes: npt.NDArray[np.integer[Any]]) -> None:
        self.codes = codes

    def __getitem__(self, ids: Any) -> Any:
        return _KIND_NAMES[self.codes[ids]]


class KernelFamilies:
    """Each classified kernel's family by slice id, as sorted ids and codes (a dict of them held
    a Python int and entry per kernel: 0.1 GB for a million)."""

    def __init__(self, classes: pl.DataFrame) -> None:
        ids = classes.get_column(Col.ID).to_numpy()
        order = np.argsort(ids, kind="stable")
        families = classes.get_column("family")
        self.names: list[str] = families.unique(maintain_order=True).to_list()
        self.ids = ids[order]
        self.codes = families.replace_strict(self.names, list(range(len(self.names))),
                                             return_dtype=pl.Int32).to_numpy()[order]

    def of(self, kernel: int) -> str:
        """A kernel's family (the other family for a slice not classified); the last row of an id."""
        at = int(np.searchsorted(self.ids, kernel, side="right")) - 1
        return self.names[int(self.codes[at])] if at >= 0 and self.ids[at] == kernel else Family.OTHER.value


class CopyAttrs:
    """Each copy's attributes by slice id as ``(direction, source memory, destination memory,
    bytes)``, as the copy_attrs table has them (None where a value is missing; the last row of an
    id), held as columns: a dict of a tuple per copy held five Python objects a copy (0.3 M copies
    on a large export)."""

    def __init__(self, table: pl.DataFrame) -> None:
        ids = table.get_column(CopyAttrCol.ID).to_numpy()
        order = np.argsort(ids, kind="stable")
        self.ids = ids[order]
        #: Per text column, each row's code among ``names`` (-1: missing).
        self.codes: list[npt.NDArray[np.int16]] = []
        self.names: list[list[str]] = []
        for name in (CopyAttrCol.COPY_KIND, CopyAttrCol.SRC_MEM, CopyAttrCol.DST_MEM):
            column = table.get_column(name)  # (an Enum: COPY_ATTRS_SCHEMA; its codes index its categories)
            self.names.append(column.dtype.categories.to_list())  # type: ignore[attr-defined]
            self.codes.append(column.to_physical().cast(pl.Int16).fill_null(-1).to_numpy()[order])
        size = table.get_column(CopyAttrCol.BYTES)
        self._bytes = size.fill_null(0).to_numpy()[order]
        self._no_bytes = size.is_null().to_numpy()[order]

    def rows(self, slice_ids: I64) -> I64:
        """Each slice's row (-1: none)."""
        at = np.searchsorted(self.ids, slice_ids, side="right") - 1
        found = (at >= 0) & (self.ids[np.maximum(at, 0)] == slice_ids) if self.ids.size else np.zeros(at.size, bool)
        return np.where(found, at, -1)

    def bytes_of(self, slice_ids: I64) -> int:
        """The bytes these copies moved together (one without a row or a size: none)."""
        rows = self.rows(slice_ids)
        return int(self._bytes[rows[rows >= 0]].sum())

    def going(self, slice_ids: I64, direction: str | None) -> npt.NDArray[np.bool_]:
        """Which of these copies go ``direction`` ("DtoH"; None: those whose direction is not known)."""
        rows = self.rows(slice_ids)
        codes = np.where(rows >= 0, self.codes[0][np.maximum(rows, 0)] if self.codes[0].size else -1, -1)
        names = self.names[0]
        want = -1 if direction is None else names.index(direction) if direction in names else -2
        found: npt.NDArray[np.bool_] = codes == want
        return found

    def get(self, slice_id: int, default: Any = None) -> Any:
        row = int(self.rows(np.array([slice_id]))[0])
        if row < 0:
            return default
        texts = (self.names[k][c] if (c := int(codes[row])) >= 0 else None for k, codes in enumerate(self.codes))
        return (*texts, None if self._no_bytes[row] else int(self._bytes[row]))


def label_copies(out: npt.NDArray[np.int64], copies: I64, kinds: KindNames, attrs: CopyAttrs,
                 item: Callable[[str], int]) -> None:
    """Each copy's code in ``out``: ``item`` of its ``copy_label``, made once per distinct label. A
    copy's label is its kind's, direction's and memories' (not its bytes'); a large export has
    0.3 M copies and a few labels. Alike copies are found by one key of those four codes (a
    Python loop over the copies took 0.3 s there), and ``item`` is asked in the copies' order."""
    if copies.size == 0:
        return
    rows = attrs.rows(copies)
    has, safe = rows >= 0, np.maximum(rows, 0)
    key = kinds.codes[copies].astype(np.int64)
    for codes in attrs.codes:  # (each digit in [-2, 2^15): -1 missing, -2 no row)
        digit = np.where(has, codes[safe] if codes.size else -2, -2).astype(np.int64)
        key = key * 2**16 + digit + 2
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    code_of = np.empty(first.size, dtype=np.int64)
    for u in np.argsort(first, kind="stable").tolist():
        i = int(copies[first[u]])
        code_of[u] = item(copy_label(kinds[i], attrs.get(i)))
    out[copies] = code_of[inverse.reshape(-1)]


def copy_label(kind: Any, attrs: tuple[Any, ...] | None) -> str:
    """A copy's direction and, for a host transfer, the host memory's kind ("HtoD pinned"), from
    its slice kind and its copy attributes (direction, source and destination memory, ...)."""
    if kind == Kind.MEMSET.value:
        return "memset"
    if kind == Kind.KERNEL.value:
        return "copy kernels"
    direction, src_mem, dst_mem = attrs[:3] if attrs is not None else (None, None, None)
    if direction is None:
        return "unknown"
    host_mem = src_mem if direction.startswith("H") else dst_mem if direction.endswith("H") else None
    return f"{direction} {host_mem.lower()}" if host_mem else str(direction)
