"""The host slices torch.compile leaves in a trace, each with its role (region, compiled-code
wrapper, graph call, compile phase, resume function, CUDA graph launch, inductor CPU kernel),
and the step window a timestamp falls in: what the compile analysis counts, found once.
``compile_markers`` holds the names; this module decides which name plays which role.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses import compile_markers as M
from tracewhy.analyses.name_codes import PRETEST_MIN_NAMES
from tracewhy.analyses.steps import WindowCol
from tracewhy.analyses.thread_intervals import END
from tracewhy.model.schema import HOST_KINDS, Col, Kind
from tracewhy.model.trace import Trace

#: The column of a row's step: the index of its window in time order (null outside every window).
STEP_INDEX = "_step"
#: The column of a marked slice's role (a ``Role`` value).
ROLE = "_role"


class Role:
    """What a marked slice is to the compile analysis."""

    REGION: Final = "region"
    WRAPPER: Final = "wrapper"
    GRAPH_CALL: Final = "graph_call"
    COMPILE: Final = "compile"
    RESUME: Final = "resume"
    LAUNCH: Final = "graph_launch"
    CPU_KERNEL: Final = "cpu_kernel"


def _roles(names: list[str]) -> dict[str, str]:
    """Each marker name's role; names that are none are left out."""
    data_owners = frozenset(m.group(1) for n in names if (m := M.compile_data(n)))
    roles: dict[str, str] = {}
    for n in names:
        if M.REGION.match(n):
            roles[n] = Role.REGION
        elif n in M.RUNTIME_WRAPPERS:
            roles[n] = Role.WRAPPER
        elif M.GRAPH_CALL.match(n):
            roles[n] = Role.GRAPH_CALL
        elif M.is_compile_phase(n, data_owners):
            roles[n] = Role.COMPILE
        elif M.resume(n):
            roles[n] = Role.RESUME
        elif n in M.GRAPH_LAUNCH:
            roles[n] = Role.LAUNCH
        elif n == M.CPU_KERNEL_FRAME:
            roles[n] = Role.CPU_KERNEL
    return roles


def _may_have_a_role(names: pl.Series) -> pl.Series:
    """``names`` less those ``_roles`` gives none, found over the column at once by what every
    marker's name begins, ends or is, or holds (an nsys export's 16 k distinct range names, nearly
    none of them markers, each took up to eight tests one by one: ``marked_slices`` 11.9 CPU ms,
    2.7 with this pass first); few names are left as they are."""
    if names.len() < PRETEST_MIN_NAMES:
        return names
    data = names.filter(names.str.contains("compile_id=", literal=True))
    owners = [m.group(1) for n in data.to_list() if (m := M.compile_data(n))]
    exact = [*M.RUNTIME_WRAPPERS, *M.GRAPH_LAUNCH, M.CPU_KERNEL_FRAME, *owners]
    kept: pl.Series = names.filter(
        names.str.starts_with(f"{M.REGION_PREFIX}: ") | names.str.starts_with(M.GRAPH_CALL_PREFIX)
        | names.str.ends_with(M.DYNAMO_TIMED_SUFFIX) | names.str.contains("compile_id=", literal=True)
        | names.str.contains(M.RESUME_PREFIX, literal=True) | names.is_in(exact))
    return kept


def marked_slices(trace: Trace) -> pl.DataFrame:
    """Host slices with a compile role: the names are matched once over the distinct names,
    then only matching rows are copied and their names become strings (a 1 GB trace has 1.5 M
    host slices; a large nsys export 6.6 M, whose full-width copy was 0.6 GB)."""
    host_names = trace.kind_columns(HOST_KINDS, Col.NAME).get_column(Col.NAME).unique().drop_nulls().cast(pl.String)
    roles = _roles(_may_have_a_role(host_names).to_list())
    role_table = pl.DataFrame({Col.NAME: list(roles), ROLE: list(roles.values())},
                              schema={Col.NAME: pl.String, ROLE: pl.String})
    return (
        trace.slices_where(
            pl.col(Col.KIND).is_in([k.value for k in HOST_KINDS]) & pl.col(Col.NAME).is_in(list(roles)),
            Col.ID, Col.KIND, pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR, Col.PID, Col.TID, Col.PARENT)
        .with_columns((pl.col(Col.TS) + pl.col(Col.DUR)).alias(END))
        .join(role_table, on=Col.NAME, how="left")
    )


def step_of(ts: pl.Series, windows: pl.DataFrame) -> pl.Series:
    """Index of the window each timestamp falls in, null outside every window."""
    starts = windows.get_column(WindowCol.WINDOW_START).to_numpy()
    ends = windows.get_column(WindowCol.WINDOW_END).to_numpy()
    t = ts.to_numpy()
    i = np.searchsorted(starts, t, side="right") - 1
    inside = (i >= 0) & (t < ends[np.clip(i, 0, None)])
    index = pl.Series(STEP_INDEX, np.where(inside, i, -1), dtype=pl.Int64)
    return index.set(index == -1, None)


def anchors(trace: Trace, ids: np.ndarray) -> np.ndarray:
    """For each slice id, its nearest ancestor that is not a Python frame (the annotation or
    op that called it): regions under the same anchor belong to one forward. A region at top
    level is its own anchor: top-level regions of successive iterations are not one forward."""
    parent = trace.slices.get_column(Col.PARENT).fill_null(-1).to_numpy()
    is_python = (trace.slices.get_column(Col.KIND) == Kind.PYTHON.value).to_numpy()
    cur = parent[ids]
    while True:
        up = (cur >= 0) & is_python[np.clip(cur, 0, None)]
        if not up.any():
            return np.where(cur >= 0, cur, ids)
        cur = np.where(up, parent[np.clip(cur, 0, None)], cur)
