"""Write a CUDA caching-allocator snapshot as a long training run recorded with
``torch.cuda.memory._record_memory_history(max_entries=...)`` and dumped with
``_dump_snapshot()`` would leave it (about 100 MB), for bench_snapshot.py.

No GPU is needed: a small model of the caching allocator (torch 2.13's
``c10/cuda/CUDACachingAllocator.cpp`` rules: 512-byte rounding, a small pool of 2 MiB segments
for requests up to 1 MiB, 20 MiB segments for requests under 10 MiB, larger ones rounded to
2 MiB, best-fit with splitting and coalescing, frees delayed by ``record_stream``,
``empty_cache``) runs a 24-layer transformer's forward, backward, Adam step and
``zero_grad`` and keeps the last ``max_entries`` trace entries, as the allocator's ring buffer
does. The pickle shares objects as ``torch/csrc/cuda/Module.cpp`` and ``py_symbolize`` build
them: one dict per distinct frame, one list per captured traceback (an allocation's own, a
free's shared by its free_requested and free_completed entries), the same key and action
strings throughout. Sizes in trace entries are the requested bytes, as the allocator records
them. Deterministic for a seed; written under /tmp, never into the repository.

    python bench/make_snapshot.py                       # /tmp/tracewhy-bench/snapshot.pickle
    python bench/make_snapshot.py --max-entries 20000 -o /tmp/tracewhy-bench/small.pickle
"""

from __future__ import annotations

import argparse
import bisect
import pickle
import random
import sys
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KiB, MiB = 1 << 10, 1 << 20
SMALL_REQUEST = 1 * MiB  # kSmallSize: requests up to here come from the small pool
SMALL_SEGMENT = 2 * MiB  # kSmallBuffer
LARGE_SEGMENT = 20 * MiB  # kLargeBuffer, for requests under kMinLargeAlloc
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB
SIDE_STREAM = 0x55D3_1F2A_9C40  # a cudaStream_t the input pipeline copies on
DEFAULT_OUT = Path(tempfile.gettempdir()) / "tracewhy-bench" / "snapshot.pickle"
# Where a pip-installed torch and a user's project sit; C++ frames name the build tree.
TORCH = "/opt/conda/lib/python3.11/site-packages/torch"
USER = "/home/alice/llm"
CPP = "/pytorch"

Frame = dict[str, Any]


class Frames:
    """One dict per distinct frame, as ``symbolize`` gives them (each with its own strings)."""

    def __init__(self) -> None:
        self.known: dict[tuple[str, int, str], Frame] = {}

    def get(self, filename: str, line: int, name: str) -> Frame:
        key = (filename, line, name)
        if key not in self.known:
            # Fresh string objects, as each symbolized frame has, so pickle stores each once per frame.
            self.known[key] = {"name": "".join(name), "filename": "".join(filename), "line": line}
        return self.known[key]


INTERP = [("??", 0, "_PyEval_EvalFrameDefault"), ("??", 0, "_PyFunction_Vectorcall"), ("??", 0, "PyObject_Call")]
CAPTURE = [("??", 0, "torch::unwind::unwind()"), ("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
           (f"{CPP}/torch/csrc/cuda/Module.cpp", 0, "gather_with_cpp()")]
MALLOC = [(f"{CPP}/c10/cuda/CUDACachingAllocator.cpp", 1320,
           "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, "
           "CUstream_st*)"),
          (f"{CPP}/c10/cuda/CUDACachingAllocator.cpp", 3803,
           "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, "
           "unsigned long, CUstream_st*)"),
          (f"{CPP}/c10/cuda/CUDACachingAllocator.cpp", 3920,
           "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)"),
          (f"{CPP}/aten/src/ATen/EmptyTensor.cpp", 54, "at::TensorBase at::detail::_empty_generic<long>(...)"),
          (f"{CPP}/aten/src/ATen/cuda/EmptyTensor.cpp", 21, "at::detail::empty_cuda(...)"),
          (f"{CPP}/aten/src/ATen/native/cuda/TensorFactories.cu", 53, "at::native::empty_cuda(...)")]
FREE = [(f"{CPP}/c10/cuda/CUDACachingAllocator.cpp", 1512,
         "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(c10::cuda::CUDACachingAllocator::"
         "Native::Block*)"),
        (f"{CPP}/c10/cuda/CUDACachingAllocator.cpp", 3755, "c10::cuda::CUDACachingAllocator::Native::local_raw_delete"
                                                           "(void*)"),
        (f"{CPP}/c10/core/StorageImpl.h", 60, "c10::StorageImpl::~StorageImpl()"),
        (f"{CPP}/c10/core/TensorImpl.cpp", 124, "c10::TensorImpl::~TensorImpl()")]
ENGINE = [(f"{CPP}/torch/csrc/autograd/engine.cpp", 1106, "torch::autograd::Engine::evaluate_function(...)"),
          (f"{CPP}/torch/csrc/autograd/engine.cpp", 586, "torch::autograd::Engine::thread_main(...)"),
          (f"{CPP}/torch/csrc/autograd/python_engine.cpp", 92,
           "torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<...> const&, bool)"),
          ("??", 0, "std::thread::_State_impl<...>::_M_run()"), ("??", 0, "start_thread"), ("??", 0, "clone")]
MAIN = [(f"{USER}/train.py", 231, "<module>"), (f"{USER}/train.py", 198, "main"),
        (f"{USER}/train.py", 152, "train_one_epoch")]
CALL = [(f"{TORCH}/nn/modules/module.py", 1775, "_wrapped_call_impl"),
        (f"{TORCH}/nn/modules/module.py", 1786, "_call_impl")]
RUNTIME = [("??", 0, "Py_RunMain"), ("??", 0, "Py_BytesMain"), ("??", 0, "__libc_start_main"), ("??", 0, "_start")]


def _python_stack(calls: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    """Outermost-first Python calls as innermost-first frames, each above its interpreter frames."""
    out: list[tuple[str, int, str]] = []
    for frame in reversed(calls):
        out += [frame, *INTERP]
    return out + RUNTIME


def _op(op: str, kernel: str) -> list[tuple[str, int, str]]:
    """The dispatcher frames between an ATen op's Python binding and its CUDA kernel's output."""
    return [(f"{CPP}/build/aten/src/ATen/RegisterCUDA.cpp", 4120,
             f"at::(anonymous namespace)::wrapper_CUDA_{kernel}(...)"),
            (f"{CPP}/aten/src/ATen/core/boxing/impl/make_boxed_from_unboxed_functor.h", 486,
             f"c10::impl::wrap_kernel_functor_unboxed_<...{kernel}...>::call(...)"),
            (f"{CPP}/build/aten/src/ATen/Operators_2.cpp", 1460, f"at::_ops::{op}::redispatch(...)"),
            (f"{CPP}/torch/csrc/autograd/generated/VariableType_2.cpp", 7012,
             f"torch::autograd::VariableType::(anonymous namespace)::{op}(...)"),
            (f"{CPP}/build/aten/src/ATen/Operators_2.cpp", 1455, f"at::_ops::{op}::call(...)"),
            (f"{CPP}/torch/csrc/autograd/generated/python_torch_functions_1.cpp", 3300,
             f"torch::autograd::THPVariable_{op}(_object*, _object*, _object*)")]


@dataclass
class Site:
    """Where one kind of allocation happens: its stack (innermost first) and its free's stack."""

    alloc: list[tuple[str, int, str]]
    free: list[tuple[str, int, str]]


def _forward_site(module_line: int, op: str, kernel: str, torch_file: str, torch_line: int) -> Site:
    calls = [*MAIN, (f"{USER}/train.py", 160, "train_one_epoch"), *CALL, (f"{USER}/model.py", 212, "forward"),
             *CALL, (f"{USER}/model.py", 140, "forward"), *CALL, (f"{USER}/model.py", module_line, "forward"),
             *CALL, (f"{TORCH}/{torch_file}", torch_line, "forward")]
    free = _python_stack([*MAIN, (f"{USER}/train.py", 164, "train_one_epoch"),
                          (f"{TORCH}/_tensor.py", 647, "backward"),
                          (f"{TORCH}/autograd/__init__.py", 354, "backward"),
                          (f"{TORCH}/autograd/graph.py", 829, "_engine_run_backward")])
    return Site(CAPTURE + MALLOC + _op(op, kernel) + _python_stack(calls),
                CAPTURE + FREE + [(f"{CPP}/torch/csrc/autograd/saved_variable.cpp", 80,
                                   "torch::autograd::SavedVariable::reset_data()")] + free)


def _backward_site(node: str, op: str, kernel: str) -> Site:
    engine = [(f"{CPP}/torch/csrc/autograd/generated/Functions.cpp", 2100,
               f"torch::autograd::generated::{node}::apply(std::vector<at::Tensor>&&)"), *ENGINE]
    return Site(CAPTURE + MALLOC + _op(op, kernel) + engine,
                CAPTURE + FREE + [(f"{CPP}/torch/csrc/autograd/input_buffer.cpp", 140,
                                   "torch::autograd::InputBuffer::~InputBuffer()")] + engine)


def _optim_site(line: int, op: str) -> Site:
    calls = [*MAIN, (f"{USER}/train.py", 167, "train_one_epoch"),
             (f"{TORCH}/optim/optimizer.py", 516, "wrapper"), (f"{TORCH}/optim/adam.py", 247, "step"),
             (f"{TORCH}/optim/adam.py", 949, "adam"), (f"{TORCH}/optim/adam.py", line, "_multi_tensor_adam")]
    stack = _python_stack(calls)
    return Site(CAPTURE + MALLOC + _op(op, op) + stack, CAPTURE + FREE + stack)


SITES: dict[str, Site] = {
    "ln": _forward_site(120, "native_layer_norm", "native_layer_norm", "nn/modules/normalization.py", 229),
    "qkv": _forward_site(98, "addmm", "addmm", "nn/modules/linear.py", 134),
    "attn": _forward_site(104, "_scaled_dot_product_flash_attention", "flash_attention",
                          "nn/functional.py", 6010),
    "proj": _forward_site(106, "addmm", "addmm", "nn/modules/linear.py", 134),
    "fc1": _forward_site(76, "addmm", "addmm", "nn/modules/linear.py", 134),
    "gelu": _forward_site(77, "gelu", "gelu", "nn/modules/activation.py", 816),
    "fc2": _forward_site(78, "addmm", "addmm", "nn/modules/linear.py", 134),
    "drop": _forward_site(79, "native_dropout", "native_dropout", "nn/modules/dropout.py", 73),
    "add": _forward_site(142, "add", "add_Tensor", "nn/modules/module.py", 1786),
    "g_mm": _backward_site("AddmmBackward0", "mm", "mm"),
    "g_attn": _backward_site("ScaledDotProductFlashAttentionBackward0", "_flash_attention_backward",
                             "flash_attention_backward"),
    "g_ln": _backward_site("NativeLayerNormBackward0", "native_layer_norm_backward", "native_layer_norm_backward"),
    "g_acc": _backward_site("AccumulateGrad", "clone", "clone"),
    "adam_mul": _optim_site(544, "_foreach_mul"),
    "adam_sqrt": _optim_site(578, "_foreach_sqrt"),
    "adam_div": _optim_site(590, "_foreach_div"),
    "input": Site(CAPTURE + MALLOC + _op("_to_copy", "_to_copy") + _python_stack([
        *MAIN, (f"{USER}/train.py", 157, "train_one_epoch"), (f"{USER}/data.py", 61, "to_device")]),
        CAPTURE + FREE + _python_stack([*MAIN, (f"{USER}/train.py", 157, "train_one_epoch")])),
    "zero_grad": Site([], CAPTURE + FREE + _python_stack([
        *MAIN, (f"{USER}/train.py", 168, "train_one_epoch"),
        (f"{TORCH}/optim/optimizer.py", 1011, "zero_grad")])),
    "empty_cache": Site([], CAPTURE + _python_stack([*MAIN, (f"{USER}/train.py", 175, "train_one_epoch"),
                                                     (f"{TORCH}/cuda/memory.py", 224, "empty_cache")])),
}


@dataclass
class Block:
    addr: int
    size: int
    segment: Segment
    requested: int = 0
    state: str = "inactive"
    frames: list[Frame] = field(default_factory=list)


@dataclass
class Segment:
    addr: int
    size: int
    pool: str  # "small" or "large"
    stream: int
    frames: list[Frame]
    blocks: list[Block] = field(default_factory=list)  # by address


class Allocator:
    """The caching allocator's bookkeeping, enough to write the trace and final state it would."""

    def __init__(self, rng: random.Random, max_entries: int) -> None:
        self.rng, self.frames = rng, Frames()
        self.trace: deque[dict[str, Any]] = deque(maxlen=max_entries)
        self.segments: dict[int, Segment] = {}
        self.free: dict[tuple[str, int], list[tuple[int, int]]] = {}  # (pool, stream) -> sorted (size, addr)
        self.blocks: dict[int, Block] = {}  # every block by address, free or not
        self.next_address = 0x7F3A_0000_0000
        self.time_us = 1_732_590_000_000_000

    def stack(self, frames: list[tuple[str, int, str]]) -> list[Frame]:
        """A new traceback list of the shared frame dicts (one capture)."""
        return [self.frames.get(*f) for f in frames]

    def record(self, action: str, addr: int, size: int, stream: int, frames: list[Frame]) -> None:
        self.time_us += self.rng.randint(1, 120)
        self.trace.append({"action": action, "addr": addr, "size": size, "stream": stream, "frames": frames,
                           "time_us": self.time_us})

    def malloc(self, size: int, site: Site, stream: int = 0) -> int:
        rounded = max(512, -(-size // 512) * 512)
        pool = "small" if rounded <= SMALL_REQUEST else "large"
        frames = self.stack(site.alloc)
        free = self.free.setdefault((pool, stream), [])
        i = bisect.bisect_left(free, (rounded, 0))
        if i == len(free):
            seg = self._segment(pool, stream, rounded, frames)
            i = bisect.bisect_left(free, (seg.size, seg.addr))
        _, addr = free.pop(i)
        block = self.blocks[addr]
        rest = block.size - rounded
        if rest >= 512 if pool == "small" else rest > SMALL_REQUEST:
            self._split(block, rounded)
        block.state, block.requested, block.frames = "active_allocated", size, frames
        self.record("alloc", addr, size, stream, frames)
        return addr

    def _segment(self, pool: str, stream: int, rounded: int, frames: list[Frame]) -> Segment:
        if pool == "small":
            size = SMALL_SEGMENT
        else:
            size = LARGE_SEGMENT if rounded < MIN_LARGE_ALLOC else -(-rounded // ROUND_LARGE) * ROUND_LARGE
        seg = Segment(self.next_address, size, pool, stream, frames)
        self.next_address += -(-size // ROUND_LARGE) * ROUND_LARGE + ROUND_LARGE
        block = Block(seg.addr, size, seg)
        seg.blocks.append(block)
        self.segments[seg.addr], self.blocks[seg.addr] = seg, block
        bisect.insort(self.free[(pool, stream)], (size, seg.addr))
        self.record("segment_alloc", seg.addr, size, stream, frames)
        return seg

    def _split(self, block: Block, size: int) -> None:
        seg = block.segment
        rest = Block(block.addr + size, block.size - size, seg)
        block.size = size
        seg.blocks.insert(seg.blocks.index(block) + 1, rest)
        self.blocks[rest.addr] = rest
        bisect.insort(self.free[(seg.pool, seg.stream)], (rest.size, rest.addr))

    def free_requested(self, addr: int, site: Site) -> list[Frame]:
        block = self.blocks[addr]
        frames = self.stack(site.free)
        self.record("free_requested", addr, block.requested, block.segment.stream, frames)
        block.state = "active_awaiting_free"
        return frames

    def free_completed(self, addr: int, frames: list[Frame]) -> None:
        block = self.blocks[addr]
        seg = block.segment
        self.record("free_completed", addr, block.requested, seg.stream, frames)
        block.state, block.requested, block.frames = "inactive", 0, []
        free = self.free[(seg.pool, seg.stream)]
        at = seg.blocks.index(block)
        for neighbour in (seg.blocks[at + 1] if at + 1 < len(seg.blocks) else None,
                          seg.blocks[at - 1] if at > 0 else None):
            if neighbour is not None and neighbour.state == "inactive":
                free.remove((neighbour.size, neighbour.addr))
                first, second = sorted((block, neighbour), key=lambda b: b.addr)
                first.size += second.size
                seg.blocks.remove(second)
                del self.blocks[second.addr]
                block = first
        bisect.insort(free, (block.size, block.addr))

    def release(self, addr: int, site: Site) -> None:
        self.free_completed(addr, self.free_requested(addr, site))

    def empty_cache(self) -> None:
        frames = self.stack(SITES["empty_cache"].free)
        for seg in list(self.segments.values()):
            if len(seg.blocks) == 1 and seg.blocks[0].state == "inactive":
                self.free[(seg.pool, seg.stream)].remove((seg.size, seg.addr))
                del self.segments[seg.addr], self.blocks[seg.addr]
                self.record("segment_free", seg.addr, seg.size, seg.stream, frames)


@dataclass(frozen=True)
class Model:
    """A GPT-style model's sizes in bytes (bf16 activations, fp32 weights and Adam state)."""

    layers: int = 24
    hidden: int = 1024
    tokens: int = 8 * 1024  # batch x sequence

    def params(self) -> list[int]:
        h = self.hidden
        return [4 * n for n in (h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h)] * self.layers


def train(alloc: Allocator, model: Model, steps: int) -> None:
    """``model.cuda()``, an Adam optimizer, then ``steps`` iterations with an eval's
    ``empty_cache`` every 25 steps."""
    init = Site(CAPTURE + MALLOC + _python_stack([*MAIN, (f"{USER}/train.py", 120, "main")]), [])
    params = [alloc.malloc(n, init) for n in model.params()]
    state: list[int] = []
    for step in range(steps):
        _step(alloc, model, params, state)
        if step % 25 == 24:
            alloc.empty_cache()


def _step(alloc: Allocator, model: Model, params: list[int], state: list[int]) -> None:
    rng, t, h = alloc.rng, model.tokens, model.hidden
    batch = [alloc.malloc(t * 8, SITES["input"], SIDE_STREAM), alloc.malloc(t * 8, SITES["input"], SIDE_STREAM)]
    act = 2 * t * h  # one bf16 activation
    saved: list[list[int]] = []
    for _ in range(model.layers):
        layer = [alloc.malloc(act, SITES["ln"]), alloc.malloc(t * 8, SITES["ln"]), alloc.malloc(3 * act, SITES["qkv"]),
                 alloc.malloc(act, SITES["attn"]), alloc.malloc(t * 64 + rng.randrange(0, 4096, 4), SITES["attn"]),
                 alloc.malloc(act, SITES["proj"]), alloc.malloc(4 * act, SITES["fc1"]),
                 alloc.malloc(4 * act, SITES["gelu"]), alloc.malloc(act, SITES["fc2"]),
                 alloc.malloc(act // 2, SITES["drop"])]
        alloc.release(alloc.malloc(act, SITES["add"]), SITES["add"])
        saved.append(layer)
    grads: list[int] = []
    for layer, sizes in zip(reversed(saved), _chunks(model.params(), model.layers), strict=True):
        for site in ("g_mm", "g_mm", "g_attn", "g_mm", "g_ln"):
            alloc.release(alloc.malloc(4 * act if site == "g_mm" else act, SITES[site]), SITES[site])
        grads += [alloc.malloc(n, SITES["g_acc"]) for n in sizes]
        for addr in layer:
            alloc.release(addr, SITES["g_mm"])
    for addr in batch:  # record_stream'd inputs: their frees complete once the side stream catches up
        frames = alloc.free_requested(addr, SITES["input"])
        alloc.release(alloc.malloc(512, SITES["adam_mul"]), SITES["adam_mul"])
        alloc.free_completed(addr, frames)
    if not state:
        state += [alloc.malloc(n, SITES["adam_mul"]) for n in model.params() * 2]
    for site in ("adam_mul", "adam_sqrt", "adam_div"):
        temps = [alloc.malloc(n, SITES[site]) for n in model.params()]
        for addr in temps:
            alloc.release(addr, SITES[site])
    for addr in grads:
        alloc.release(addr, SITES["zero_grad"])


def _chunks(items: list[int], n: int) -> list[list[int]]:
    k = len(items) // n
    return [items[i * k:(i + 1) * k] for i in range(n)]


def snapshot(alloc: Allocator, devices: int) -> dict[str, Any]:
    """``torch.cuda.memory._snapshot()``'s dict for the allocator's final state and trace."""
    segments = []
    for seg in sorted(alloc.segments.values(), key=lambda s: s.addr):
        blocks = [{"address": b.addr, "size": b.size, "requested_size": b.requested, "state": b.state,
                   "frames": b.frames} for b in seg.blocks]
        allocated = sum(b.size for b in seg.blocks if b.state == "active_allocated")
        active = sum(b.size for b in seg.blocks if b.state != "inactive")
        segments.append({"device": 0, "address": seg.addr, "total_size": seg.size, "stream": seg.stream,
                         "segment_type": seg.pool, "segment_pool_id": (0, 0), "allocated_size": allocated,
                         "active_size": active, "requested_size": sum(b.requested for b in seg.blocks),
                         "is_expandable": False, "frames": seg.frames, "blocks": blocks})
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
                "expandable_segments": False, "pinned_num_register_threads": 1, "release_lock_on_malloc": False,
                "pinned_use_host_register": False, "roundup_power2_divisions": [1] * 16}
    traces: list[list[dict[str, Any]]] = [list(alloc.trace)] + [[] for _ in range(devices - 1)]
    return {"segments": segments, "device_traces": traces, "allocator_settings": settings}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--steps", type=int, default=170)
    p.add_argument("--max-entries", type=int, default=745_000, help="the ring buffer's size, as in torch")
    p.add_argument("--devices", type=int, default=8, help="device_traces lists (one process's visible GPUs)")
    p.add_argument("--seed", type=int, default=17)
    args = p.parse_args()
    if Path(__file__).resolve().parent.parent in args.out.resolve().parents:
        p.error("write the snapshot outside the repository (default: under /tmp)")
    alloc = Allocator(random.Random(args.seed), args.max_entries)
    train(alloc, Model(), args.steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "wb") as f:
        pickle.dump(snapshot(alloc, args.devices), f)  # as _dump_snapshot: the default protocol
    print(f"{args.out}: {args.out.stat().st_size / 1e6:.1f} MB, {len(alloc.trace):,} trace entries, "
          f"{len(alloc.segments)} segments, {len(alloc.frames.known)} distinct frames")
    return 0


if __name__ == "__main__":
    sys.exit(main())
