"""Collective calls of one trace: one row per call, with its op, process group, size, and how
long it took on the device (its communication kernels) or, for host backends (gloo), on the host.

A call is the ``<backend>:<op>`` range PyTorch records around each process-group operation,
with the communication kernels launched under it; a communication kernel launched outside any
such range (symmetric-memory all-reduce, custom all-reduce, kernels without a launch record) is
a call of its own. The process group and message size come from the ``record_param_comms`` op
above the launch when the trace has one, else from the range's input shapes.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.collective_bandwidth import with_bandwidth
from tracewhy.analyses.families import COLLECTIVE_BACKENDS, Family, classify_kernels, collective_op, collective_range
from tracewhy.analyses.name_codes import decide
from tracewhy.model.linking import first_flagged
from tracewhy.model.schema import Col, Kind, OpAttrCol
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]

#: Backends whose collectives run on host threads: their range's duration is the collective's.
HOST_TIMED_BACKENDS: Final = ("gloo", "mpi")
_OP_ID_SUFFIX = re.compile(api_names.OP_RANGE_SUFFIX)
_KERNEL_DECORATION = re.compile(r"[(<].*$")


@dataclass(frozen=True)
class CollectivesResult:
    """``table``: one row per collective call, in host order.

    Columns: call (row number), range_id (the ``<backend>:<op>`` range's slice id, null for a
    lone kernel), label (range name, else collective or op name, else kernel name), op
    (normalized: all_reduce, all_gather, ...; null when unknown), backend, process_group,
    size (elements), pid, tid, host_ts_ns (range start, else launch start, else kernel start),
    timing ("device", "host" or "none": a device backend's range whose kernels were not
    captured), device, start_ns, dur_ns (first kernel start to last kernel end, or the host
    range), kernels (count); from ``record_param_comms`` where the trace has it: dtype,
    group_size, and the bandwidth columns of ``collective_bandwidth.with_bandwidth``.

    ``kernels``: id (communication kernel slice id), call.
    """

    table: pl.DataFrame
    kernels: pl.DataFrame


def collectives(trace: Trace) -> CollectivesResult:
    """The collective calls of ``trace``, computed once per Trace (overlap, ranks and the step
    account's evidence all ask; a Trace never changes, as ``classify_kernels`` relies on too)."""
    trace.require_whole()
    return trace.kept("_collectives", lambda: _collectives(trace))


def call_messages(trace: Trace) -> tuple[dict[int, int], pl.DataFrame]:
    """Each communication kernel's call (kernel slice id -> call), and per call its msg_bytes,
    bus bytes (busbw_bytes_per_s over dur_ns) and dur_ns, for calls with a bus bandwidth."""
    r = collectives(trace)
    call_of = dict(zip(r.kernels.get_column(Col.ID).to_list(), r.kernels.get_column("call").to_list(), strict=True))
    sized = r.table.filter(pl.col("busbw_bytes_per_s").is_not_null()).select(
        "call", "msg_bytes", (pl.col("busbw_bytes_per_s") * pl.col(Col.DUR) / 1e9).alias("bus_bytes"), Col.DUR)
    return call_of, sized


def _collectives(trace: Trace) -> CollectivesResult:
    s = trace.slices
    n = s.height
    parent = s.get_column(Col.PARENT).fill_null(-1).to_numpy()
    ranges = _collective_ranges(trace)
    is_range = np.zeros(n, dtype=bool)
    is_range[ranges.get_column(Col.ID).to_numpy()] = True
    attrs = trace.op_attrs.filter(pl.col(OpAttrCol.COLLECTIVE).is_not_null()).select(
        Col.ID, OpAttrCol.COLLECTIVE, OpAttrCol.PG_NAME, OpAttrCol.IN_NELEMS, OpAttrCol.OUT_NELEMS,
        OpAttrCol.GROUP_SIZE, OpAttrCol.DTYPE,
    )
    has_attrs = np.zeros(n, dtype=bool)
    has_attrs[attrs.get_column(Col.ID).to_numpy()] = True

    kernels = comm_kernels(trace)
    launch = kernels.get_column(Col.LAUNCH).fill_null(-1).to_numpy()
    kernel_range = first_flagged(launch, parent, is_range)
    kernel_attr = first_flagged(launch, parent, has_attrs)
    # A call per range that launched kernels, and a call per kernel launched outside any range.
    kernels = kernels.with_columns(
        pl.Series("_range", kernel_range, dtype=pl.Int64),
        pl.Series("_attr", kernel_attr, dtype=pl.Int64),
    ).with_columns(
        pl.when(pl.col("_range") >= 0).then(pl.col("_range")).otherwise(-1 - pl.col(Col.ID)).alias("_key")
    )
    ts_all = s.get_column(Col.TS).to_numpy()
    launch_ts = np.where(launch >= 0, ts_all[np.maximum(launch, 0)], -1)
    by_call = (
        kernels.with_columns(
            pl.when(pl.Series(launch >= 0)).then(pl.Series(launch_ts)).otherwise(None).alias("_launch_ts")
        )
        .group_by("_key")
        .agg(
            pl.col("_range").first(),
            pl.col("_attr").max(),
            pl.col(Col.NAME).first().alias("_kernel"),
            pl.col(Col.OP).first().alias("_op_id"),
            pl.col(Col.DEVICE).first(),
            pl.col(Col.TS).min().alias("start_ns"),
            (pl.col(Col.TS) + pl.col(Col.DUR)).max().alias("_end"),
            pl.col("_launch_ts").min(),
            pl.col(Col.PID).first().alias("_gpu_pid"),
            pl.len().cast(pl.Int64).alias("kernels"),
        )
        .with_columns((pl.col("_end") - pl.col("start_ns")).alias(Col.DUR), pl.lit("device").alias("timing"))
    )
    with_kernels = set(by_call.get_column("_range").to_list())
    lone_ranges = ranges.filter(~pl.col(Col.ID).is_in(list(with_kernels)))
    rows = _call_rows(trace, by_call, ranges, attrs) + _range_rows(trace, lone_ranges)
    table = with_bandwidth(_table(rows), trace)
    keys = table.get_column("_key").to_list()
    call_of_key = {k: i for i, k in enumerate(keys)}
    kernel_calls = kernels.select(
        Col.ID, pl.col("_key").replace_strict(call_of_key, return_dtype=pl.Int64).alias("call")
    )
    return CollectivesResult(table=table.drop("_key"), kernels=kernel_calls)


def short_kernel_name(name: str) -> str:
    """A kernel name without its return type and argument list (``ncclDevKernel_Generic``)."""
    return _KERNEL_DECORATION.sub("", name.removeprefix("void ").replace("(anonymous namespace)::", "")) or name


def comm_kernels(trace: Trace) -> pl.DataFrame:
    """Kernels of the communication family (families.classify_kernels: launched under an op
    whose args or name say it is a collective, on a communication-only stream, from a
    communication library, or by name).
    Columns: id, name, ts_ns, dur_ns, pid, device, stream, launch_id, op_id."""
    comm = classify_kernels(trace).filter(pl.col("family") == Family.COMMUNICATION.value).get_column(Col.ID)
    return trace.of_kind(Kind.KERNEL).filter(pl.col(Col.ID).is_in(comm.implode())).select(
        Col.ID, pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR, Col.PID, Col.DEVICE, Col.STREAM, Col.LAUNCH, Col.OP
    )


#: What every process-group range's name holds: its names are parsed only where a column test
#: finds one (an nsys export's 16.6 k distinct names took 5 ms one by one).
_RANGE_STARTS: Final = tuple(f"{backend}:" for backend in COLLECTIVE_BACKENDS)


def _collective_ranges(trace: Trace) -> pl.DataFrame:
    """Host ranges named ``<backend>:<op>``. Columns: id, name, ts_ns, dur_ns, pid, tid, backend, op."""
    # Each distinct name is parsed once and only the hits are copied (a large nsys export has
    # 4.8 M annotations, 0.4 GB in full width, under a few thousand names).
    names = trace.kind_columns((Kind.ANNOTATION,), Col.NAME).get_column(Col.NAME).unique().drop_nulls().to_list()
    ranges = decide(names, collective_range, api_names.holding_any(_RANGE_STARTS), None)
    hits = {n: p for n, p in zip(names, ranges, strict=True) if p is not None}
    a = trace.slices_where((pl.col(Col.KIND) == Kind.ANNOTATION.value) & pl.col(Col.NAME).is_in(list(hits)),
                           Col.ID, pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR, Col.PID, Col.TID)
    return a.with_columns(
        pl.col(Col.NAME).replace_strict({n: p[0] for n, p in hits.items()}, return_dtype=pl.String).alias("backend"),
        pl.col(Col.NAME).replace_strict({n: p[1] for n, p in hits.items()}, return_dtype=pl.String).alias("op"),
    )


def _call_rows(
    trace: Trace, by_call: pl.DataFrame, ranges: pl.DataFrame, attrs: pl.DataFrame
) -> list[dict[str, object]]:
    s = trace.slices
    range_by_id = {r[Col.ID]: r for r in ranges.iter_rows(named=True)}
    attr_by_id = {r[Col.ID]: r for r in attrs.iter_rows(named=True)}
    dims = _input_dims(trace, list(range_by_id))
    rows: list[dict[str, object]] = []
    for c in by_call.iter_rows(named=True):
        rng = range_by_id.get(c["_range"]) if c["_range"] >= 0 else None
        attr = attr_by_id.get(c["_attr"]) if c["_attr"] >= 0 else None
        op_name = str(s[c["_op_id"], Col.NAME]) if c["_op_id"] is not None else None
        label = (_OP_ID_SUFFIX.sub("", rng[Col.NAME]) if rng else None) or (
            attr[OpAttrCol.COLLECTIVE] if attr else None) or op_name or short_kernel_name(c["_kernel"])
        op = (rng["op"] if rng else None) or (collective_op(attr[OpAttrCol.COLLECTIVE]) if attr else None) \
            or collective_op(c["_kernel"]) or (collective_op(op_name) if op_name else None)
        size = attr[OpAttrCol.IN_NELEMS] if attr and attr[OpAttrCol.IN_NELEMS] is not None else (
            dims.get(c["_range"]) if rng else None)
        host_ts = rng[Col.TS] if rng else (c["_launch_ts"] if c["_launch_ts"] is not None else c["start_ns"])
        rows.append({
            "_key": c["_key"], "range_id": rng[Col.ID] if rng else None, "label": label, "op": op,
            "backend": rng["backend"] if rng else None, "process_group": attr[OpAttrCol.PG_NAME] if attr else None,
            "size": size, Col.PID: rng[Col.PID] if rng else c["_gpu_pid"], Col.TID: rng[Col.TID] if rng else None,
            "host_ts_ns": host_ts, "timing": "device", Col.DEVICE: c[Col.DEVICE], "start_ns": c["start_ns"],
            Col.DUR: c[Col.DUR], "kernels": c["kernels"],
            **({"dtype": attr[OpAttrCol.DTYPE], "group_size": attr[OpAttrCol.GROUP_SIZE],
                "_out_size": attr[OpAttrCol.OUT_NELEMS]} if attr else {}),
        })
    return rows


def _range_rows(trace: Trace, lone: pl.DataFrame) -> list[dict[str, object]]:
    dims = _input_dims(trace, lone.get_column(Col.ID).to_list())
    rows: list[dict[str, object]] = []
    for r in lone.iter_rows(named=True):
        host = r["backend"] in HOST_TIMED_BACKENDS
        rows.append({
            "_key": r[Col.ID], "range_id": r[Col.ID], "label": _OP_ID_SUFFIX.sub("", r[Col.NAME]), "op": r["op"],
            "backend": r["backend"], "process_group": None, "size": dims.get(r[Col.ID]), Col.PID: r[Col.PID],
            Col.TID: r[Col.TID], "host_ts_ns": r[Col.TS], "timing": "host" if host else "none", Col.DEVICE: None,
            "start_ns": r[Col.TS] if host else None, Col.DUR: r[Col.DUR] if host else None, "kernels": 0,
        })
    return rows


def _input_dims(trace: Trace, ids: list[int]) -> dict[int, int]:
    """Elements of the first input tensor of each given slice, where its shapes were recorded."""
    if not ids:
        return {}
    rows = trace.op_attrs.filter(pl.col(Col.ID).is_in(ids) & pl.col(OpAttrCol.INPUT_DIMS).is_not_null())
    out: dict[int, int] = {}
    for i, text in rows.select(Col.ID, OpAttrCol.INPUT_DIMS).iter_rows():
        n = _first_tensor_elements(text)
        if n is not None:
            out[i] = n
    return out


def _first_tensor_elements(text: str) -> int | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    # [[33706]] (a tensor), [[[33706]], [], ...] (a TensorList first): descend to a list of ints.
    while isinstance(value, list) and value and isinstance(value[0], list):
        value = value[0]
    if not isinstance(value, list) or not value or not all(isinstance(d, int) for d in value):
        return None
    return math.prod(value)


_SCHEMA: Final = {
    "_key": pl.Int64, "range_id": pl.Int64, "label": pl.String, "op": pl.String, "backend": pl.String,
    "process_group": pl.String, "size": pl.Int64, Col.PID: pl.Int64, Col.TID: pl.Int64, "host_ts_ns": pl.Int64,
    "timing": pl.String, Col.DEVICE: pl.Int32, "start_ns": pl.Int64, Col.DUR: pl.Int64, "kernels": pl.Int64,
    "dtype": pl.String, "group_size": pl.Int64, "_out_size": pl.Int64,
}


def _table(rows: list[dict[str, object]]) -> pl.DataFrame:
    for r in rows:
        for column in ("dtype", "group_size", "_out_size"):
            r.setdefault(column, None)
    table = pl.DataFrame(rows, schema=_SCHEMA) if rows else pl.DataFrame(schema=_SCHEMA)
    return table.sort(["host_ts_ns", "start_ns", "_key"], nulls_last=True).with_row_index("call").with_columns(
        pl.col("call").cast(pl.Int64)
    )
