"""The dependencies a trace records that explain a GPU gap whatever the host was doing: the
next activity's stream told to wait on another stream's event first (a cuda_sync "Stream Wait
Event"), and a blocking synchronize that returned as the device drained. ``gaps`` reads them
after sampling the host, and they override what the samples said.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.host_activity import Flag, HostIndex
from tracewhy.model.schema import Col, Kind, SyncCol
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]

#: A synchronize that returns within this long after the device went idle caused the gap.
SYNC_RETURN_SLACK_NS = 50_000


def stream_waits(trace: Trace) -> pl.DataFrame:
    """The recorded stream-on-stream waits (device, stream, ts_ns, wait_stream), by time."""
    syncs = trace.of_kind(Kind.GPU_SYNC).select(Col.ID, Col.DEVICE, Col.STREAM, Col.TS)
    return syncs.join(trace.sync_attrs.select(SyncCol.ID, SyncCol.WAIT_STREAM), on=Col.ID).filter(
        pl.col(Col.STREAM) >= 0).sort(Col.TS, maintain_order=True)


def waited_streams(dev: pl.DataFrame, s: pl.DataFrame, nxt: I64, has_next: npt.NDArray[np.bool_],
                    waits: pl.DataFrame) -> I64:
    """Per gap, the stream its next activity's stream was told to wait on (-1 for none): a wait
    enqueued on that stream after the stream's previous activity was launched and no later
    than the next one was (times of launch: the runtime call's start, else the activity's)."""
    out = np.full(nxt.size, -1, dtype=np.int64)
    if waits.height == 0 or dev.height == 0:
        return out
    launch = dev.get_column(Col.LAUNCH).fill_null(-1).to_numpy()
    key = np.where(launch >= 0, s.get_column(Col.TS).to_numpy()[np.maximum(launch, 0)],
                   dev.get_column(Col.TS).to_numpy())
    stream = dev.get_column(Col.STREAM).fill_null(-1).to_numpy()
    prev_key = np.full(dev.height, np.iinfo(np.int64).min, dtype=np.int64)
    last: dict[int, int] = {}
    for r, st in enumerate(stream.tolist()):  # (dev is in time order)
        if st in last:
            prev_key[r] = key[last[st]]
        last[st] = r
    by_stream = {int(st): (part.get_column(Col.TS).to_numpy(), part.get_column(SyncCol.WAIT_STREAM).to_numpy())
                 for (st,), part in waits.group_by(Col.STREAM)}
    for i in np.flatnonzero(has_next).tolist():
        r = int(nxt[i])
        found = by_stream.get(int(stream[r]))
        if found is None:
            continue
        w_ts, w_stream = found
        j = int(np.searchsorted(w_ts, key[r], side="right")) - 1
        if j >= 0 and w_ts[j] > prev_key[r]:
            out[i] = w_stream[j]
    return out


def sync_returns_in(gs: I64, ge: I64, host: HostIndex) -> npt.NDArray[np.bool_]:
    """Per gap [gs, ge): whether a synchronize that started before it returned within
    ``SYNC_RETURN_SLACK_NS`` of its start (the host blocked while the device drained)."""
    sync = host.self_flag[Flag.SYNC]
    if not sync.any() or gs.size == 0:
        return np.zeros(gs.size, dtype=bool)
    s_ts = host.ts[sync]
    s_end = host.end[sync]
    order = np.argsort(s_end)
    s_ts, s_end = s_ts[order], s_end[order]
    # Any synchronize that started before the gap and returned within the slack after its start.
    lo = np.searchsorted(s_end, gs, side="left")
    hi = np.searchsorted(s_end, np.minimum(ge, gs + SYNC_RETURN_SLACK_NS), side="right")
    out = np.zeros(gs.size, dtype=bool)
    for i in np.flatnonzero(hi > lo):
        out[i] = bool((s_ts[lo[i] : hi[i]] < gs[i]).any())
    return out
