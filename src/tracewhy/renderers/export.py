"""What ``export --json`` prints: what was written, where, and what the annotated trace holds.
(The annotated trace itself is ``renderers.perfetto``'s.)"""

from __future__ import annotations

from typing import TypedDict


class ExportedTrace(TypedDict):
    """The annotated trace written with ``-o``, and the tracks tracewhy added to it."""

    path: str
    bytes: int
    gaps: int
    findings: int
    #: Annotation / NVTX ranges projected onto the GPU rows.
    projected_ranges: int
    #: GPUs with a utilization counter.
    gpus: int
    #: Steps whose critical path is a track.
    critical_path_steps: int


class ExportedTables(TypedDict):
    """The tables ``tracewhy sql`` queries, written with ``--parquet`` as DIRECTORY/TABLE.parquet."""

    directory: str
    tables: list[str]
    files: list[str]


class ExportPayload(TypedDict):
    """``export``: the annotated trace for Perfetto (``-o``) and the SQL tables as Parquet
    (``--parquet``), each null when not asked for."""

    trace: ExportedTrace | None
    parquet: ExportedTables | None
