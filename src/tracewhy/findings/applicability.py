"""What the run was, read from the trace's structure: whether it used a GPU and which one (its
compute capability), its communication backend and world size, whether the program is
PyTorch, and whether its DataLoader already runs worker processes. Rules ask these facts
before giving advice that only fits some platforms, so no advice names a feature the run lacks."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import polars as pl

from tracewhy.analyses.api_names import holding_any
from tracewhy.analyses.name_codes import decide, distinct_names
from tracewhy.findings.context import Context
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, LAUNCH_KINDS, Col, DeviceCol, Kind
from tracewhy.model.trace import KINETO_FORMAT, NSYS_FORMAT, Trace

#: TF32 and BF16 tensor cores arrived with Ampere (sm_80); Volta (7.0) and Turing (7.5) have
#: FP16 tensor cores only.
TF32_BF16_MIN_CC: Final = (8, 0)

#: Compute capability from the device name, for traces without device properties (older
#: Kineto wrote only the name): the chips that lack TF32/BF16 are the ones worth knowing.
_CC_BY_NAME: Final = ((re.compile(r"V100|TITAN V\b|\bGV100"), (7, 0)),
                      (re.compile(r"\bT4\b|RTX 20\d0|Quadro RTX|TITAN RTX|\bTU10\d"), (7, 5)),
                      (re.compile(r"P100|\bGP100"), (6, 0)), (re.compile(r"\bP40\b|\bP4\b|GTX 10\d0"), (6, 1)))

#: Version keys each vendor's tracing library writes into a Kineto header (CUPTI on NVIDIA;
#: roctracer / HIP on ROCm builds of PyTorch, e.g. roctracer_version, hip_runtime_version).
_VENDOR_VERSION_PREFIXES: Final = {"amd": ("hip", "roctracer", "rocm", "roctx"),
                                   "nvidia": ("cuda", "cupti", "nccl", "nvtx")}

#: Accelerators that are not CUDA/ROCm GPUs: no tensor cores, no autocast('cuda'), and
#: collectives through their own libraries (HCCL on Gaudi, oneCCL on XPU), not NCCL/RCCL.
_NON_CUDA_ACCELERATORS: Final = frozenset({"MTIA", "HPU", "XPU", "PrivateUse1"})

#: What PyTorch leaves in an Nsight Systems capture: its ops as NVTX ranges (emit_nvtx, or
#: record_function ranges under nsys), and Python frames from inside the torch package.
_TORCH_NAME: Final = re.compile(r"^aten::|^ProfilerStep#|^autograd::")
_TORCH_FRAME: Final = re.compile(r"(^|[/\\])torch[/\\]")

#: The DataLoader's iterator class says whether it has workers (torch names the __next__
#: annotation "enumerate(DataLoader)#<Iterator>.__next__"); a worker's own loop appears only
#: when the worker process is in the capture (nsys with Python sampling).
_WITH_WORKERS_LITERALS: Final = ("_MultiProcessingDataLoaderIter", "_worker_loop")
_WITHOUT_WORKERS_LITERALS: Final = ("_SingleProcessDataLoaderIter",)
_WITH_WORKERS: Final = re.compile("|".join(map(re.escape, _WITH_WORKERS_LITERALS)))
_WITHOUT_WORKERS: Final = re.compile("|".join(map(re.escape, _WITHOUT_WORKERS_LITERALS)))


class RunFacts(msgspec.Struct, frozen=True):
    """The run's platform and program, each fact with the rule that decided it."""

    gpu_activity: bool
    device_properties: int
    device_runtime_calls: bool
    compute_capability: tuple[int, int] | None
    compute_capability_rule: str
    vendor: str | None
    vendor_rule: str
    accelerator: str | None
    world_size: int | None
    backend: str | None
    pytorch: bool
    pytorch_rule: str
    #: True: the DataLoader runs worker processes; False: it loads in the main process; None: unknown.
    loader_workers: bool | None
    loader_workers_rule: str

    @property
    def cpu_only(self) -> bool:
        """No device activity, no device properties and no device runtime calls: the run used no
        accelerator (a GPU run captured without its device activity still has the properties)."""
        return not (self.gpu_activity or self.device_properties or self.device_runtime_calls)

    @property
    def tf32_bf16(self) -> bool | None:
        """Whether the GPU has TF32/BF16 tensor cores (None: no GPU capability known)."""
        if self.compute_capability is None:
            return None
        return self.compute_capability >= TF32_BF16_MIN_CC

    @property
    def cuda_like(self) -> bool:
        """The device is an NVIDIA or AMD GPU (ROCm builds of PyTorch answer to 'cuda'), so CUDA
        advice (tensor cores, autocast('cuda'), NCCL) fits; not MTIA, Gaudi (HPU) or XPU."""
        return (not self.cpu_only and self.accelerator not in _NON_CUDA_ACCELERATORS
                and self.vendor in ("nvidia", "amd", None))

    @property
    def nccl_fits(self) -> bool:
        """NCCL advice fits: several ranks on NVIDIA or AMD GPUs (RCCL answers to 'nccl')."""
        return self.cuda_like and (self.world_size or 0) > 1

    def evidence(self) -> dict[str, Any]:
        """The facts a finding's advice was decided from, for its evidence."""
        cc = self.compute_capability
        return {"cpu_only": self.cpu_only, "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
                "compute_capability_rule": self.compute_capability_rule, "vendor": self.vendor,
                "world_size": self.world_size, "backend": self.backend, "pytorch": self.pytorch,
                "pytorch_rule": self.pytorch_rule, "loader_workers": self.loader_workers,
                "loader_workers_rule": self.loader_workers_rule}


def run_facts(ctx: Context) -> RunFacts:
    """The facts of the context's trace, computed once per diagnosis."""
    return ctx.cached("run_facts", lambda: facts_of(ctx.trace, slice_names(ctx)))


def slice_names(ctx: Context) -> list[str]:
    """Every distinct non-empty slice name of the context's trace, listed once per diagnosis: the
    run's facts read them, and so do the rules that look for a wrapper's block or a backward node."""
    return ctx.cached("slice_names", lambda: distinct_slice_names(ctx.trace))


def distinct_slice_names(trace: Trace) -> list[str]:
    """In the order each name first appears. The distinct names are found among the names'
    codes and only they become strings: a String copy of every name first was 0.45 GB and
    0.5 s on a 600 MB nsys export's 8 M slices, and listed the names in no fixed order."""
    names = trace.slices.get_column(Col.NAME).unique(maintain_order=True).drop_nulls()
    return [n for n in names.cast(pl.String).to_list() if n]


def _distinct_names(trace: Trace, kinds: Sequence[Kind]) -> list[str]:
    """The distinct names of these kinds' slices (only they become strings)."""
    return distinct_names(trace.kind_columns(kinds, Col.NAME).get_column(Col.NAME))[1]


def facts_of(trace: Trace, names: list[str] | None = None) -> RunFacts:
    """``names``: the trace's distinct slice names where the caller has them."""
    names = distinct_slice_names(trace) if names is None else names
    cc, cc_rule = _compute_capability(trace)
    vendor, vendor_rule = gpu_vendor(trace)
    pytorch, pytorch_rule = _pytorch(trace, names)
    workers, workers_rule = _loader_workers(names)
    backend = trace.meta.distributed.get("backend")
    return RunFacts(
        gpu_activity=trace.of_kind(*GPU_ACTIVITY_KINDS).height > 0, device_properties=trace.devices.height,
        device_runtime_calls=trace.count(*LAUNCH_KINDS) > 0, compute_capability=cc,
        compute_capability_rule=cc_rule, vendor=vendor, vendor_rule=vendor_rule,
        accelerator=trace.meta.accelerator, world_size=trace.meta.world_size,
        backend=backend if isinstance(backend, str) else None, pytorch=pytorch, pytorch_rule=pytorch_rule,
        loader_workers=workers, loader_workers_rule=workers_rule,
    )


def gpu_vendor(trace: Trace) -> tuple[str | None, str]:
    """"nvidia", "amd" or None, and the rule that decided, in order of trust: the format
    (Nsight Systems records only NVIDIA GPUs), the tracing library's version keys, the runtime
    API the launches went through (cuda* vs hip*), then the device name."""
    if trace.meta.format.startswith(NSYS_FORMAT):
        return "nvidia", "an Nsight Systems capture"
    for vendor, prefixes in _VENDOR_VERSION_PREFIXES.items():
        keys = [k for k in trace.meta.versions if k.lower().startswith(prefixes)]
        if keys:
            return vendor, f"the trace header's {keys[0]}"
    launches = _distinct_names(trace, LAUNCH_KINDS)
    for vendor, prefix in (("amd", "hip"), ("nvidia", "cu")):
        if any(isinstance(n, str) and n.startswith(prefix) for n in launches):
            return vendor, f"{prefix}* runtime calls"
    device_names = " ".join(str(n) for n in trace.devices.get_column(DeviceCol.NAME).to_list()).lower()
    for vendor, word in (("amd", "amd"), ("nvidia", "nvidia")):
        if word in device_names:
            return vendor, "the device name"
    return None, "nothing in the trace names the vendor"


def _compute_capability(trace: Trace) -> tuple[tuple[int, int] | None, str]:
    """The lowest compute capability among the described GPUs (advice must fit every one), from
    the device properties, else from a device name that has one."""
    d = trace.devices
    known = d.filter(pl.col(DeviceCol.CC_MAJOR).is_not_null() & (pl.col(DeviceCol.CC_MAJOR) > 0))
    if known.height:
        major, minor = min((int(a), int(b or 0)) for a, b in known.select(DeviceCol.CC_MAJOR, DeviceCol.CC_MINOR)
                           .iter_rows())
        return (major, minor), "the device properties"
    for name in d.get_column(DeviceCol.NAME).drop_nulls().to_list():
        for pattern, cc in _CC_BY_NAME:
            if pattern.search(str(name)):
                return cc, f"the device name {name!r}"
    return None, "no device properties"


def _pytorch(trace: Trace, names: list[str]) -> tuple[bool, str]:
    if trace.meta.format == KINETO_FORMAT:
        return True, "a PyTorch profiler (Kineto) trace"
    if any(_TORCH_NAME.search(n) for n in names):
        return True, "PyTorch ops (aten::) in the capture"
    frames = _distinct_names(trace, [Kind.PYTHON])
    if any(isinstance(n, str) and _TORCH_FRAME.search(n) for n in frames):
        return True, "Python frames from torch in the capture"
    return False, "no PyTorch ops (aten::), ProfilerStep ranges or torch Python frames in the capture"


def _loader_workers(names: list[str]) -> tuple[bool | None, str]:
    # Each name's iterator ("with" or "without" workers), searched only where a column test finds
    # one of the literals every match holds (an nsys export's 16.6 k distinct names: 3.6 ms of
    # searches one by one).
    iterators = decide(names, _iterator, holding_any(_WITH_WORKERS_LITERALS + _WITHOUT_WORKERS_LITERALS), None)
    with_workers = next((n for n, it in zip(names, iterators, strict=True) if it == "with"), None)
    if with_workers is not None:
        return True, f"{with_workers[:80]} (a DataLoader with worker processes)"
    without = next((n for n, it in zip(names, iterators, strict=True) if it == "without"), None)
    if without is not None:
        return False, f"{without[:80]} (a DataLoader without workers, num_workers=0)"
    return None, "no DataLoader iterator in the trace"


def _iterator(name: str) -> str | None:
    """"with" for a name of the DataLoader's iterator with workers, "without" for the one without."""
    return "with" if _WITH_WORKERS.search(name) else "without" if _WITHOUT_WORKERS.search(name) else None


def pinned_copy_advice(facts: RunFacts) -> str:
    """How to pin host memory and copy asynchronously, in the program's own terms: PyTorch's
    calls for a PyTorch program, the CUDA runtime's for any other (a CuPy or MPI+CUDA one)."""
    if facts.pytorch:
        return ("Pin the host buffers: DataLoader(pin_memory=True) or tensor.pin_memory(), then "
                "tensor.to('cuda', non_blocking=True)")
    return ("Pin the host buffers (cudaHostAlloc, or cudaHostRegister on an existing buffer; CuPy: "
            "cupyx.empty_pinned), then copy with cudaMemcpyAsync on a stream")


def device_allocation_advice(facts: RunFacts) -> str:
    """How to stop allocating device memory in the loop, in the program's own terms."""
    if facts.pytorch:
        return ("Keep shapes stable (pad to buckets), try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, and "
                "never call torch.cuda.empty_cache() inside the loop")
    return ("Allocate the device buffers once, outside the loop, and reuse them; or allocate from a pool "
            "(cudaMallocAsync with a memory pool; CuPy's memory pool) instead of cudaMalloc/cudaFree per step")
