"""Which host calls and annotations mean what: the one place for runtime-API and op name rules.

CUDA and HIP spell the same calls differently; nsys appends ``_vNNNN`` (the reader strips it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Final

import numpy as np
import polars as pl

# Calls that block the host until device work completes.
_SYNC = re.compile(
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|CtxSynchronize)$"
    r"|^cu(CtxSynchronize|StreamSynchronize|EventSynchronize)$"
    # Synchronous copies/memsets block the host as well (the non-Async variants).
    r"|^(cuda|hip)(Memcpy|Memcpy2D|Memcpy3D|MemcpyDtoH|MemcpyHtoD|MemcpyWithStream|Memset)$"
    r"|^cuMemcpy(DtoH|HtoD|DtoD)?(_v2)?$"
)
_ALLOC = re.compile(r"^(cuda|hip)(Malloc|Free|MallocAsync|FreeAsync|MallocHost|FreeHost|HostAlloc)$|^cuMem(Alloc|Free)")
_LAUNCH = re.compile(
    r"^(cuda|hip)(LaunchKernel|LaunchKernelExC|LaunchCooperativeKernel|ExtLaunchKernel|ModuleLaunchKernel"
    r"|MemcpyAsync|MemsetAsync|Memcpy2DAsync|MemcpyWithStream|ExtModuleLaunchKernel)$"
    r"|^cu(LaunchKernel|LaunchKernelEx|LaunchCooperativeKernel|Memcpy\w*Async\w*|Memset\w*Async\w*)$"
    r"|^hipExtLaunch"
)
_GRAPH = re.compile(r"^(cuda|hip)GraphLaunch$|^cuGraphLaunch$")
#: How every name ``_SYNC``, ``_ALLOC``, ``_LAUNCH`` and ``_GRAPH`` match begins (a quick pre-test).
_RUNTIME_PREFIXES: Final = ("cu", "hip")
_DATALOADER = re.compile(r"^enumerate\(DataLoader\)#.*__next__$|DataLoader.*__next__")
_COMM = re.compile(r"^(nccl|gloo|mpi|ucc|rccl):|^c10d::|^record_param_comms$|ProcessGroup|^nccl[A-Z]")
#: How every name ``_COMM`` finds begins, unless it holds "ProcessGroup" (a quick pre-test).
_COMM_PREFIXES: Final = ("nccl", "gloo", "mpi", "ucc", "rccl", "c10d::", "record_param_comms")
_OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)")
#: torch/optim/optimizer.py's profile hook: ``record_function(f"Optimizer.step#{cls}.step")``.
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
#: The autograd engine's per-node op (PyTorch's autograd/engine.cpp names it
#: "autograd::engine::evaluate_function: <Node>"): a thread that runs it is a backward thread.
_AUTOGRAD_NODE: Final = "autograd::engine::evaluate_function"
# aten ops that copy a device value to the host and therefore wait for the device.
_SCALAR_READ_START: Final = r"^aten::(item|_local_scalar_dense|nonzero|is_nonzero|equal|allclose|tolist)"
_SCALAR_READ = re.compile(_SCALAR_READ_START + "$")


@lru_cache(maxsize=8192)
def is_sync_call(name: str) -> bool:
    return name.startswith(_RUNTIME_PREFIXES) and _SYNC.match(name) is not None


@lru_cache(maxsize=8192)
def is_alloc_call(name: str) -> bool:
    return name.startswith(_RUNTIME_PREFIXES) and _ALLOC.match(name) is not None


@lru_cache(maxsize=8192)
def is_launch_call(name: str) -> bool:
    return name.startswith(_RUNTIME_PREFIXES) and (_LAUNCH.match(name) is not None or _GRAPH.match(name) is not None)


@lru_cache(maxsize=8192)
def is_graph_launch(name: str) -> bool:
    return name.startswith(_RUNTIME_PREFIXES) and _GRAPH.match(name) is not None


@lru_cache(maxsize=8192)
def is_dataloader(name: str) -> bool:
    # (Every name the pattern finds contains "DataLoader": the substring test answers most names
    # at a twentieth of the regex's cost; an nsys emit_nvtx export has 16 k distinct names.)
    return "DataLoader" in name and _DATALOADER.search(name) is not None


@lru_cache(maxsize=8192)
def is_comm(name: str) -> bool:
    return (name.startswith(_COMM_PREFIXES) or "ProcessGroup" in name) and _COMM.search(name) is not None


@lru_cache(maxsize=8192)
def is_optimizer(name: str) -> bool:
    return _OPTIMIZER.match(name) is not None


@lru_cache(maxsize=8192)
def is_optimizer_step(name: str) -> bool:
    return _OPTIMIZER_STEP.match(name) is not None


@lru_cache(maxsize=8192)
def is_scalar_read(name: str) -> bool:
    return _SCALAR_READ.match(name) is not None


@lru_cache(maxsize=8192)
def is_autograd_node(name: str) -> bool:
    return name.startswith(_AUTOGRAD_NODE)


#: torch.autograd.profiler.emit_nvtx names each op's NVTX range "<op>, seq = N, op_id = M" (seq
#: present for ops autograd records; op_id always): one name per call. Every command groups such
#: ranges by the op's name, which this suffix removed gives (``op_range_name``).
OP_RANGE_SUFFIX = r"(?:,\s*(?:seq|op_id)\s*=\s*\d+)+$"
_OP_RANGE_SUFFIX = re.compile(OP_RANGE_SUFFIX)


def op_range_name(name: str) -> str:
    """The op's name of an emit_nvtx range ("aten::to, op_id = 999599" -> "aten::to"); other names as they are."""
    return _OP_RANGE_SUFFIX.sub("", name) if "=" in name else name


def op_range_names(texts: list[str]) -> list[str]:
    """``op_range_name`` of each text: over the column at once where polars' regex dialect reads
    the suffix pattern as Python's does (ASCII, without a line feed, before which Python's ``$``
    also matches, or the separators 0x1c-0x1f, which Python's ``\\s`` counts as white space), one
    by one for the rest, and for all of a few names. (An emit_nvtx export has 16 k distinct names,
    nearly all of them op ranges: 12 ms one by one, 4 ms at once.) The suffix ends the name, so
    there is one match at most."""
    if len(texts) < _AT_ONCE_MIN_NAMES:
        return [op_range_name(text) for text in texts]
    column = pl.Series(texts, dtype=pl.String)
    plain = (column.str.len_bytes() == column.str.len_chars()) & ~column.str.contains(_NOT_PLAIN)
    out: list[str] = column.str.replace(OP_RANGE_SUFFIX, "").to_list()
    for i in np.flatnonzero(~plain.to_numpy()).tolist():
        out[i] = op_range_name(texts[i])
    return out


#: From this many names the column pays (0.2 ms however few; one by one 0.6 µs a name).
_AT_ONCE_MIN_NAMES: Final = 1_000
#: Characters the two regex dialects read apart in ``OP_RANGE_SUFFIX`` (see ``op_range_names``).
_NOT_PLAIN: Final = r"[\n\x1c-\x1f]"


class Phase:
    """The training-loop phases a step account names host work by."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


#: Blocks users and libraries open around a phase (record_function or NVTX): HTA's and torchrec's
#: "## forward ##", "## forward:over_arch ##", "## backward ##", "## optimizer ##", "## zero_grad ##";
#: DDP's "DistributedDataParallel.forward" (torch/nn/parallel/distributed.py); PARAM's
#: "[param|<model>|...|measure|forward]"; plain "forward", "backward", "optimizer" blocks. A phase
#: word counts standing alone (not inside a longer word); an emit_nvtx op range ("FSDP::
#: pre_forward (...), op_id = 3") is one op's call, never a phase.
_PHASE_WORDS: Final = (
    (Phase.BACKWARD, re.compile(r"(?<![a-z])backward(?![a-z])", re.IGNORECASE)),
    (Phase.FORWARD, re.compile(r"(?<![a-z])forward(?![a-z])", re.IGNORECASE)),
    (Phase.OPTIMIZER, re.compile(r"(?<![a-z])(optimizer|zero_grad)(?![a-z])", re.IGNORECASE)),
)


#: The words an ASCII name opening a phase holds in lower case (the patterns' literal pre-test).
_PHASE_LITERALS: Final = ("forward", "backward", "optimizer", "zero_grad")


@lru_cache(maxsize=8192)
def annotation_phase(name: str) -> str | None:
    """The phase (a ``Phase`` value) an annotation's name opens, None for any other block."""
    # (An ASCII name without any of _PHASE_LITERALS in lower case opens none: most of an
    # emit_nvtx export's 16 k distinct names are answered so, without three searches each. Other
    # names take the patterns, whose IGNORECASE also folds a few non-ASCII letters.)
    low = name.lower()
    if name.isascii() and not ("forward" in low or "backward" in low or "optimizer" in low or "zero_grad" in low):
        return None
    if _OP_RANGE_SUFFIX.search(name):
        return None
    return next((phase for phase, word in _PHASE_WORDS if word.search(name)), None)


Pretest = Callable[[pl.Series], pl.Series]


def _as_one_query(names: pl.Series, test: Callable[[pl.Expr], pl.Expr]) -> pl.Series:
    """``test`` of a column of names as one query (each string method of a Series is a query of
    its own, ~0.1-0.3 ms however few the names: a pre-test of eight of them was eight queries)."""
    return names.to_frame("_n").select(test(pl.col("_n"))).to_series()


def _literal(prefixes: tuple[str, ...] = (), holding: str | None = None) -> Pretest:
    """Whether each name of a column begins with one of ``prefixes`` or holds ``holding`` (one of
    them given: the test is then a column, not the literal it starts from)."""
    if not prefixes and holding is None:
        raise ValueError("a literal pre-test needs a prefix or a text to hold")

    def test(n: pl.Expr) -> pl.Expr:
        hit = n.str.contains(holding, literal=True) if holding is not None else pl.lit(False)
        for prefix in prefixes:
            hit = hit | n.str.starts_with(prefix)
        return hit

    def pretest(names: pl.Series) -> pl.Series:
        return _as_one_query(names, test)
    return pretest


def holding_any(literals: tuple[str, ...]) -> Pretest:
    """Whether each name of a column holds one of ``literals`` (a pre-test for a pattern every
    match of which holds one of them)."""
    def pretest(names: pl.Series) -> pl.Series:
        return names.str.contains_any(list(literals))
    return pretest


def _beginning(pattern: str) -> Pretest:
    """Whether each name of a column matches ``pattern``, a literal alternation anchored at the
    start (the same in polars' regex dialect as in Python's)."""
    def pretest(names: pl.Series) -> pl.Series:
        return names.str.contains(pattern)
    return pretest


def _may_open_phase(names: pl.Series) -> pl.Series:
    """``annotation_phase``'s own pre-test over a column: not ASCII, or a phase word in lower case."""
    def test(n: pl.Expr) -> pl.Expr:
        low = n.str.to_lowercase()
        hit = n.str.len_bytes() != n.str.len_chars()
        for word in _PHASE_LITERALS:
            hit = hit | low.str.contains(word, literal=True)
        return hit
    return _as_one_query(names, test)


#: For a test above, a literal pre-test of a whole column of names (polars, at once) that every
#: name the test answers (True, or a phase) passes: a column's distinct names then need the test
#: itself only where its pre-test passes (``name_codes.decide``). Most of an emit_nvtx export's
#: 16 k distinct range names pass none (each test alone took 3-10 ms over them, the pre-test 0.1-2).
PRETESTS: Final[dict[Callable[[str], object], Pretest]] = {
    is_sync_call: _literal(_RUNTIME_PREFIXES),
    is_alloc_call: _literal(_RUNTIME_PREFIXES),
    is_launch_call: _literal(_RUNTIME_PREFIXES),
    is_graph_launch: _literal(_RUNTIME_PREFIXES),
    is_dataloader: _literal(holding="DataLoader"),
    is_comm: _literal(_COMM_PREFIXES, holding="ProcessGroup"),
    is_optimizer: _literal(("Optimizer.",)),
    is_autograd_node: _literal((_AUTOGRAD_NODE,)),
    # (Not "aten::" alone: nearly every name of an emit_nvtx export begins so.)
    is_scalar_read: _beginning(_SCALAR_READ_START),
    annotation_phase: _may_open_phase,
}


#: The name torch gives a backward node's function: the op's name, "Backward" and an index
#: ("AddmmBackward0"; torch's tools/autograd/gen_autograd_functions.py, ``{op}Backward{i}``).
BACKWARD_NODE: Final = r"Backward\d*$"
_BACKWARD_NODE = re.compile(BACKWARD_NODE)


def is_backward_node(name: str) -> bool:
    """Whether a slice is an autograd node of backward by its name (``BACKWARD_NODE``)."""
    return _BACKWARD_NODE.search(name) is not None


#: The data-parallel wrapper a forward runs in, by a block it opens (each from its source, torch
#: 2.x): DDP's record_function("DistributedDataParallel.forward") (torch/nn/parallel/
#: distributed.py); FSDP2's "FSDP::root_pre_forward" (torch/distributed/fsdp/_fully_shard/
#: _fsdp_state.py); FSDP1's "FullyShardedDataParallel._pre_forward" (torch/distributed/fsdp/
#: _runtime_utils.py).
DATA_PARALLEL_WRAPPERS: Final = (("DistributedDataParallel.forward", "DDP"), ("FSDP::root_pre_forward", "FSDP2"),
                                 ("FullyShardedDataParallel._pre_forward", "FSDP"))

#: The DDP reducer's own recorded work (torch/csrc/distributed/c10d/reducer.cpp's RECORD_FUNCTION
#: names, torch 2.x): copying a reduced bucket back into the gradients, dividing it by the world
#: size, the unused-parameter search. It runs only in a backward that synchronizes gradients.
DDP_REDUCER_PREFIXES: Final = ("torch.distributed.ddp.reducer::", "torch::distributed::reducer::")


def is_ddp_reducer(name: str) -> bool:
    """Whether an op is the DDP reducer's own work (``DDP_REDUCER_PREFIXES``)."""
    return name.startswith(DDP_REDUCER_PREFIXES)


def is_reduction(collective: str) -> bool:
    """Whether a collective (its name as the communication analysis gives it: all_reduce,
    reduce_scatter, all_gather, ...) sums across ranks, as a gradient's reduction does; gathers,
    broadcasts and all-to-alls move data without it."""
    return "reduce" in collective.lower()
