"""Which Nsight Compute kernel a trace's kernel is, by name (``findings.roofline.join_ncu``
carries the verdicts across).

Kineto names a kernel by its full demangled signature ("void at::native::vectorized_elementwise
_kernel<4, ...>(int, ...)"); ncu by its function name ("vectorized_elementwise_kernel") unless
run with --print-kernel-base demangled, and .ncu-rep files keep both. A trace kernel matches an
ncu kernel exactly (full signature) when it can, else by base name, but only when that base
name is unambiguous on both sides: many PyTorch kernels share one template.
"""

from __future__ import annotations

import polars as pl

from tracewhy.model.ncu import NcuCol


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


def match_ncu_names(trace_names: list[str], ncu_names: list[str],
                    demangled: dict[str, set[str]]) -> tuple[list[str | None], list[str | None]]:
    """For each trace kernel name: the ncu kernel name it matches, and how ("exact", "base name",
    "ambiguous" when its base name is shared, or None when ncu has no such kernel)."""
    exact: dict[str, str] = {}
    for name in ncu_names:
        exact[name] = name
        for full in demangled.get(name, ()):
            exact[full] = name
    base_groups: dict[str, set[str]] = {}
    for name in ncu_names:
        base_groups.setdefault(kernel_base_name(name), set()).add(name)
    trace_bases: dict[str, int] = {}
    for name in trace_names:
        trace_bases[kernel_base_name(name)] = trace_bases.get(kernel_base_name(name), 0) + 1
    keys: list[str | None] = []
    how: list[str | None] = []
    for name in trace_names:
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
    return keys, how


def demangled_names(launches: pl.DataFrame) -> dict[str, set[str]]:
    """ncu kernel name -> the full signatures its launches carry (``.ncu-rep`` only)."""
    pairs = launches.select(NcuCol.NAME, NcuCol.DEMANGLED).drop_nulls().unique()
    out: dict[str, set[str]] = {}
    for name, full in pairs.iter_rows():
        out.setdefault(name, set()).add(full)
    return out
