"""Nsight Compute verdicts joined onto a trace's kernels by name.

Kineto names a kernel by its full demangled signature ("void at::native::vectorized_elementwise
_kernel<4, ...>(int, ...)"); ncu by its function name ("vectorized_elementwise_kernel") unless
run with --print-kernel-base demangled, and .ncu-rep files keep both. A trace kernel matches an
ncu kernel exactly (full signature) when it can, else by base name, but only when that base
name is unambiguous on both sides: many PyTorch kernels share one template.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from tracewhy.analyses.roofline import NcuRooflineResult
from tracewhy.model.ncu import NCol

#: ncu columns carried onto the trace's kernel rows, renamed with an "ncu_" prefix.
CARRIED: Final = ("bound", "reason", "launches", "total_ns", "sm_pct", "memory_pct", "dram_pct",
                  "roof_fraction", "achieved_occupancy_pct", "occupancy_limiter", "top_rule")


def kernel_base_name(name: str) -> str:
    """The bare function name of a kernel: no return type, namespaces, template or parameters."""
    depth = 0
    out: list[str] = []
    for ch in name.strip().replace("(anonymous namespace)", "anonymous"):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif ch == "(" and depth == 0:
            break  # the parameter list
        elif depth == 0:
            out.append(ch)
    text = "".join(out).strip()
    text = text.split(" ")[-1] if " " in text else text  # drop "void "
    return text.rsplit("::", 1)[-1]


def join_ncu(kernels: pl.DataFrame, ncu: NcuRooflineResult, name_column: str = "name") -> pl.DataFrame:
    """``kernels`` (one row per trace kernel name) with ncu_* columns and ``ncu_match``."""
    demangled = _demangled(ncu)
    table = ncu.kernels.select(NCol.NAME, *CARRIED)
    exact: dict[str, str] = {}
    for row in table.iter_rows(named=True):
        exact[row[NCol.NAME]] = row[NCol.NAME]
        for full in demangled.get(row[NCol.NAME], ()):
            exact[full] = row[NCol.NAME]
    base_groups: dict[str, set[str]] = {}
    for name in table.get_column(NCol.NAME).to_list():
        base_groups.setdefault(kernel_base_name(name), set()).add(name)
    names = kernels.get_column(name_column).to_list()
    trace_bases: dict[str, int] = {}
    for name in names:
        trace_bases[kernel_base_name(name)] = trace_bases.get(kernel_base_name(name), 0) + 1
    keys: list[str | None] = []
    how: list[str | None] = []
    for name in names:
        if name in exact:
            keys.append(exact[name])
            how.append("exact")
            continue
        base = kernel_base_name(name)
        candidates = base_groups.get(base, set())
        if len(candidates) == 1 and trace_bases[base] == 1:
            keys.append(next(iter(candidates)))
            how.append("base name")
        else:
            keys.append(None)
            how.append("ambiguous" if candidates else None)
    carried = table.rename({c: f"ncu_{c}" for c in CARRIED}).rename({NCol.NAME: "_ncu_key"})
    return (
        kernels.with_columns(pl.Series("_ncu_key", keys, dtype=pl.String), pl.Series("ncu_match", how, dtype=pl.String))
        .join(carried, on="_ncu_key", how="left")
        .drop("_ncu_key")
    )


def _demangled(ncu: NcuRooflineResult) -> dict[str, set[str]]:
    """ncu kernel name -> the full signatures its launches carry (``.ncu-rep`` only)."""
    pairs = ncu.launches.select(NCol.NAME, NCol.DEMANGLED).drop_nulls().unique()
    out: dict[str, set[str]] = {}
    for name, full in pairs.iter_rows():
        out.setdefault(name, set()).add(full)
    return out
