"""``export``: what ``export --json`` prints (what was written, where, and what the annotated
trace holds) and the lines that say it on stderr. The annotated trace itself is
``renderers.perfetto``'s, a table's Parquet bytes ``renderers.sql``'s."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    import polars as pl

    from tracewhy.reports.overview import Overview


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


def exported_trace(ov: Overview, path: str, size: int) -> ExportedTrace:
    """What the annotated trace written to ``path`` (``size`` bytes) holds beside the original events."""
    cp = ov.critical_path
    return {
        "path": path, "bytes": size, "gaps": ov.report.gaps.gaps.height,
        "findings": len(ov.report.findings), "projected_ranges": ov.projection.height,
        "gpus": len(ov.device_pids), "critical_path_steps": cp.steps.height if cp is not None else 0,
    }


def exported_trace_line(w: ExportedTrace) -> str:
    return (f"wrote {w['path']} ({w['bytes']:,} bytes): {w['gaps']} gaps, {w['findings']} findings, "
            f"{w['projected_ranges']} projected ranges, utilization of {w['gpus']} GPU(s), critical path of "
            f"{w['critical_path_steps']} step(s)\n")


def exported_tables(directory: str, written: list[Path]) -> ExportedTables:
    return {"directory": directory, "tables": [p.stem for p in written], "files": [str(p) for p in written]}


def exported_tables_line(t: ExportedTables) -> str:
    return f"wrote {len(t['files'])} tables to {t['directory']}: {', '.join(t['tables'])}\n"


def parquet_files(tables: list[tuple[str, Callable[[], pl.DataFrame]]]) -> list[tuple[str, Callable[[], bytes]]]:
    """Each table as ``NAME.parquet`` and a function making its bytes, so that one table at a time is built."""
    from tracewhy.renderers.sql import parquet_bytes

    def file(build: Callable[[], pl.DataFrame]) -> Callable[[], bytes]:
        return lambda: parquet_bytes(build())

    return [(f"{name}.parquet", file(build)) for name, build in tables]
