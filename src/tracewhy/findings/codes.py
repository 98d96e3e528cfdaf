"""Every code a finding can carry, declared once, each with the one line the docs' table shows.

Codes are stable: scripts match on them in ``--json`` output. To add one, add a member here and
its line in ``_MEANING``, emit it as ``Finding(code=Code.NEW, ...)``, and put the table that
``python scripts/finding_codes.py`` prints into docs/finding-codes.md (``TRACEWHY_UPDATE_DOCS=1
python -m pytest tests/test_finding_codes.py`` does it; that test checks all three).
"""

from __future__ import annotations

from enum import Enum
from typing import Final


class Code(str, Enum):
    """A finding's stable kebab-case code; compares and serializes as the plain string."""

    # About the capture itself (severity trust): how far the other numbers can be trusted.
    EMPTY_TRACE = "empty-trace"
    CAPTURE_HEAVY_OPTIONS = "capture-heavy-options"
    CPU_ONLY_TRACE = "cpu-only-trace"
    GPU_ONLY_TRACE = "gpu-only-trace"
    NO_STEP_MARKERS = "no-step-markers"
    STEP_MARKER_INFERRED = "step-marker-inferred"
    FEW_STEADY_STEPS = "few-steady-steps"
    CUDA_GRAPH_REPLAY = "cuda-graph-replay"
    QUANTISED_TIMES = "quantised-times"
    INCOMPLETE_TRACE = "incomplete-trace"
    READER_WARNINGS = "reader-warnings"
    BLOCKS_SYNCHRONIZED = "blocks-synchronized"
    GPU_WORK_BEFORE_TRACE = "gpu-work-before-trace"
    ACCOUNT_SKIPPED = "account-skipped"
    # The step account: where the step goes.
    COPY_BOUND = "copy-bound"
    ESSENTIAL_WORK = "essential-work"
    UNEXPLAINED_PART = "unexplained-part"
    # GPU utilization and idle time, one code per idle class.
    GPU_LOW_UTILIZATION = "gpu-low-utilization"
    GPU_SATURATED = "gpu-saturated"
    GPU_IDLE_INPUT = "gpu-idle-input"
    GPU_IDLE_SYNC = "gpu-idle-sync"
    GPU_IDLE_LAUNCH = "gpu-idle-launch"
    GPU_IDLE_HOST = "gpu-idle-host"
    GPU_IDLE_ALLOCATOR = "gpu-idle-allocator"
    GPU_IDLE_COMM_WAIT = "gpu-idle-comm-wait"
    GPU_IDLE_GRAPH_LAUNCH = "gpu-idle-graph-launch"
    GPU_IDLE_DEPENDENCY = "gpu-idle-dependency"
    GPU_IDLE_UNTRACED = "gpu-idle-untraced"
    GPU_IDLE_SHORT = "gpu-idle-short"
    INPUT_BOUND = "input-bound"
    # Host-side habits, platform choices, overlap and blocks.
    PAGEABLE_MEMCPY = "pageable-memcpy"
    SYNCHRONOUS_MEMCPY = "synchronous-memcpy"
    ALLOCATOR_IN_STEADY_STATE = "allocator-in-steady-state"
    SCALAR_READ_PER_STEP = "scalar-read-per-step"
    STEP_TIME_SPIKES = "step-time-spikes"
    TENSOR_CORES_UNUSED = "tensor-cores-unused"
    OPTIMIZER_SINGLE_TENSOR = "optimizer-single-tensor"
    ZERO_GRAD_NOT_NONE = "zero-grad-not-none"
    CONV_BIAS_BEFORE_BATCH_NORM = "conv-bias-before-batch-norm"
    TENSOR_BUILT_ON_HOST = "tensor-built-on-host"
    ACTIVATION_RECOMPUTE = "activation-recompute"
    TENSOR_GROWN_BY_CONCAT = "tensor-grown-by-concat"
    PER_SAMPLE_LOOP = "per-sample-loop"
    REDUCE_EVERY_MICROBATCH = "reduce-every-microbatch"
    AUTOGRAD_IN_INFERENCE = "autograd-in-inference"
    GEMM_DIMS_UNALIGNED = "gemm-dims-unaligned"
    EXTRA_COPIES = "extra-copies"
    DATA_PARALLEL_NOT_DDP = "data-parallel-not-ddp"
    SLOW_COMM_BACKEND = "slow-comm-backend"
    MEMORY_NEAR_LIMIT = "memory-near-limit"
    MEMORY_PEAK = "memory-peak"
    MEMORY_FRAGMENTATION = "memory-fragmentation"
    MEMORY_GROWTH = "memory-growth"
    MEMORY_RANK_IMBALANCE = "memory-rank-imbalance"
    MEMORY_GREW = "memory-grew"
    ALLOCATOR_CHURN = "allocator-churn"
    COMM_EXPOSED = "comm-exposed"
    COLLECTIVE_SLOW_BUS = "collective-slow-bus"
    BLOCK_ATTRIBUTION = "block-attribution"
    # torch.compile (tracewhy compile).
    GRAPH_BREAKS = "graph-breaks"
    RECOMPILE = "recompile"
    COMPILE_COLD_START = "compile-cold-start"
    COMPILE_NO_EFFECT = "compile-no-effect"
    RECOMPILE_LIMIT = "recompile-limit"
    MANY_SMALL_REGIONS = "many-small-regions"
    COMPILE_RANKS_DIFFER = "compile-ranks-differ"
    # Many ranks (tracewhy ranks).
    RANK_STRAGGLER = "rank-straggler"
    RANK_IMBALANCE = "rank-imbalance"
    RANK_COLLECTIVE_MISMATCH = "rank-collective-mismatch"
    RANK_TRACE_INCOMPLETE = "rank-trace-incomplete"
    RANKS_NOT_ONE_JOB = "ranks-not-one-job"
    # Pipelines from stage marks (tracewhy pipeline).
    PIPELINE_SERIALIZED = "pipeline-serialized"
    PIPELINE_OVERLAP_LOW = "pipeline-overlap-low"
    PIPELINE_PERIOD_SPIKES = "pipeline-period-spikes"
    # The six ``nsys analyze`` rules, with NVIDIA's thresholds.
    NSYS_ASYNC_MEMCPY_PAGEABLE = "nsys-async-memcpy-pageable"
    NSYS_SYNC_MEMCPY = "nsys-sync-memcpy"
    NSYS_SYNC_MEMSET = "nsys-sync-memset"
    NSYS_SYNC_API = "nsys-sync-api"
    NSYS_GPU_GAPS = "nsys-gpu-gaps"
    NSYS_GPU_LOW_UTILIZATION = "nsys-gpu-low-utilization"

    def __str__(self) -> str:
        # The code itself, as enum.StrEnum (Python 3.11+, and tracewhy runs on 3.10) gives it:
        # text and f-strings read "empty-trace", never "Code.EMPTY_TRACE".
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @property
    def meaning(self) -> str:
        """What a finding with this code says, in one line."""
        return _MEANING[self]


_MEANING: Final[dict[Code, str]] = {
    Code.EMPTY_TRACE: "The trace holds no slices (no ops, kernels or annotations): nothing to analyze.",
    Code.CAPTURE_HEAVY_OPTIONS: "Captured with with_stack, profile_memory, with_flops or with_modules: CPU "
                                "durations are inflated, so the trace attributes time but does not measure it.",
    Code.CPU_ONLY_TRACE: "No GPU activity in the trace: GPU idle time, launch overhead and overlap cannot be "
                         "measured.",
    Code.GPU_ONLY_TRACE: "GPU activity but no CPU ops: idle gaps cannot be explained by host activity.",
    Code.NO_STEP_MARKERS: "No step markers: figures cover the whole trace, warm-up included, not one step.",
    Code.STEP_MARKER_INFERRED: "No ProfilerStep markers: steps are a repeated annotation, or the loop's iterations, "
                               "chosen from the trace's structure.",
    Code.FEW_STEADY_STEPS: "Too few steady steps after warm-up for per-step figures to separate an effect from noise.",
    Code.CUDA_GRAPH_REPLAY: "CUDA/HIP graph launches: replayed work by kernel family, charged to what launched each "
                            "graph (no capture to match it to the recording ops), and what ran eagerly between.",
    Code.QUANTISED_TIMES: "Start times are float epoch microseconds: gaps shorter than their resolution are not "
                          "resolved.",
    Code.INCOMPLETE_TRACE: "The file is cut or lacks events: figures cover only the events it holds.",
    Code.READER_WARNINGS: "The reader skipped or reinterpreted part of a complete file.",
    Code.BLOCKS_SYNCHRONIZED: "A synchronize ends most annotated blocks that launched GPU work, so blocks cannot "
                              "overlap.",
    Code.GPU_WORK_BEFORE_TRACE: "A launch issued long before its GPU's first recorded work waited on work queued "
                                "before the capture (or a clock offset), not on launch overhead.",
    Code.ACCOUNT_SKIPPED: "The step account, the critical path and the predicted step times were left out: they "
                          "would not fit in the memory available.",
    Code.ESSENTIAL_WORK: "The step's largest part is kernels it must run: their families' shares and, where op "
                         "shapes allow, their fraction of the device's roof.",
    Code.COPY_BOUND: "Host-device copies take a large share of the step's critical path: their bytes, bandwidth "
                     "against the link's peak, and host memory kind.",
    Code.UNEXPLAINED_PART: "A part of the step account that is not essential work takes a large share of the step "
                           "and no other finding explains it.",
    Code.GPU_LOW_UTILIZATION: "The GPU is idle for much of the step; sums up the gpu-idle-* findings below it.",
    Code.GPU_SATURATED: "The GPU never waits on the host: a faster step needs less GPU work (or hidden "
                        "communication).",
    Code.GPU_IDLE_INPUT: "The GPU idles while the host waits in DataLoader __next__.",
    Code.GPU_IDLE_SYNC: "The GPU idles after or during a blocking host synchronization (.item(), .cpu(), ...).",
    Code.GPU_IDLE_LAUNCH: "The GPU idles on kernel launch overhead: kernels shorter than the calls that launch them.",
    Code.GPU_IDLE_HOST: "The GPU idles while the host computes in Python or CPU ops with no launch in flight.",
    Code.GPU_IDLE_ALLOCATOR: "The GPU idles while the host is inside cudaMalloc/cudaFree in steady state.",
    Code.GPU_IDLE_COMM_WAIT: "The GPU idles while the host waits in a collective.",
    Code.GPU_IDLE_GRAPH_LAUNCH: "The GPU idles inside CUDA-graph launches.",
    Code.GPU_IDLE_DEPENDENCY: "The GPU idles with work queued: it waits on another stream, an event or a copy engine.",
    Code.GPU_IDLE_UNTRACED: "The GPU idles while the launching thread is in no traced activity.",
    Code.GPU_IDLE_SHORT: "The GPU idles in many gaps too short to explain one by one: kernels too short to keep it "
                         "fed.",
    Code.INPUT_BOUND: "Without a GPU or without steps: the training thread spends much of its time fetching "
                      "batches.",
    Code.PAGEABLE_MEMCPY: "Copies go through pageable host memory: staged through a bounce buffer, they cannot "
                          "overlap.",
    Code.SYNCHRONOUS_MEMCPY: "Synchronous copy calls (cudaMemcpy without Async) block the host.",
    Code.ALLOCATOR_IN_STEADY_STATE: "cudaMalloc/cudaFree calls in steady steps: the caching allocator keeps "
                                    "missing.",
    Code.SCALAR_READ_PER_STEP: "Device values read back on the host every step (.item() and the like).",
    Code.STEP_TIME_SPIKES: "Some steady steps run well over the median step, with or without a visible cause.",
    Code.TENSOR_CORES_UNUSED: "GEMM/convolution kernels that do not run on tensor cores take a material share of "
                              "kernel time.",
    Code.OPTIMIZER_SINGLE_TENSOR: "The optimizer updates one parameter at a time (no multi-tensor op in its step): "
                                  "foreach=True or fused=True, priced by the step's replay.",
    Code.ZERO_GRAD_NOT_NONE: "zero_grad zeroes every gradient instead of setting it to None (set_to_none=False), "
                             "priced by the step's replay.",
    Code.ACTIVATION_RECOMPUTE: "Backward runs forward ops again (activation checkpointing): their time on the "
                               "critical path, priced by the step's replay without them.",
    Code.TENSOR_GROWN_BY_CONCAT: "A tensor grown one piece at a time by torch.cat, each call copying everything "
                                 "grown so far: preallocate it, priced by the step's replay.",
    Code.PER_SAMPLE_LOOP: "A block loops over a batch in Python, the same ops once per item: vectorise it, "
                          "priced by the step's replay.",
    Code.AUTOGRAD_IN_INFERENCE: "A loop that never runs backward records autograd in its forward ops: "
                                "torch.inference_mode().",
    Code.REDUCE_EVERY_MICROBATCH: "Gradients accumulated over micro-batches are all-reduced after every backward "
                                  "pass, where the last one alone needs it (DDP's no_sync()), priced by the step's "
                                  "replay.",
    Code.CONV_BIAS_BEFORE_BATCH_NORM: "A convolution's bias feeds a batch norm, whose mean subtraction cancels it: "
                                      "bias=False.",
    Code.TENSOR_BUILT_ON_HOST: "A tensor is made on the host and copied to the device every step: create it there, "
                               "priced by the step's replay.",
    Code.GEMM_DIMS_UNALIGNED: "Half-precision GEMMs whose K or N is not a multiple of 8 (slower kernels), with "
                              "their kernel time per step.",
    Code.EXTRA_COPIES: "contiguous() copies before ops that read strided tensors, and dtype casts there and "
                       "back, on the step's path every step, priced by the step's replay without them.",
    Code.DATA_PARALLEL_NOT_DDP: "One process drives several GPUs through torch.nn.DataParallel.",
    Code.SLOW_COMM_BACKEND: "Collectives run on gloo although the job uses GPUs.",
    Code.MEMORY_NEAR_LIMIT: "Reserved GPU memory is near the device's capacity; the ledger at the allocation peak "
                            "says what fills it.",
    Code.MEMORY_PEAK: "What was live at a device's allocation peak (the ledger), and what lowers it: the "
                      "optimizer's state for a peak in the optimizer step, the largest part's remedy else; "
                      "none for a peak under 128 MiB.",
    Code.MEMORY_FRAGMENTATION: "Reserved memory far above allocated: cached free blocks and fragmentation hold "
                               "memory no tensor uses.",
    Code.MEMORY_GROWTH: "Allocated memory rises in every steady step: a leak, with the ops and lines that keep "
                        "bytes each step and the fix.",
    Code.MEMORY_RANK_IMBALANCE: "One rank's memory peak is well above the ranks' median, with the allocation sites "
                                "that differ between ranks.",
    Code.MEMORY_GREW: "Run B's memory peak, or the reserved memory above it, is above run A's beyond the noise, "
                      "with the allocation sites that grew most.",
    Code.ALLOCATOR_CHURN: "Reserved memory changes in steady steps: the caching allocator calls cudaMalloc/cudaFree "
                          "again and again.",
    Code.COLLECTIVE_SLOW_BUS: "Large collectives run far below their GPU-to-GPU link's bus bandwidth.",
    Code.COMM_EXPOSED: ("Communication runs with no compute under it; the statement says how much of the step's "
                        "critical path it holds and what hiding it saves."),
    Code.BLOCK_ATTRIBUTION: "GPU time per step by annotated block: which block gates the step.",
    Code.GRAPH_BREAKS: "torch.compile graph breaks in every step: eager Python and ops between compiled graphs, "
                       "and where each break is.",
    Code.RECOMPILE: "torch.compile recompiled a frame in steady state: the guard that failed and what each "
                    "recompile cost.",
    Code.COMPILE_COLD_START: "Time torch.compile spent compiling before the first step ran (reported though it "
                             "is warm-up).",
    Code.COMPILE_NO_EFFECT: "Dynamo compiled a frame and no compiled region of it ever ran: the function runs "
                            "eagerly (a frame skipped, e.g. after a graph break inside a loop).",
    Code.RECOMPILE_LIMIT: "A frame stopped running compiled after a compile that produced no graph (the "
                          "recompile limit): it runs eagerly from that step on.",
    Code.MANY_SMALL_REGIONS: "Many short compiled regions per step: the model is cut into small graphs (breaks or "
                             "recompiles).",
    Code.COMPILE_RANKS_DIFFER: "The TORCH_TRACE logs of several ranks show ranks that compile other graphs, break "
                               "elsewhere or recompile more than the others.",
    Code.RANK_STRAGGLER: "The rank the others wait for at matched collectives, and what it did meanwhile.",
    Code.RANK_IMBALANCE: "GPU compute per step differs across ranks: every collective waits for the slowest.",
    Code.RANK_COLLECTIVE_MISMATCH: "The ranks did not issue the same collectives: a hang or corruption risk.",
    Code.RANK_TRACE_INCOMPLETE: "A rank's trace is cut, which explains collectives missing from it.",
    Code.RANKS_NOT_ONE_JOB: "The files are not the ranks of one job (world size, backend, GPU model, process "
                            "groups or steps differ): nothing is compared across them.",
    Code.PIPELINE_SERIALIZED: "Pipeline stages run one after the other: the period is near the sum of the "
                              "stages, and the OverlapScore is under the gate.",
    Code.PIPELINE_OVERLAP_LOW: "Pipeline stages overlap, but less than the OverlapScore gate asks.",
    Code.PIPELINE_PERIOD_SPIKES: "Some steady chunks take over twice the median period.",
    Code.NSYS_ASYNC_MEMCPY_PAGEABLE: "nsys rule cuda_memcpy_async: asynchronous copies from pageable memory run "
                                     "synchronously.",
    Code.NSYS_SYNC_MEMCPY: "nsys rule cuda_memcpy_sync: synchronous memcpy operations block the host.",
    Code.NSYS_SYNC_MEMSET: "nsys rule cuda_memset_sync: synchronous memset operations block the host.",
    Code.NSYS_SYNC_API: "nsys rule cuda_api_sync: synchronization API calls block the host.",
    Code.NSYS_GPU_GAPS: "nsys rule gpu_gaps: GPU idle stretches longer than 500 ms.",
    Code.NSYS_GPU_LOW_UTILIZATION: "nsys rule gpu_time_util: stretches of the GPU's active span used under 50%.",
}


#: Findings about the job's structure rather than a share of its step: a setup a profile can see
#: but whose cost it cannot measure per step (a frame torch.compile left eager, a DataParallel
#: process, gloo among GPUs, memory growing or near the device's limit). They keep the severity
#: their rule judges without recoverable time; every other medium or high finding needs one
#: (``findings.consolidate``). A capture too small still caps them.
STRUCTURAL: Final = frozenset({Code.COMPILE_NO_EFFECT, Code.RECOMPILE_LIMIT, Code.DATA_PARALLEL_NOT_DDP,
                               Code.SLOW_COMM_BACKEND, Code.MEMORY_GROWTH, Code.MEMORY_NEAR_LIMIT,
                               Code.MEMORY_RANK_IMBALANCE, Code.MEMORY_GREW})
