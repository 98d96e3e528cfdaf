"""The idle-gap and projected-range tracks ``export`` adds are, byte for byte, what a dict per
row encoded by msgspec gives: the per-row references below, which the renderer replaced with
one polars pass per track (lanes still assigned in Python). Compared on real traces and on
rows edited to hold what a reader seldom writes (nulls, escapes, zero class times)."""

from __future__ import annotations

from typing import Any

import msgspec
import polars as pl
import pytest

from conftest import shared_trace
from tracewhy.analyses.gaps import CLASS_COLUMNS, GapCol
from tracewhy.model.schema import Col
from tracewhy.renderers.perfetto import (
    ANNOTATION_TID_BASE,
    CAT,
    GAPS_TID,
    _annotation_events,
    _gap_events,
    _meta,
    us,
)
from tracewhy.reports.export import ExportOptions, export_report
from tracewhy.reports.overview import Overview


def _gaps_reference(g: pl.DataFrame, pids: dict[int, int], default_pid: int) -> list[bytes]:
    out: list[dict[str, Any]] = []
    for device in sorted(g.get_column(GapCol.DEVICE).unique().to_list()) if g.height else []:
        pid = pids.get(int(device), default_pid)
        out.append(_meta(pid, GAPS_TID, "thread_name", "tracewhy: GPU idle gaps"))
        for row in g.filter(pl.col(GapCol.DEVICE) == device).sort(GapCol.START).iter_rows(named=True):
            args = {k: row[k] for k in (GapCol.HOST_INNERMOST, GapCol.HOST_OP, GapCol.HOST_ANNOTATION,
                                        GapCol.HOST_PYTHON, GapCol.NEXT_ACTIVITY, GapCol.STEP)
                    if row.get(k) is not None}
            args.update({k: row[k] for k in CLASS_COLUMNS if row.get(k)})
            out.append({"ph": "X", "cat": CAT, "name": row[GapCol.GAP_CLASS], "pid": pid, "tid": GAPS_TID,
                        "ts": us(row[GapCol.START]), "dur": us(row[GapCol.DUR]), "args": args})
    return [msgspec.json.encode(e) for e in out]


def _annotations_reference(p: pl.DataFrame, pids: dict[int, int], default_pid: int) -> list[bytes]:
    out: list[dict[str, Any]] = []
    lanes: dict[tuple[int, int], int] = {}
    named: set[tuple[int, int]] = set()
    for row in p.sort(["proj_start_ns", "proj_dur_ns"], descending=[False, True]).iter_rows(named=True):
        device = row.get(Col.DEVICE)
        pid = pids.get(int(device), default_pid) if device is not None else default_pid
        start, end = row["proj_start_ns"], row["proj_start_ns"] + row["proj_dur_ns"]
        lane = 0
        while lanes.get((pid, lane), -(1 << 62)) > start:
            lane += 1
        lanes[(pid, lane)] = end
        tid = ANNOTATION_TID_BASE + lane
        if (pid, tid) not in named:
            label = f"tracewhy: annotations on GPU {device if device is not None else ''}".rstrip()
            out.append(_meta(pid, tid, "thread_name", f"{label} ({lane + 1})" if lane else label))
            named.add((pid, tid))
        out.append({"ph": "X", "cat": CAT, "name": row[Col.NAME], "pid": pid, "tid": tid,
                    "ts": us(start), "dur": us(row["proj_dur_ns"]),
                    "args": {"cpu_ts_us": us(row[Col.TS]), "cpu_dur_ns": row[Col.DUR],
                             "gpu_ops": row["num_gpu_ops"], "gpu_time_ns": row["gpu_time_ns"],
                             "gpu_busy_ns": row["gpu_busy_ns"]}})
    return [msgspec.json.encode(e) for e in out]


def _encoded(events: list[Any]) -> list[bytes]:
    return [msgspec.json.encode(e) for e in events]


def _overview(path: str) -> Overview:
    r = export_report(shared_trace(path), ExportOptions(annotated=True))
    assert r.overview is not None
    return r.overview


@pytest.mark.parametrize("path", ["nsys/nsysai_h100_2gpu_1s.sqlite.gz", "tracelens/h100_bert-small_bs1_seq512.json.gz",
                                  "hta/a100_ddp2_rank0_nccl2.17.json.gz"])
def test_gap_and_annotation_tracks_are_the_per_row_dicts_encoded(path: str) -> None:
    ov = _overview(path)
    pids = ov.device_pids
    default_pid = next(iter(pids.values()), 0)
    gaps, ranges = ov.report.gaps.gaps, ov.projection
    assert gaps.height and ranges.height  # both tracks are compared on each trace
    assert _encoded(_gap_events(gaps, pids, default_pid)) == _gaps_reference(gaps, pids, default_pid)
    assert _encoded(_annotation_events(ranges, pids, default_pid)) == _annotations_reference(ranges, pids, default_pid)


def test_edited_rows_are_the_per_row_dicts_encoded() -> None:
    """Nulls where a column may hold one, names that need escapes, class times of zero, a
    device the pid map does not know, and overlapping ranges that need lanes."""
    ov = _overview("nsys/nsysai_h100_2gpu_1s.sqlite.gz")
    pids = ov.device_pids
    i = pl.int_range(pl.len())
    odd = 'q"uo\\te\n\u00e9\x01'
    gaps = ov.report.gaps.gaps.with_columns(
        pl.when(i % 3 == 0).then(None).otherwise(pl.col(GapCol.HOST_OP)).alias(GapCol.HOST_OP),
        pl.when(i % 4 == 0).then(pl.lit(odd)).otherwise(pl.col(GapCol.HOST_INNERMOST)).alias(GapCol.HOST_INNERMOST),
        pl.when(i % 5 == 0).then(None).otherwise(pl.col(GapCol.STEP)).alias(GapCol.STEP),
        pl.when(i % 2 == 0).then(0).otherwise(pl.col(CLASS_COLUMNS[0])).alias(CLASS_COLUMNS[0]),
        pl.when(i % 7 == 0).then(99).otherwise(pl.col(GapCol.DEVICE)).cast(pl.Int32).alias(GapCol.DEVICE),
    )
    ranges = ov.projection.with_columns(
        pl.when(i % 3 == 0).then(pl.lit(odd)).when(i % 5 == 0).then(None)
        .otherwise(pl.col(Col.NAME).cast(pl.String)).alias(Col.NAME),
        pl.when(i % 4 == 0).then(None).otherwise(pl.col(Col.DUR)).alias(Col.DUR),
        pl.when(i % 6 == 0).then(None).otherwise(pl.col(Col.DEVICE)).alias(Col.DEVICE),
        (pl.col("proj_dur_ns") * 3).alias("proj_dur_ns"),  # more overlaps, more lanes
    )
    assert _encoded(_gap_events(gaps, pids, 7)) == _gaps_reference(gaps, pids, 7)
    text = b"\n".join(_annotations_reference(ranges, pids, 7))
    assert b"(2)" in text and b"\\u0001" in text  # a second lane, and an escape, are compared
    assert _encoded(_annotation_events(ranges, pids, 7)) == _annotations_reference(ranges, pids, 7)
    assert _annotation_events(ranges.clear(), pids, 7) == [] and _gap_events(gaps.clear(), pids, 7) == []
