"""Launch delays the trace cannot explain: a launch edge on the critical path issued far longer
than launch latency before its device's first recorded GPU work, so that the device recorded
nothing while the launch waited. Such a delay is not launch overhead: the GPU was running work
queued before the capture began (an inference server runs ahead of the GPU), or the host and GPU
clocks are offset. This module finds those edges from the devices' activity intervals
(structure, not names), for ``account_parts`` to put in their own part.

A long launch delay after the device's first recorded work stays launch overhead: a kernel's
first launch waits 1.3-5.8 ms on an idle GPU in the A100 torch.add and RTX 4060 laptop traces
(loading its module, most likely), a cost of launching.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.id_arrays import narrow
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

#: A launch reaches the GPU in 5-20 µs when its queue is empty (CUDA and HIP launch latency); 1 ms
#: is 50x the slowest of those. A launch issued that long before its device's first recorded work
#: waited on something the trace does not hold, not on the launch path.
LAUNCH_DELAY_UNRECORDED_MIN_NS: Final = 1_000_000


class FirstGpuWork:
    """Each GPU activity's device, and each device's first recorded GPU work."""

    def __init__(self, trace: Trace) -> None:
        gpu = trace.kind_columns(GPU_ACTIVITY_KINDS, Col.ID, pl.col(Col.DEVICE).fill_null(-1).cast(pl.Int64), Col.TS)
        # (int32 where the devices fit, as they do: 31 MB, not 62, on an 8 M-slice export.)
        device = narrow(gpu.get_column(Col.DEVICE).to_numpy())
        self.device = np.full(trace.slices.height, -1, dtype=device.dtype)
        self.device[gpu.get_column(Col.ID).to_numpy()] = device
        first = gpu.group_by(Col.DEVICE).agg(pl.col(Col.TS).min())
        self.first: dict[int, int] = dict(zip(first.get_column(Col.DEVICE).to_list(),
                                              first.get_column(Col.TS).to_list(), strict=True))

    def first_ns(self, device: int) -> int | None:
        """The device's first recorded GPU work (None: none)."""
        return self.first.get(device)

    def unrecorded_launches(self, is_launch: B, activity: I64, lo: I64) -> B:
        """Which launch edges (``activity``: the GPU activity each launched; ``lo``: the launch
        call's start) were issued LAUNCH_DELAY_UNRECORDED_MIN_NS or more before their device's
        first recorded work: the device recorded nothing for that long while the launch waited."""
        out = np.zeros(is_launch.size, dtype=bool)
        for i in np.flatnonzero(is_launch).tolist():
            first = self.first_ns(int(self.device[activity[i]]))
            out[i] = first is not None and first - int(lo[i]) >= LAUNCH_DELAY_UNRECORDED_MIN_NS
        return out
