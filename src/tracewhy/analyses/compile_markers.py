"""The names ``torch.compile`` writes into a Kineto trace, in one place, each with the PyTorch
source that writes it (paths in the pytorch repository, as of torch 2.13; the same names since
torch 2.1 unless noted). The compile analysis decides from structure first (nesting, steps,
threads) and uses these names only to find the slices it reasons about.
"""

from __future__ import annotations

import re
from typing import Final

#: ``torch/_dynamo/convert_frame.py``: ``annotation_str = "Torch-Compiled Region: " +
#: compile_id_str``, a record_function around every run of a compiled frame's guarded code.
#: The id is ``F/C`` (frame id F, compile id C of that frame: C > 0 is a recompile), or
#: ``!A/F/C`` under compiled autograd, or ``Unknown`` (``CompileId.__str__``, torch/_guards.py).
REGION: Final = re.compile(r"^Torch-Compiled Region: (?:!\d+/)?(\d+)/(\d+)")
REGION_PREFIX: Final = "Torch-Compiled Region"

#: ``torch/csrc/dynamo/eval_frame_cpp.cpp``: ``cache_lookup_profiler_str = "TorchDynamo Cache
#: Lookup"``, the guard evaluation before each compiled frame runs.
CACHE_LOOKUP: Final = "TorchDynamo Cache Lookup"

#: ``torch/_functorch/_aot_autograd/runtime_wrappers.py``: the autograd.Function classes
#: ``CompiledFunction`` / ``CompiledFunctionBackward`` (their names are the op names) and the
#: ``"AOTDispatcher Runtime Wrapper Prologue"`` record_function.
COMPILED_FUNCTION: Final = "CompiledFunction"
COMPILED_FUNCTION_BACKWARD: Final = "CompiledFunctionBackward"
AOT_PROLOGUE: Final = "AOTDispatcher Runtime Wrapper Prologue"

#: ``torch/_dynamo/utils.py`` (``record_pregraph_bytecode_enter``): the bytecode Dynamo runs
#: before the graph (input unpacking), torch 2.7+.
PREGRAPH: Final = "Pregraph bytecode"

#: ``torch/_inductor/output_code.py``: ``f"## Call CompiledFxGraph {self._fx_graph_cache_key}
#: ##"``, one per call of an inductor graph (forward or backward); the key is ``None`` when
#: the FX graph cache is off.
GRAPH_CALL: Final = re.compile(r"^## Call CompiledFxGraph (\S+) ##")
GRAPH_CALL_PREFIX: Final = "## Call CompiledFxGraph "

#: Markers that wrap compiled code being run (not compiled): eager aten ops under none of them
#: but inside a region are the graph break's eager code.
RUNTIME_WRAPPERS: Final = (CACHE_LOOKUP, COMPILED_FUNCTION, COMPILED_FUNCTION_BACKWARD, AOT_PROLOGUE,
                           PREGRAPH)

#: ``torch/_dynamo/utils.py``: ``dynamo_timed`` wraps each compile phase in
#: ``compile_time_record_function(f"{key} (dynamo_timed)")`` (torch 2.1+) ...
DYNAMO_TIMED_SUFFIX: Final = " (dynamo_timed)"
#: ... and ``CompileEventLogger.add_record_function_data`` writes an empty record_function
#: ``f"{event_name}_data: {metadata}"`` under the phase's outer ``event_name`` span (torch 2.6+),
#: with ``compile_id=F/C`` in the metadata: it names which compile the work belongs to.
COMPILE_DATA: Final = re.compile(r"^(.+)_data: .*\bcompile_id=(?:!\d+/)?(\d+)/(\d+)")

#: ``torch/_dynamo/resume_execution.py``: ``TORCH_DYNAMO_RESUME_IN_PREFIX =
#: "torch_dynamo_resume_in"``; the resume function after a break is named
#: ``torch_dynamo_resume_in_<fn>_at_<line>`` (line: where the frame broke). Seen as a Python
#: frame (``with_stack``): ``file.py(<first line>): torch_dynamo_resume_in_forward_at_65``.
RESUME: Final = re.compile(r"^(?:(.+?)\(\d+\): )?torch_dynamo_resume_in_(\w+?)_at_(\d+)")
RESUME_PREFIX: Final = "torch_dynamo_resume_in_"

#: CUDA graph replay (``mode="reduce-overhead"``, ``torch/_inductor/cudagraph_trees.py``
#: replays with ``torch.cuda.CUDAGraph.replay``): the runtime call the host thread makes.
GRAPH_LAUNCH: Final = ("cudaGraphLaunch", "hipGraphLaunch")

#: Inductor kernels. GPU: Triton kernels named by ``torch/_inductor/codegen/triton.py``
#: (``triton_poi_``, ``triton_red_``, ``triton_per_``, ``triton_tem_`` ...). CPU: the C++
#: kernels are loaded as a pybind module whose entry point is ``kernel``
#: (``torch/_inductor/codecache.py``, ``CppPythonBindingsCodeCache``), so with ``with_stack``
#: each call is a Python frame named ``<built-in function kernel>``.
TRITON_KERNEL: Final = re.compile(r"^triton_")
CPU_KERNEL_FRAME: Final = "<built-in function kernel>"


def compile_data(name: str) -> re.Match[str] | None:
    """``COMPILE_DATA``'s match of ``name``; a name without ``compile_id=`` is none, answered
    without the pattern (whose leading ``.+`` tries every split of the name: an nsys export's
    16 k distinct range names took 5 ms a pass)."""
    return COMPILE_DATA.match(name) if "compile_id=" in name else None


def resume(name: str) -> re.Match[str] | None:
    """``RESUME``'s match of ``name``; a name without the resume prefix is none (the same quick
    pre-test as ``compile_data``'s)."""
    return RESUME.match(name) if RESUME_PREFIX in name else None


def is_compile_phase(name: str, data_owners: frozenset[str]) -> bool:
    """A slice that is compile work: a ``(dynamo_timed)`` phase, the outer span that a
    ``*_data: compile_id=`` annotation belongs to, or the annotation itself."""
    return name.endswith(DYNAMO_TIMED_SUFFIX) or name in data_owners or compile_data(name) is not None
