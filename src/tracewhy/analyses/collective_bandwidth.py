"""Bandwidth of collective calls: each call's message as NCCL's benchmarks size it, its algorithm
and bus bandwidth (NCCL's per-op factors), the GPU-to-GPU link it crosses and that link's peak,
and the calls summed per device, op, process group and message size (what ``overlap`` shows and
``collective-slow-bus`` judges)."""

from __future__ import annotations

from typing import Final

import polars as pl

from tracewhy.analyses.peaks import peer_link
from tracewhy.analyses.tensor_sizes import SCALAR_TYPE_BYTES
from tracewhy.model.schema import Col, DeviceCol
from tracewhy.model.trace import Trace

# nccl-tests doc/PERFORMANCE.md: algorithm bandwidth is the message size over the time; bus
# bandwidth multiplies it by the share of the data each rank's link must carry for the op, so
# that it is comparable with the link's peak whatever the rank count (n): all-reduce 2(n-1)/n,
# all-gather, reduce-scatter and all-to-all (n-1)/n, broadcast, reduce, send and recv 1. Gather
# and scatter as in its gather.cu and scatter.cu: (n-1)/n.
_SHARE_OF_ALL: Final = frozenset({"all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"})
_WHOLE: Final = frozenset({"broadcast", "reduce", "send", "recv", "send_recv"})


def bus_factor(op: str | None, group_size: int | None) -> float | None:
    """NCCL's bus bandwidth factor for ``op`` over ``group_size`` ranks (None: unknown op, or a
    group of one, whose data crosses no link)."""
    if op is None or group_size is None or group_size < 2:
        return None
    n = group_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in _SHARE_OF_ALL:
        return (n - 1) / n
    return 1.0 if op in _WHOLE else None


def message_bytes(op: str | None, in_nelems: int | None, out_nelems: int | None, dtype: str | None) -> int | None:
    """The message as nccl-tests sizes it, from ``record_param_comms``' element counts (PyTorch
    records the input and output tensors' numel): all-gather's whole gathered output (its input
    is one rank's share; gather's likewise), reduce-scatter's whole input, all-to-all's send
    buffer, recv's output, the input otherwise. None without a known dtype or a positive count."""
    width = SCALAR_TYPE_BYTES.get(dtype or "")
    if width is None or op is None:
        return None
    if op in ("all_gather", "gather", "recv"):
        nelems = out_nelems
    elif op == "send_recv":
        nelems = max(in_nelems or 0, out_nelems or 0) or None
    else:
        nelems = in_nelems
    return nelems * width if nelems is not None and nelems > 0 else None


def with_bandwidth(table: pl.DataFrame, trace: Trace) -> pl.DataFrame:
    """The collectives ``table`` with msg_bytes (``message_bytes``), algbw_bytes_per_s (msg_bytes
    over dur_ns), busbw_bytes_per_s (algbw times ``bus_factor``; null for a group of one), link
    and link_bytes_per_s (the GPU-to-GPU link the group's ranks exchange over, from the device's
    name, peak in one direction; null when the group has more ranks than the node has GPUs, so
    that part of it crosses a network the trace does not describe); helper columns dropped."""
    devices = trace.devices
    names = dict(zip(devices.get_column(DeviceCol.DEVICE).to_list(), devices.get_column(DeviceCol.NAME).to_list(),
                     strict=True))
    gpus_in_node = devices.height
    rows = table.select("op", "size", "_out_size", "dtype", "group_size", Col.DUR, Col.DEVICE, "timing").rows()
    out: dict[str, list[object]] = {k: [] for k in ("msg_bytes", "algbw_bytes_per_s", "busbw_bytes_per_s", "link",
                                                    "link_bytes_per_s")}
    for op, size, out_size, dtype, n, dur, device, timing in rows:
        nbytes = message_bytes(op, size, out_size, dtype)
        alg = nbytes / dur * 1e9 if nbytes and dur and timing != "none" else None
        factor = bus_factor(op, n)
        # deviceProperties lists the GPUs of the rank's node: a larger group also spans a network.
        link = peer_link(names.get(device)) if n is not None and 1 < n <= gpus_in_node else None
        out["msg_bytes"].append(nbytes)
        out["algbw_bytes_per_s"].append(alg)
        out["busbw_bytes_per_s"].append(alg * factor if alg is not None and factor is not None else None)
        out["link"].append(link.name if link else None)
        out["link_bytes_per_s"].append(link.bytes_per_s if link else None)
    return table.drop("_out_size").with_columns(
        pl.Series("msg_bytes", out["msg_bytes"], dtype=pl.Int64),
        pl.Series("algbw_bytes_per_s", out["algbw_bytes_per_s"], dtype=pl.Float64),
        pl.Series("busbw_bytes_per_s", out["busbw_bytes_per_s"], dtype=pl.Float64),
        pl.Series("link", out["link"], dtype=pl.String),
        pl.Series("link_bytes_per_s", out["link_bytes_per_s"], dtype=pl.Float64),
    )


#: ``bandwidth_by_size``: the calls of one device, op, process group and message size, summed.
#: busbw_bytes_per_s is bus bytes over the summed time (a time-weighted mean); link_share is it
#: over link_bytes_per_s.
BANDWIDTH_SCHEMA: Final = pl.Schema({
    "device": pl.Int32(), "op": pl.String(), "process_group": pl.String(), "group_size": pl.Int64(),
    "msg_bytes": pl.Int64(), "calls": pl.Int64(), "time_ns": pl.Int64(), "algbw_bytes_per_s": pl.Float64(),
    "busbw_bytes_per_s": pl.Float64(), "link": pl.String(), "link_bytes_per_s": pl.Float64(),
    "link_share": pl.Float64(),
})


def bandwidth_by_size(calls: pl.DataFrame) -> pl.DataFrame:
    """Calls (rows of the collectives table) with a bandwidth, summed per device, op, process
    group and message size; the most time first."""
    timed = calls.filter(pl.col("algbw_bytes_per_s").is_not_null() & (pl.col(Col.DUR) > 0))
    if timed.height == 0:
        return pl.DataFrame(schema=BANDWIDTH_SCHEMA)
    bus = (pl.col("_bus_bytes").sum() / pl.col(Col.DUR).sum() * 1e9)
    return (
        timed.with_columns(
            pl.col("process_group").fill_null(""),
            (pl.col("busbw_bytes_per_s") * pl.col(Col.DUR) / 1e9).alias("_bus_bytes"),
        )
        .group_by(Col.DEVICE, "op", "process_group", "group_size", "msg_bytes", "link", "link_bytes_per_s")
        .agg(
            pl.len().cast(pl.Int64).alias("calls"), pl.col(Col.DUR).sum().alias("time_ns"),
            (pl.col("msg_bytes").first() * pl.len() / pl.col(Col.DUR).sum() * 1e9).alias("algbw_bytes_per_s"),
            pl.when(pl.col("_bus_bytes").is_not_null().all()).then(bus).alias("busbw_bytes_per_s"),
        )
        .with_columns((pl.col("busbw_bytes_per_s") / pl.col("link_bytes_per_s")).alias("link_share"))
        .select(*BANDWIDTH_SCHEMA)
        .cast(BANDWIDTH_SCHEMA)
        .sort(["time_ns", "device", "op", "msg_bytes"], descending=[True, False, False, False])
    )


#: ``transfer_bandwidth``'s columns: a matched call's message, its bus bandwidth over its
#: transfer time (the shortest duration across ranks: no rank waited in it), and the link's peak.
TRANSFER_BANDWIDTH_SCHEMA: Final = pl.Schema({
    "group_size": pl.Int64(), "msg_bytes": pl.Int64(), "busbw_bytes_per_s": pl.Float64(), "link": pl.String(),
    "link_bytes_per_s": pl.Float64(), "link_share": pl.Float64(),
})


def transfer_bandwidth(matched: pl.DataFrame) -> pl.DataFrame:
    """Calls matched across ranks (op, group_size, msg_bytes, transfer_ns, link, link_bytes_per_s)
    with busbw_bytes_per_s over transfer_ns and its link_share: the bandwidth the link gave once
    the last rank had arrived, which one rank's kernel time, holding its wait, understates."""
    factors = [bus_factor(op, n) for op, n in matched.select("op", "group_size").rows()]
    return matched.with_columns(
        pl.when(pl.col("transfer_ns") > 0)
        .then(pl.col("msg_bytes") / pl.col("transfer_ns") * 1e9 * pl.Series(factors, dtype=pl.Float64))
        .alias("busbw_bytes_per_s"),
    ).with_columns((pl.col("busbw_bytes_per_s") / pl.col("link_bytes_per_s")).alias("link_share"))
