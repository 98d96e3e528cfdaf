"""Non-CUDA accelerators: MTIA, Intel XPU, Gaudi HPU and PrivateUse1 traces.

No real MTIA/XPU/HPU trace exists here, so real CUDA traces are re-categorised with the category
strings Kineto writes for those backends, and the numbers must come out as they do for the
CUDA original. The strings are ``_activityTypeNames`` in pytorch/kineto
``libkineto/include/ActivityType.h`` @ 114171df: "mtia_runtime" (line 94), "mtia_ccp_events"
(95, "MTIA ondevice CCP events", line 34), "mtia_insight" (96), "hpu_op" (102), "xpu_runtime"
(103), "xpu_driver" (104), "privateuse1_runtime" (106), "privateuse1_driver" (107); each event's
``cat`` is ``toString(op.type())`` (``libkineto/src/output_json.cpp`` line 953). Which are device
side is PyTorch's ``deviceTypeFromActivity`` (``torch/csrc/profiler/kineto_shim.cpp``): XPU and
PrivateUse1 kernels keep the category "kernel".
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import tracewhy
from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from tracewhy.analyses.info import info
from tracewhy.analyses.kernels import kernels
from tracewhy.analyses.utilization import device_busy
from tracewhy.model import Col, Kind
from tracewhy.readers.kineto.categories import category_kind
from tracewhy.reports.diagnose import diagnose

REAL = "tracelens/h100_bert-small_bs1_seq512.json.gz"


def _recategorised(tmp_path: Path, name: str, cats: dict[str, str]) -> Path:
    """The real trace with every event of a category in ``cats`` given the new category."""
    with gzip.open(shared_trace(REAL), "rb") as f:
        doc: dict[str, Any] = json.load(f)
    for e in doc["traceEvents"]:
        if e.get("cat") in cats:
            e["cat"] = cats[e["cat"]]
    out = tmp_path / f"{name}.json"
    out.write_text(json.dumps(doc))
    return out


def _busy_ns(trace: tracewhy.Trace) -> dict[int, int]:
    return {d: int((b.ends - b.starts).sum()) for d, b in device_busy(trace).items()}


def _linked(trace: tracewhy.Trace) -> int:
    return trace.of_kind(Kind.KERNEL).filter(pl.col(Col.LAUNCH).is_not_null()).height


@pytest.fixture(scope="module")
def cuda() -> tracewhy.Trace:
    return tracewhy.load(shared_trace(REAL))


@pytest.mark.parametrize(("backend", "cats"), [
    ("MTIA", {"kernel": "mtia_ccp_events", "cuda_runtime": "mtia_runtime", "cuda_driver": "mtia_runtime"}),
    ("HPU", {"kernel": "hpu_op"}),
    ("XPU", {"cuda_runtime": "xpu_runtime", "cuda_driver": "xpu_driver"}),
    ("PrivateUse1", {"cuda_runtime": "privateuse1_runtime", "cuda_driver": "privateuse1_driver"}),
])
def test_accelerator_trace_measures_as_its_cuda_original(tmp_path: Path, cuda: tracewhy.Trace, backend: str,
                                                          cats: dict[str, str]) -> None:
    trace = tracewhy.load(_recategorised(tmp_path, backend, cats))
    trace.check()
    assert trace.meta.accelerator == backend
    assert info(trace).accelerator == backend
    # Device activity: the same busy time and the same kernels as the CUDA original.
    assert _busy_ns(trace) == _busy_ns(cuda) != {}
    assert kernels(trace).total_count == kernels(cuda).total_count > 0
    # Runtime calls are launches: every kernel linked to its launch as in the original.
    assert _linked(trace) == _linked(cuda) > 0
    codes = {f.code for f in diagnose(trace).findings}
    assert "cpu-only-trace" not in codes


def test_cuda_original_says_cuda(cuda: tracewhy.Trace) -> None:
    assert cuda.meta.accelerator == "CUDA"


def test_cpu_trace_has_no_accelerator_and_is_cpu_only() -> None:
    trace = tracewhy.load(GENERATED / "cpu_eager_schedule.pt.trace.json.gz")
    assert trace.meta.accelerator is None
    assert "cpu-only-trace" in {f.code for f in diagnose(trace).findings}


def _mtia_loop() -> KinetoBuilder:
    """Two steps on an MTIA device: an op launches CCP work through the MTIA runtime, then the
    host sleeps 400 us, so the device idles between the two."""
    b = KinetoBuilder()
    for step, t0 in enumerate((0.0, 1000.0)):
        b.annotation(f"ProfilerStep#{step}", t0, 900.0)
        b.op("aten::mm", t0 + 10, 50.0)
        b.launch("mtia::gemm", t0 + 20, 10.0, t0 + 40, 300.0)
    for e in b.events:
        if e["cat"] == "cuda_runtime":
            e["cat"], e["name"] = "mtia_runtime", "mtiaLaunchKernel"
        elif e["cat"] == "kernel":
            e["cat"] = "mtia_ccp_events"
    return b


def test_inline_mtia_trace(tmp_path: Path) -> None:
    trace = tracewhy.load(_mtia_loop().write(tmp_path / "mtia.json"))
    trace.check()
    ccp = trace.of_kind(Kind.KERNEL)
    assert ccp.height == 2
    assert ccp.get_column(Col.LAUNCH).null_count() == 0
    assert _busy_ns(trace) == {0: 600_000}
    assert trace.of_kind(Kind.OTHER).height == 0
    assert trace.meta.accelerator == "MTIA"


@pytest.mark.parametrize(("cat", "kind"), [
    ("mtia_ccp_events", Kind.KERNEL), ("hpu_op", Kind.KERNEL), ("mtia_insight", Kind.GPU_ANNOTATION),
    ("mtia_runtime", Kind.RUNTIME), ("xpu_runtime", Kind.RUNTIME), ("glow_runtime", Kind.RUNTIME),
    ("privateuse1_runtime", Kind.RUNTIME), ("xpu_driver", Kind.DRIVER), ("privateuse1_driver", Kind.DRIVER),
    ("xpu_sync", Kind.GPU_SYNC),
    # A backend no table lists yet, named the Kineto way.
    ("npu_runtime", Kind.RUNTIME), ("npu_driver", Kind.DRIVER),
    ("cpu_instant_event", Kind.OTHER), ("_runtime", Kind.OTHER), ("whatever", Kind.OTHER),
])
def test_category_kinds(cat: str, kind: Kind) -> None:
    assert category_kind(cat) is kind


def test_unknown_backend_named_from_its_runtime_category(tmp_path: Path) -> None:
    b = _mtia_loop()
    for e in b.events:
        if e["cat"] == "mtia_runtime":
            e["cat"] = "npu_runtime"
        elif e["cat"] == "mtia_ccp_events":
            e["cat"] = "kernel"
    trace = tracewhy.load(b.write(tmp_path / "npu.json"))
    assert trace.meta.accelerator == "npu"
    assert trace.of_kind(Kind.KERNEL).get_column(Col.LAUNCH).null_count() == 0


def test_rocm_traces_say_rocm() -> None:
    # ROCm builds reuse the CUDA-named categories: the header's hip/roctracer version keys
    # decide, or, where the file has none (the MI250 toy), the hip* runtime calls.
    for rel in ("tracelens/mi300x_bert-small_bs1_seq512.json.gz", "hta/mi250_minitoy_train_rocm6.2.json.gz"):
        assert tracewhy.load(shared_trace(rel)).meta.accelerator == "ROCm", rel


def test_xpu_runtime_without_device_work_asks_for_the_xpu_activity(tmp_path: Path) -> None:
    # Captured with activities=[CPU] on an XPU build: the runtime calls are there, the kernels not.
    b = _mtia_loop()
    b.events = [dict(e, cat="xpu_runtime") if e["cat"] == "mtia_runtime" else e for e in b.events
                if e["cat"] != "mtia_ccp_events"]
    trace = tracewhy.load(b.write(tmp_path / "xpu_cpu_only.json"))
    assert trace.meta.accelerator == "XPU"
    finding = next(f for f in diagnose(trace).findings if f.code == "cpu-only-trace")
    assert "ProfilerActivity.XPU" in finding.next_step


def _mtia_with_dma() -> KinetoBuilder:
    """``_mtia_loop`` with the DMA transfers an MTIA command processor records beside its work.

    The layout is that of the MTIA traces in HolisticTraceAnalysis' tests
    (tests/data/mtia_trace_single_rank/mtia_rank_0.json.gz, 2024-11): category
    "mtia_ccp_events", name "dma_request", no correlation (the device issued it, no host launch),
    args ``{"direction": "DEVICE_TO_HOST", "size": 16, "k_work_ptr": ..., "packet_ptr": ...,
    "sqid": 1}``; in that trace 22,361 of the 25,814 CCP events are such requests, and HTA counts
    the other 3,453 as kernels (its memory pattern ``^dma``, hta/common/types.py)."""
    b = _mtia_loop()
    for t0, direction, size in ((350.0, "HOST_TO_DEVICE", 4096), (1350.0, "DEVICE_TO_HOST", 16),
                                (1360.0, "DEVICE_TO_DEVICE", 1024)):
        b.events.append({"ph": "X", "cat": "mtia_ccp_events", "name": "dma_request", "pid": 0, "tid": 801,
                         "ts": t0, "dur": 8.0, "args": {"direction": direction, "size": size,
                                                        "k_work_ptr": 3221765576, "packet_ptr": 225, "sqid": 1}})
    return b


def test_mtia_dma_requests_are_copies_with_their_direction(tmp_path: Path) -> None:
    """A CCP event whose args give a transfer direction and size is a copy, not a kernel: the
    kernels are the two launched CCP works, and the copies have their direction and bytes."""
    trace = tracewhy.load(_mtia_with_dma().write(tmp_path / "mtia_dma.json"))
    trace.check()
    assert kernels(trace).total_count == 2
    copies = trace.of_kind(Kind.MEMCPY).join(trace.copy_attrs, on=Col.ID)
    got = sorted((str(r["copy_kind"]), r["bytes"], r[Col.DUR]) for r in copies.iter_rows(named=True))
    assert got == [("DtoD", 1024, 8000), ("DtoH", 16, 8000), ("HtoD", 4096, 8000)]
    # The device is busy with work or copies for the same time either way.
    assert _busy_ns(trace) == {0: 600_000 + 3 * 8000}


def test_mtia_event_record_and_wait_are_syncs_not_work(tmp_path: Path) -> None:
    """MTIA's event_record and event_wait share the CCP category with the work; their args carry
    the event's sequence number (and the waited stream), as in HTA's MTIA inference test trace
    (tests/data/mtia_inference_trace, 2026-01: 48 event_wait rows hold 353 ms, 46% of what was
    read as kernel time). A stream waiting is not busy: they are sync records."""
    b = _mtia_loop()
    common = {"sqid": 11, "host_ctx": 1}
    b.events.append({"ph": "X", "cat": "mtia_ccp_events", "name": "event_record", "pid": 0, "tid": 3672,
                     "ts": 345.0, "dur": 0.2, "args": {"stream": 105, "seq_num": 259094, **common}})
    b.events.append({"ph": "X", "cat": "mtia_ccp_events", "name": "event_wait", "pid": 0, "tid": 3774,
                     "ts": 346.0, "dur": 600.0, "args": {"stream": 108, "wait_on_stream": 105, "seq_num": 550218,
                                                         **common}})
    trace = tracewhy.load(b.write(tmp_path / "mtia_events.json"))
    trace.check()
    assert kernels(trace).total_count == 2
    syncs = trace.of_kind(Kind.GPU_SYNC)
    assert sorted(syncs.get_column(Col.NAME).cast(pl.String).to_list()) == ["event_record", "event_wait"]
    assert trace.sync_attrs.get_column("wait_stream").to_list() == [105]
    assert _busy_ns(trace) == {0: 600_000}
