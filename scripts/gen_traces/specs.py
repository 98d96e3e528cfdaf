"""What each generated trace is: file name, the function that makes it, the profiler
options, the schedule and the planted cause. The manifest and ``make_all`` both read this."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import accumulation_traces
import anti_pattern_traces
import compile_trace
import compile_traces
import copy_traces
import dataloader_traces
import ddp_traces
import dialect_traces
import eager_traces
import flops_traces
import generate_traces
import growth_traces
import inference_traces
import iteration_traces
import lines_traces
import loop_traces
import memory_compare_traces
import memory_step_traces
import memory_traces
import optimizer_traces
import provenance_traces
import spike_traces
import torch_trace_logs


@dataclass(frozen=True)
class TraceSpec:
    key: str
    files: tuple[str, ...]
    make: Callable[[Path], None]  # takes the output directory
    function: str  # "module.function", for the manifest
    options: str
    schedule: str
    planted: str
    timeout_s: float = 300.0
    env: dict[str, str] = field(default_factory=dict)


def _one(file_name: str, make_file: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda out_dir: make_file(out_dir / file_name)


def _sched(s: dict[str, int]) -> str:
    return f"schedule(wait={s['wait']}, warmup={s['warmup']}, active={s['active']}, repeat=1)"


_E = eager_traces
_D = dataloader_traces
_SHAPES = "record_shapes=True"

SPECS: tuple[TraceSpec, ...] = (
    TraceSpec(
        "eager_schedule", ("cpu_eager_schedule.pt.trace.json.gz",),
        _one("cpu_eager_schedule.pt.trace.json.gz", _E.make_eager_schedule),
        "eager_traces.make_eager_schedule", _SHAPES, _sched(_E.SCHEDULE),
        "nothing: the reference eager loop (SmallCNN, SGD, batch 16). Each step has "
        "record_function blocks forward, backward, optimizer.",
    ),
    TraceSpec(
        "eager_noschedule", ("cpu_eager_noschedule.pt.trace.json.gz",),
        _one("cpu_eager_noschedule.pt.trace.json.gz", _E.make_eager_noschedule),
        "eager_traces.make_eager_noschedule", _SHAPES,
        f"none, no prof.step(): {_E.NOSCHEDULE_ITERATIONS} iterations",
        "no ProfilerStep markers at all; each iteration is a record_function('train_step') "
        "block (holding forward, backward, optimizer), so steps must be found by that name.",
    ),
    TraceSpec(
        "compile", ("cpu_compile.pt.trace.json.gz",),
        _one("cpu_compile.pt.trace.json.gz", compile_trace.make_compile),
        "compile_trace.make_compile",
        f"{_SHAPES}; model wrapped in torch.compile(backend='{compile_trace.BACKEND}'), "
        "inductor caches disabled and a fresh cache dir, so every run compiles",
        _sched(compile_trace.SCHEDULE),
        "compilation inside the trace: ProfilerStep#0 holds Dynamo tracing, AOT autograd and "
        "inductor C++ codegen built by the machine's gcc (`compile_file` spans; forward and "
        "backward graphs); later steps run the compiled graphs (`Torch-Compiled Region: 0/0`, "
        "`CompiledFunction`, `## Call CompiledFxGraph ... ##`).",
        timeout_s=900.0,
        env={"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"},
    ),
    TraceSpec(
        "dataloader_slow", ("cpu_dataloader_slow.pt.trace.json.gz",),
        _one("cpu_dataloader_slow.pt.trace.json.gz", _D.make_dataloader_slow),
        "dataloader_traces.make_dataloader_slow", _SHAPES, _sched(_D.SCHEDULE),
        f"input-bound: DataLoader(num_workers=0) over a Dataset whose __getitem__ sleeps "
        f"{_D.SLOW_SLEEP_PER_ITEM_S * 1e3:g} ms per item, i.e. about "
        f"{_D.SLOW_SLEEP_PER_BATCH_S * 1e3:g} ms per batch inside each "
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__ span.",
    ),
    TraceSpec(
        "dataloader_fast", ("cpu_dataloader_fast.pt.trace.json.gz",),
        _one("cpu_dataloader_fast.pt.trace.json.gz", _D.make_dataloader_fast),
        "dataloader_traces.make_dataloader_fast", _SHAPES, _sched(_D.SCHEDULE),
        "nothing: the same loop as cpu_dataloader_slow without the sleep (the contrast).",
    ),
    TraceSpec(
        "dataloader_few_workers", ("cpu_dataloader_few_workers.pt.trace.json.gz",),
        _one("cpu_dataloader_few_workers.pt.trace.json.gz", _D.make_dataloader_few_workers),
        "dataloader_traces.make_dataloader_few_workers", _SHAPES, _sched(_D.SCHEDULE),
        f"workers on and still input-bound: the cpu_dataloader_slow Dataset (about "
        f"{_D.SLOW_SLEEP_PER_BATCH_S * 1e3:g} ms of per-batch work) behind "
        f"DataLoader(num_workers={_D.FEW_WORKERS}), so the main process still waits in each "
        "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__ span: too few workers "
        "for the per-batch work, not a loader without workers.",
    ),
    TraceSpec(
        "item_sync", ("cpu_item_sync.pt.trace.json.gz",),
        _one("cpu_item_sync.pt.trace.json.gz", _E.make_item_sync),
        "eager_traces.make_item_sync", _SHAPES, _sched(_E.ITEM_SYNC_SCHEDULE),
        "per-step host reads: loss.item(), an extra no_grad forward whose argmax goes through "
        ".cpu(), and accuracy .item(); aten::item / aten::_local_scalar_dense appear twice per "
        "step (cheap on CPU, a device sync on GPU); `.cpu()` of a CPU tensor adds only "
        "`aten::to`.",
    ),
    TraceSpec(
        "with_stack_memory", ("cpu_with_stack_memory.pt.trace.json.gz",),
        _one("cpu_with_stack_memory.pt.trace.json.gz", _E.make_with_stack_memory),
        "eager_traces.make_with_stack_memory",
        ", ".join(f"{k}=True" for k in _E.HEAVY_OPTIONS), _sched(_E.SCHEDULE),
        "heavy capture options: python_function frames, [memory] instant events, FLOPs and "
        "module hierarchy; step times are attribution, not throughput.",
    ),
    TraceSpec(
        "slow_step_base", ("cpu_slow_step_base.pt.trace.json.gz",),
        _one("cpu_slow_step_base.pt.trace.json.gz", _E.make_slow_step_base),
        "eager_traces.make_slow_step_base", _SHAPES, _sched(_E.SLOW_STEP_SCHEDULE),
        "nothing: side A of the A/B pair (no planted_slowdown block at all).",
    ),
    TraceSpec(
        "slow_step_planted", ("cpu_slow_step_planted.pt.trace.json.gz",),
        _one("cpu_slow_step_planted.pt.trace.json.gz", _E.make_slow_step_planted),
        "eager_traces.make_slow_step_planted", _SHAPES, _sched(_E.SLOW_STEP_SCHEDULE),
        f"side B of the A/B pair: identical loop plus time.sleep({_E.PLANTED_SLEEP_S}) inside "
        "record_function('planted_slowdown') at the start of every step (before forward).",
    ),
    TraceSpec(
        "ddp_gloo", tuple(ddp_traces.rank_file(Path(), r).name for r in range(2)),
        ddp_traces.make_ddp, "ddp_traces.make_ddp",
        f"{_SHAPES}; 2 processes (torch.multiprocessing spawn), DistributedDataParallel, "
        "gloo on 127.0.0.1 (GLOO_SOCKET_IFNAME=lo), one trace per rank",
        _sched(ddp_traces.SCHEDULE),
        f"straggler: rank {ddp_traces.STRAGGLER_RANK} sleeps {ddp_traces.STRAGGLER_SLEEP_S} s "
        "between forward and backward every step (unannotated: a gap between the `forward` "
        "and `backward` blocks), so rank 0 waits in the gradient allreduce: its `backward` "
        "block and the `gloo:all_reduce` spans (user_annotation, on gloo's worker threads) "
        "last about 20 ms longer. The main thread shows one `c10d::allreduce_` per step (one "
        "bucket); there are no `record_param_comms` events with gloo on CPU. Both files carry "
        "a top-level `distributedInfo` (backend, rank, world_size, pg_config).",
    ),
    TraceSpec(
        "ddp_gloo_bcast", tuple(ddp_traces.broadcast_rank_file(Path(), r).name for r in range(2)),
        ddp_traces.make_ddp_broadcast, "ddp_traces.make_ddp_broadcast",
        "with_stack=True (no record_shapes, to keep the files small); as ddp_gloo, with DistributedDataParallel("
        f"bucket_cap_mb={ddp_traces.BUCKET_CAP_MB})",
        _sched(ddp_traces.BROADCAST_SCHEDULE),
        f"straggler by waiting, not by count: rank {ddp_traces.STRAGGLER_RANK} sleeps "
        f"{ddp_traces.STRAGGLER_SLEEP_S} s inside record_function('{ddp_traces.STRAGGLER_ANNOTATION}') "
        "between forward and backward every step, so rank 0 waits about 20 ms in the gradient "
        "bucket all-reduces; every step also begins with "
        f"{ddp_traces.BROADCASTS_PER_STEP} broadcasts of {ddp_traces.BROADCAST_ELEMENTS} floats from "
        "rank 0, which rank 0 reaches a little after rank 1 (it computes each value first: a "
        "matmul of 256x256, about 0.4 ms), so rank 0 arrives last at more collectives while "
        "rank 1 causes most of the waiting (about four fifths in the kept run: rank 0's "
        "preparing, and the machine's noise, cost rank 1 a few ms a step).",
    ),
    TraceSpec(
        "python_export_memory", (dialect_traces.PYTHON_EXPORT_MEMORY,),
        _one(dialect_traces.PYTHON_EXPORT_MEMORY, dialect_traces.make_python_export_memory),
        "dialect_traces.make_python_export_memory", dialect_traces.OPTIONS,
        _sched(dialect_traces.SCHEDULE), dialect_traces.PLANTED,
    ),
    TraceSpec(
        "adam_memory", memory_traces.FILES[:1], memory_traces.make_memory_traces,
        "memory_traces.make_memory_traces", memory_traces.OPTIONS, _sched(memory_traces.SCHEDULE),
        memory_traces.PLANTED,
    ),
    *(TraceSpec(key, (name,), _one(name, make), f"memory_step_traces.{make.__name__}", options, _sched(sched),
                planted)
      for key, name, make, options, sched, planted in (
          ("memory_growth", memory_step_traces.GROWTH_FILE, memory_step_traces.make_growth,
           memory_step_traces.OPTIONS, memory_step_traces.GROWTH_SCHEDULE, memory_step_traces.PLANTED_GROWTH),
          ("optimizer_peak_memory", memory_step_traces.OPTIMIZER_PEAK_FILE, memory_step_traces.make_optimizer_peak,
           "profile_memory=True, record_shapes=True", memory_step_traces.OPTIMIZER_SCHEDULE,
           memory_step_traces.PLANTED_OPTIMIZER),
          ("fsdp2_memory", memory_step_traces.FSDP_FILE, memory_step_traces.make_fsdp,
           "profile_memory=True (rank 0 of 2, gloo on 127.0.0.1)", memory_step_traces.FSDP_SCHEDULE,
           memory_step_traces.PLANTED_FSDP),
      )),
    TraceSpec(
        "memory_ranks", memory_compare_traces.RANK_FILES, memory_compare_traces.make_ranks,
        "memory_compare_traces.make_ranks", memory_compare_traces.RANKS_OPTIONS,
        _sched(memory_compare_traces.SCHEDULE), memory_compare_traces.PLANTED_RANKS,
    ),
    TraceSpec(
        "memory_vs", (memory_compare_traces.VS_A, memory_compare_traces.VS_A_RERUN, memory_compare_traces.VS_B),
        memory_compare_traces.make_vs, "memory_compare_traces.make_vs", memory_compare_traces.VS_OPTIONS,
        _sched(memory_compare_traces.SCHEDULE), memory_compare_traces.PLANTED_VS,
    ),
    TraceSpec(
        "adam_item", ("cpu_adam_item.pt.trace.json.gz",),
        _one("cpu_adam_item.pt.trace.json.gz", optimizer_traces.make_adam_item),
        "optimizer_traces.make_adam_item", "record_shapes=True, with_stack=True",
        _sched(optimizer_traces.SCHEDULE),
        "scalar reads from two sources: torch.optim.Adam(foreach=False) reads each of the six "
        "parameters' step counters with .item() inside Optimizer.step#Adam.step every step (the "
        "single-tensor path), and the loop reads the loss once per step in log_loss() under "
        "record_function('log_loss'): 7 aten::item per step, 6 of them the optimizer's.",
    ),
    TraceSpec(
        "autograd_api_loader", (iteration_traces.AUTOGRAD_API_FILE,),
        _one(iteration_traces.AUTOGRAD_API_FILE, iteration_traces.make_autograd_api_loader),
        "iteration_traces.make_autograd_api_loader",
        "the autograd profiler API instead: torch.autograd.profiler.profile(record_shapes=True)",
        f"none, no prof.step(): {iteration_traces.AUTOGRAD_API_BATCHES} iterations",
        iteration_traces.AUTOGRAD_API_PLANTED,
    ),
    TraceSpec(
        "faster_first_step", (iteration_traces.FASTER_FIRST_FILE,),
        _one(iteration_traces.FASTER_FIRST_FILE, iteration_traces.make_faster_first_step),
        "iteration_traces.make_faster_first_step", _SHAPES, _sched(iteration_traces.FASTER_FIRST_SCHEDULE),
        iteration_traces.FASTER_FIRST_PLANTED,
    ),
    *(TraceSpec(c.key, (c.trace_name(),), functools.partial(compile_traces.make, c), "compile_traces.make",
                c.options(), _sched(c.sched), c.manifest_planted(), timeout_s=900.0)
      for c in compile_traces.CASES if compile_traces.available(c)),
    *(TraceSpec(key, (name,), _one(name, make), f"lines_traces.{make.__name__}", lines_traces.OPTIONS,
                _sched(lines_traces.SCHEDULE), planted)
      for key, name, make, planted in (
          ("lines_sleep", lines_traces.SLEEP_FILE, lines_traces.make_sleep, lines_traces.PLANTED_SLEEP),
          ("lines_item", lines_traces.ITEM_FILE, lines_traces.make_item, lines_traces.PLANTED_ITEM),
          ("lines_loop", lines_traces.LOOP_FILE, lines_traces.make_loop, lines_traces.PLANTED_LOOP),
      )),
    *(TraceSpec(key, (name,), _one(name, make), f"anti_pattern_traces.{make.__name__}", anti_pattern_traces.OPTIONS,
                _sched(anti_pattern_traces.SCHEDULE), planted)
      for key, name, make, planted in (
          ("anti_present", anti_pattern_traces.PRESENT_FILE, anti_pattern_traces.make_present,
           anti_pattern_traces.PLANTED_PRESENT),
          ("anti_absent", anti_pattern_traces.ABSENT_FILE, anti_pattern_traces.make_absent,
           anti_pattern_traces.PLANTED_ABSENT),
      )),
    TraceSpec("generate_kv_cache", (generate_traces.GENERATE_FILE,),
              _one(generate_traces.GENERATE_FILE, generate_traces.make_generate), "generate_traces.make_generate",
              _SHAPES, _sched(generate_traces.GENERATE_SCHEDULE), generate_traces.GENERATE_PLANTED),

    TraceSpec("flops_attention", (flops_traces.FILE,), _one(flops_traces.FILE, flops_traces.make_flops_attention),
              "flops_traces.make_flops_attention", "record_shapes=True, with_flops=True",
              _sched(flops_traces.SCHEDULE), flops_traces.PLANTED),
    *(TraceSpec(key, (name,), _one(name, make), f"copy_traces.{make.__name__}", copy_traces.OPTIONS,
                _sched(copy_traces.SCHEDULE), planted)
      for key, name, make, planted in (
          ("copies_present", copy_traces.PRESENT_FILE, copy_traces.make_present, copy_traces.PLANTED_PRESENT),
          ("copies_absent", copy_traces.ABSENT_FILE, copy_traces.make_absent, copy_traces.PLANTED_ABSENT),
      )),
    *(TraceSpec(key, (name,), _one(name, make), f"growth_traces.{make.__name__}", options,
                _sched(growth_traces.SCHEDULE), planted)
      for key, name, make, options, planted in (
          ("growth_kv_cache", growth_traces.KV_FILE, growth_traces.make_kv_cache, growth_traces.OPTIONS_SHAPES,
           growth_traces.PLANTED_KV),
          ("growth_static_cache", growth_traces.STATIC_FILE, growth_traces.make_static_cache,
           growth_traces.OPTIONS_SHAPES, growth_traces.PLANTED_STATIC),
          ("growth_collect", growth_traces.COLLECT_FILE, growth_traces.make_collect, growth_traces.OPTIONS_DEFAULT,
           growth_traces.PLANTED_COLLECT),
      )),
    TraceSpec("loop_augment", (loop_traces.FILE,), _one(loop_traces.FILE, loop_traces.make), "loop_traces.make",
              loop_traces.OPTIONS, _sched(loop_traces.SCHEDULE), loop_traces.PLANTED),
    TraceSpec("spikes_eval", (spike_traces.EVAL_FILE,), _one(spike_traces.EVAL_FILE, spike_traces.make_eval),
              "spike_traces.make_eval", spike_traces.OPTIONS, _sched(spike_traces.SCHEDULE), spike_traces.PLANTED_EVAL),
    TraceSpec("spikes_save", (spike_traces.SAVE_FILE,), _one(spike_traces.SAVE_FILE, spike_traces.make_save),
              "spike_traces.make_save", spike_traces.OPTIONS, _sched(spike_traces.SCHEDULE), spike_traces.PLANTED_SAVE),
    TraceSpec("fsdp2_accumulate_sync", (accumulation_traces.SYNC_FILE,),
              _one(accumulation_traces.SYNC_FILE, accumulation_traces.make_sync), "accumulation_traces.make_sync",
              accumulation_traces.OPTIONS, _sched(accumulation_traces.SCHEDULE), accumulation_traces.PLANTED_SYNC),
    TraceSpec("fsdp2_accumulate_fixed", (accumulation_traces.FIXED_FILE,),
              _one(accumulation_traces.FIXED_FILE, accumulation_traces.make_fixed), "accumulation_traces.make_fixed",
              accumulation_traces.OPTIONS, _sched(accumulation_traces.SCHEDULE), accumulation_traces.PLANTED_FIXED),
    TraceSpec("inference_recorded", (inference_traces.RECORDED_FILE,),
              _one(inference_traces.RECORDED_FILE, inference_traces.make_recorded), "inference_traces.make_recorded",
              inference_traces.OPTIONS, _sched(inference_traces.SCHEDULE), inference_traces.PLANTED_RECORDED),
    TraceSpec("inference_mode", (inference_traces.INFERENCE_MODE_FILE,),
              _one(inference_traces.INFERENCE_MODE_FILE, inference_traces.make_inference_mode),
              "inference_traces.make_inference_mode", inference_traces.OPTIONS, _sched(inference_traces.SCHEDULE),
              inference_traces.PLANTED_INFERENCE_MODE),
    TraceSpec("lines_started", (lines_traces.STARTED_FILE,), _one(lines_traces.STARTED_FILE, lines_traces.make_started),
              "lines_traces.make_started", lines_traces.OPTIONS, _sched(lines_traces.STARTED_SCHEDULE),
              lines_traces.PLANTED_STARTED),
    TraceSpec("provenance", (provenance_traces.TRACE_FILE,), provenance_traces.make, "provenance_traces.make",
              provenance_traces.OPTIONS, _sched(provenance_traces.SCHEDULE), provenance_traces.PLANTED,
              timeout_s=900.0),
    *(TraceSpec(c.key, c.traces, functools.partial(torch_trace_logs.make, c), "torch_trace_logs.make",
                "defaults (no record_shapes, no stacks); TORCH_TRACE and TORCH_LOGS set, inductor caches on in a "
                "fresh cache dir", _sched(c.schedule), c.planted, timeout_s=900.0)
      for c in torch_trace_logs.CASES),
)

DEMO = TraceSpec(
    "demo", ("demo_cpu_training.pt.trace.json.gz",),
    _one("demo_cpu_training.pt.trace.json.gz", _D.make_demo),
    "dataloader_traces.make_demo", _SHAPES, _sched(_D.DEMO_SCHEDULE),
    f"mildly input-bound: __getitem__ sleeps {_D.DEMO_SLEEP_PER_ITEM_S * 1e3:g} ms per item "
    f"(about {_D.DEMO_SLEEP_PER_BATCH_S * 1e3:g} ms per batch of 16).",
)

BY_KEY = {spec.key: spec for spec in (*SPECS, DEMO)}
