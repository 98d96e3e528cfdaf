"""The events ``export`` writes for a trace it has no original events of (an Nsight Systems
export, read into the model) are, byte for byte, what a dict per slice encoded by msgspec gives:
the per-slice reference below, which ``model_events`` replaced with one polars pass."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import polars as pl
import pytest

from conftest import shared_trace
from tracewhy.model.schema import Col, CopyAttrCol, LaunchAttrCol
from tracewhy.model.trace import Trace
from tracewhy.readers import read_trace
from tracewhy.renderers.perfetto import _GPU_ROW_KINDS, _KINETO_CAT, model_events, us_column


def _reference(trace: Trace) -> list[bytes]:
    """Each slice as a dict, its optional args added one by one, then the process and thread names."""
    s = trace.slices
    kattrs = {r[LaunchAttrCol.ID]: r for r in trace.kernel_attrs.iter_rows(named=True)}
    cattrs = {r[CopyAttrCol.ID]: r for r in trace.copy_attrs.iter_rows(named=True)}
    out: list[dict[str, Any]] = []
    gpu_pids: set[int] = set()
    for sid, kind, name, ts, dur, pid, tid, device, stream, corr, ext in s.select(
        Col.ID, pl.col(Col.KIND).cast(pl.String), pl.col(Col.NAME).cast(pl.String),
        us_column(pl.col(Col.TS)).alias(Col.TS), us_column(pl.col(Col.DUR)).alias(Col.DUR), Col.PID, Col.TID,
        Col.DEVICE, Col.STREAM, Col.CORRELATION, Col.EXTERNAL_ID,
    ).iter_rows():
        args: dict[str, Any] = {}
        if kind in _GPU_ROW_KINDS and device is not None:
            pid, tid = int(device), int(stream) if stream is not None else 0
            gpu_pids.add(pid)
            args["device"] = int(device)
            if stream is not None:
                args["stream"] = int(stream)
        if corr is not None:
            args["correlation"] = int(corr)
        if ext is not None:
            args["External id"] = int(ext)
        k = kattrs.get(sid)
        if k is not None:
            args["grid"] = [k[LaunchAttrCol.GRID_X], k[LaunchAttrCol.GRID_Y], k[LaunchAttrCol.GRID_Z]]
            args["block"] = [k[LaunchAttrCol.BLOCK_X], k[LaunchAttrCol.BLOCK_Y], k[LaunchAttrCol.BLOCK_Z]]
            if k[LaunchAttrCol.REGISTERS] is not None:
                args["registers per thread"] = k[LaunchAttrCol.REGISTERS]
            if k[LaunchAttrCol.SHARED_MEM] is not None:
                args["shared memory"] = k[LaunchAttrCol.SHARED_MEM]
        c = cattrs.get(sid)
        if c is not None and c[CopyAttrCol.BYTES] is not None:
            args["bytes"] = c[CopyAttrCol.BYTES]
        out.append({"ph": "X", "cat": _KINETO_CAT.get(kind, "other"), "name": name, "pid": pid or 0,
                    "tid": tid or 0, "ts": msgspec.Raw(ts.encode()), "dur": msgspec.Raw(dur.encode()), "args": args})
    out += [{"ph": "M", "name": "process_name", "pid": p, "args": {"name": f"GPU {p}"}} for p in sorted(gpu_pids)]
    out += [{"ph": "M", "name": "process_name" if t is None else "thread_name", "pid": p,
             **({} if t is None else {"tid": t}), "args": {"name": n}}
            for p, t, n in trace.threads.select(Col.PID, Col.TID, "name").iter_rows()
            if p is not None and p not in gpu_pids]
    return [msgspec.json.encode(e) for e in out]


@pytest.mark.parametrize("path", ["nsys/nsysai_h100_2gpu_1s.sqlite.gz", "nsys/nvfuser_matmul_h200_2024.6.sqlite.gz",
                                  "tracelens/h100_bert-small_bs1_seq512.json.gz"])
def test_model_events_are_the_per_slice_dicts_encoded(path: str) -> None:
    trace = read_trace(shared_trace(path))
    want = _reference(trace)
    assert model_events(trace) == want
    text = b"\n".join(want)
    for key in (b'"device":', b'"stream":', b'"correlation":', b'"grid":[', b'"block":[', b'"process_name"',
                b'"thread_name"', b'"bytes":' if "nsys/" in path else b'"External id":'):
        assert key in text, key  # every kind of argument is compared on the real traces


def test_model_events_of_edited_rows_are_the_per_slice_dicts_encoded() -> None:
    """Nulls and edge values a reader seldom writes: no name, no pid or tid, a kernel without a
    stream, launch attributes partly unknown, a copy of unknown size, negative and odd names."""
    trace = read_trace(shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz"))
    s = trace.slices
    n = s.height
    edited = s.with_columns(
        pl.when(pl.col(Col.ID) % 7 == 0).then(None).otherwise(pl.col(Col.PID)).alias(Col.PID),
        pl.when(pl.col(Col.ID) % 5 == 0).then(None).otherwise(pl.col(Col.TID)).alias(Col.TID),
        pl.when(pl.col(Col.ID) % 3 == 0).then(None).otherwise(pl.col(Col.STREAM)).alias(Col.STREAM),
        pl.when(pl.col(Col.ID) % 11 == 0).then(pl.lit('q"uo\\te\n\u00e9\x01'))
        .when(pl.col(Col.ID) % 13 == 0).then(None)
        .otherwise(pl.col(Col.NAME).cast(pl.String)).cast(pl.Categorical).alias(Col.NAME),
    )
    kattrs = trace.kernel_attrs.with_columns(
        pl.when(pl.col(LaunchAttrCol.ID) % 2 == 0).then(None).otherwise(pl.col(LaunchAttrCol.GRID_Y))
        .alias(LaunchAttrCol.GRID_Y),
        pl.when(pl.col(LaunchAttrCol.ID) % 3 == 0).then(None).otherwise(pl.col(LaunchAttrCol.REGISTERS))
        .alias(LaunchAttrCol.REGISTERS))
    cattrs = trace.copy_attrs.with_columns(
        pl.when(pl.col(CopyAttrCol.ID) % 2 == 0).then(None).otherwise(pl.col(CopyAttrCol.BYTES))
        .alias(CopyAttrCol.BYTES))
    t = dataclasses.replace(trace, slices=edited, kernel_attrs=kattrs, copy_attrs=cattrs)
    assert t.slices.height == n and t.slices.get_column(Col.NAME).null_count() > 0
    assert model_events(t) == _reference(t)
