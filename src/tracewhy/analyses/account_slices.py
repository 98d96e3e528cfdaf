"""Per-slice lookups the step account's rules read (``account_parts``): each slice's kind name and
each kernel's family by slice id, held as codes rather than a Python object per slice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.families import Family
from tracewhy.model.schema import Col, Kind

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


def label_copies(out: npt.NDArray[np.int64], copies: list[int], kinds: KindNames,
                 attrs_of: Callable[[int], tuple[Any, ...] | None], item: Callable[[str], int]) -> None:
    """Each copy's code in ``out``: ``item`` of its ``copy_label``, made once per distinct label. A
    copy's label is its kind's, direction's and memories' (not its bytes'); a large export has
    0.3 M copies and a few labels."""
    labels: dict[tuple[object, ...], int] = {}
    for i in copies:
        attrs = attrs_of(i)
        key = (kinds[i], attrs[:3] if attrs is not None else None)
        code = labels.get(key)
        if code is None:
            code = labels[key] = item(copy_label(kinds[i], attrs))
        out[i] = code


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
