"""Memory bandwidth utilization (MBU) of decode steps: the bytes a step must read (every GEMM's
weight operand and every attention call's key and value inputs, from the shapes the trace
records) over the step's time, against the device's DRAM bandwidth (``peaks``). A decode step
reads every weight and the whole KV cache to make one token per sequence, so that traffic, not
its FLOPs, bounds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses.host_activity import build_host_index
from tracewhy.analyses.name_codes import distinct_names
from tracewhy.analyses.op_families import FLASH_BNHD, SDPA_BHND, base_name
from tracewhy.analyses.op_inputs import OpInputs
from tracewhy.analyses.peaks import DevicePeaks, lookup_peaks, peaks_from_properties
from tracewhy.analyses.step_classes import ClassCol, StepClasses
from tracewhy.analyses.step_verdicts import StepClass
from tracewhy.analyses.tensor_sizes import nbytes
from tracewhy.model.schema import Col, DeviceCol, Kind, OpAttrCol
from tracewhy.model.trace import Trace

#: Which input of a GEMM is its weight (the operand that stays the same from token to token),
#: and which holds its bias. Batched GEMMs (bmm, baddbmm) multiply activations, not weights.
_WEIGHT_ARG: Final = {"linear": (1, 2), "mm": (1,), "_scaled_mm": (1,), "addmm": (2, 0), "matmul": (1,),
                      "mv": (0,), "addmv": (1, 0)}
_ATTENTION: Final = SDPA_BHND | FLASH_BNHD

HOW_ESTIMATED: Final = ("bytes read = each outermost GEMM call's weight operand (and bias) plus each outermost "
                        "attention call's key and value inputs, from the recorded shapes and dtypes; activations "
                        "and outputs left out (a decode step's are small beside them)")


@dataclass(frozen=True)
class DecodeBandwidth:
    """Over the decode steps: bytes they must read, over their time; ``mbu`` against the device's
    DRAM bandwidth (None without a device in the peak table). ``unshaped_kernel_ns`` is kernel
    time in these steps that no op with shapes launched (a graph replay): the bytes, and the MBU,
    are then a lower bound."""

    steps: int
    weight_bytes: int
    kv_bytes: int
    gemm_calls: int
    attention_calls: int
    time_ns: int
    bytes_per_s: float | None
    device: str | None
    peak_bytes_per_s: float | None
    mbu: float | None
    kernel_ns: int
    unshaped_kernel_ns: int
    how: str
    note: str | None
    #: Bytes one decode step reads as the user gave them (``--decode-bytes``: the model's weights
    #: plus its KV cache); they replace the shapes' estimate, which a graph replay hides.
    given_bytes_per_step: int | None = None

    @property
    def bytes_read(self) -> int:
        if self.given_bytes_per_step is not None:
            return self.given_bytes_per_step * self.steps
        return self.weight_bytes + self.kv_bytes

    @property
    def lower_bound(self) -> bool:
        """The bytes (and MBU) are a lower bound: estimated from shapes while graph replays ran
        kernels no op with shapes launched."""
        return self.given_bytes_per_step is None and self.unshaped_kernel_ns > 0


def decode_bandwidth(trace: Trace, classes: StepClasses, given_bytes: int | None = None) -> DecodeBandwidth | None:
    """MBU over the decode steps; None without a decode step. ``given_bytes``: what one decode step
    reads, as the user knows it (``--decode-bytes``), in place of the shapes' estimate."""
    decode = classes.steps.filter(pl.col(ClassCol.CLASS) == StepClass.DECODE)
    if decode.height == 0:
        return None
    pid = _step_pid(trace, decode)
    ops = _outermost_ops(trace)
    weight = kv = gemms = attention = 0
    time_ns = kernel_ns = unshaped_ns = 0
    for lo, window in decode.select(ClassCol.START, ClassCol.WINDOW).iter_rows():
        hi = lo + window
        time_ns += window
        mine = ops.filter((pl.col(Col.TS) >= lo) & (pl.col(Col.TS) < hi) & (pl.col(Col.PID) == pid))
        for name, dims, types in mine.select(Col.NAME, OpAttrCol.INPUT_DIMS, OpAttrCol.INPUT_TYPES).iter_rows():
            x = OpInputs.parse(dims, types)
            if x is None:
                continue
            base = base_name(name)
            if base in _ATTENTION:
                got = [t for t in (x.tensor(1), x.tensor(2)) if t is not None]
                kv += sum(nbytes(*t) for t in got)
                attention += bool(got)
            else:
                if base == "matmul" and (b := x.tensor(1)) is not None and len(b[0]) != 2:
                    continue  # a batched matmul multiplies activations
                got = [t for i in _WEIGHT_ARG[base] if (t := x.tensor(i)) is not None]
                weight += sum(nbytes(*t) for t in got)
                gemms += bool(got)
        k, u = _kernel_time(trace, lo, hi, pid)
        kernel_ns, unshaped_ns = kernel_ns + k, unshaped_ns + u
    device, peaks = _device(trace)
    total = weight + kv if given_bytes is None else given_bytes * decode.height
    rate = total * 1e9 / time_ns if time_ns > 0 and total else None
    peak = peaks.dram_bytes_per_s if peaks else None
    note = None
    how = HOW_ESTIMATED
    if given_bytes is not None:
        how = (f"bytes read = {given_bytes:,} per decode step, as given (--decode-bytes); the shapes "
               f"recorded {weight + kv:,} bytes over the decode steps")
    elif total == 0:
        note = ("no GEMM or attention call with recorded shapes in the decode steps (captured without "
                "record_shapes, or the model ran as a graph replay): the bytes they read are unknown (give "
                "them: --decode-bytes SIZE)")
    elif unshaped_ns:
        note = (f"{unshaped_ns / max(kernel_ns, 1):.0%} of the decode steps' kernel time ran from no op with "
                "recorded shapes (a graph replay): bytes and MBU are a lower bound")
    return DecodeBandwidth(
        steps=decode.height, weight_bytes=weight, kv_bytes=kv, gemm_calls=gemms, attention_calls=attention,
        time_ns=time_ns, bytes_per_s=rate, device=device, peak_bytes_per_s=peak,
        mbu=rate / peak if rate is not None and peak else None, kernel_ns=kernel_ns, unshaped_kernel_ns=unshaped_ns,
        how=how, note=note, given_bytes_per_step=given_bytes,
    )


def _step_pid(trace: Trace, decode: pl.DataFrame) -> int:
    """The process whose loop the steps are (the steps' own slices are found again by start)."""
    first = int(decode.get_column(ClassCol.START)[0])
    hit = trace.slices_where(pl.col(Col.TS) == first, Col.PID).get_column(Col.PID)
    return int(hit[0]) if hit.len() else -1


def _outermost_ops(trace: Trace) -> pl.DataFrame:
    """The GEMM and attention calls with no call of either family above them (``linear`` over its
    ``addmm``, SDPA over its flash kernel op), with their recorded shapes."""
    wanted = set(_WEIGHT_ARG) | _ATTENTION
    # Two columns of the ops, and strings of their distinct names only (a large trace has 1.5 M ops).
    cpu = trace.kind_columns((Kind.CPU_OP,), Col.ID, Col.NAME)
    names = [n for n in distinct_names(cpu.get_column(Col.NAME))[1] if n and base_name(n) in wanted]
    ids = cpu.filter(pl.col(Col.NAME).is_in(names)).get_column(Col.ID).to_numpy()
    host = build_host_index(trace)
    pos = np.flatnonzero(np.isin(host.ids, ids))
    family = np.zeros(host.ids.size, dtype=bool)
    family[pos] = True
    keep = []
    for p in pos.tolist():
        up = int(host.parent[p])
        while up >= 0 and not family[up]:
            up = int(host.parent[up])
        if up < 0:
            keep.append(int(host.ids[p]))
    return (trace.slices_where(pl.col(Col.ID).is_in(keep), Col.ID, pl.col(Col.NAME).cast(pl.String), Col.TS, Col.PID)
            .join(trace.op_attrs.select(Col.ID, OpAttrCol.INPUT_DIMS, OpAttrCol.INPUT_TYPES), on=Col.ID, how="left"))


def _kernel_time(trace: Trace, lo: int, hi: int, pid: int) -> tuple[int, int]:
    """Kernel time launched in [lo, hi) by the process, and the part of it no CPU op launched."""
    s = trace.slices
    k = trace.kind_columns((Kind.KERNEL,), Col.DUR, Col.LAUNCH, Col.OP).drop_nulls(Col.LAUNCH)
    launch_ts = s.get_column(Col.TS).gather(k.get_column(Col.LAUNCH))
    launch_pid = s.get_column(Col.PID).gather(k.get_column(Col.LAUNCH))
    inside = ((launch_ts >= lo) & (launch_ts < hi) & (launch_pid == pid)).to_numpy()
    dur = k.get_column(Col.DUR).to_numpy()[inside]
    no_op = k.get_column(Col.OP).is_null().to_numpy()[inside]
    return int(dur.sum()), int(dur[no_op].sum())


def _device(trace: Trace) -> tuple[str | None, DevicePeaks | None]:
    """The first device's peaks: by name, else (ROCm builds that write an empty name) by its
    recorded properties."""
    d = trace.devices
    if d.height == 0:
        return None, None
    row = d.row(0, named=True)
    name = row[DeviceCol.NAME]
    if name:
        return str(name), lookup_peaks(str(name), row[DeviceCol.NUM_SMS])
    peaks = peaks_from_properties(row[DeviceCol.CC_MAJOR], row[DeviceCol.CC_MINOR], row[DeviceCol.NUM_SMS],
                                  row[DeviceCol.TOTAL_MEM])
    return (peaks.name, peaks) if peaks else (None, None)
