"""Kernel families: the one place where the rules that classify a kernel live.

Communication is recognised by structure first (``classify_kernels``): a kernel launched under
an op whose recorded args describe a collective, or under a collective op, or running on a
stream that carries nothing but communication, is communication whatever its name. Then by the
library its symbol belongs to (NCCL, RCCL, NVSHMEM, DeepEP, symmetric memory, custom
all-reduce), then by name keywords. Every other
family is by name: rules tried in order, first match wins, names matched lower-cased.
Communication comes first so that e.g. ``ncclDevKernel_ReduceScatter`` is not a reduction.
"""

from __future__ import annotations

import re
from enum import Enum
from functools import lru_cache
from typing import Final

import numpy as np
import polars as pl

from tracewhy.model.linking import first_flagged
from tracewhy.model.schema import Col, Kind, OpAttrCol
from tracewhy.model.trace import Trace


class Family(str, Enum):
    COMMUNICATION = "communication"
    COPY = "copy/memset"
    ATTENTION = "attention"
    GEMM = "gemm"
    CONVOLUTION = "convolution"
    NORMALIZATION = "normalization"
    REDUCTION = "reduction"
    ELEMENTWISE = "elementwise"
    OTHER = "other"


class Rule(str, Enum):
    """Which rule put a kernel in its family, most trusted first."""

    COLLECTIVE_ARGS = "collective args"  # launched under an op whose args describe a collective
    COLLECTIVE_OP = "collective op"  # launched under an op named as a collective
    COMM_STREAM = "comm-only stream"  # on a stream that carries only communication (structure)
    LIBRARY = "library"  # its symbol belongs to a communication library
    NAME = "name"  # name keywords


#: Communication libraries, by the namespace or prefix of their kernels' symbols:
#: NCCL (ncclKernel_* before 2.19, ncclDevKernel_* after) and MSCCL/MSCCL++, RCCL (ROCm's NCCL,
#: same names), NVSHMEM (nvshmemi_* device code), DeepEP (csrc/kernels: namespaces
#: deep_ep::internode, ::intranode, ::internode_ll with dispatch, combine, notify_dispatch,
#: cached_notify...; deep_ep::legacy::intranode... since its 2026 layout, csrc/kernels/legacy),
#: and builds of it that rename the top namespace but keep those three, pplx-kernels, torch
#: symmetric memory (c10d::symmetric_memory:: multimem_*, one/two_shot_all_reduce), vLLM/SGLang
#: custom all-reduce (cross_device_reduce_*), MTIA's HCCL (CCP events named "hccl::...", which
#: Kineto's output_json.cpp gives the collective's metadata).
_LIBRARY = re.compile(
    r"nccl|rccl|msccl|nvshmem|^hccl::|deep_ep::|(^|[\s:])(intranode|internode|internode_ll)::|pplx::"
    r"|symmetric_memory::|symm_mem|multimem|cross_device_reduce|custom_?all_?reduce")

#: Host ops and ranges a collective's kernels are launched under: ProcessGroup ops (c10d::
#: allreduce_, alltoall_base_...), functional collectives (_c10d_functional::), the
#: ``<backend>:<op>`` range PyTorch >= 1.13 opens around each call, record_param_comms (its
#: Kineto/ExecutionTrace record), torch symmetric-memory ops, and namespaced collective ops of
#: inference engines (vllm::all_reduce, _C_custom_ar::all_reduce, all_to_all* of MoE layers).
#: With emit_nvtx nsys shows them as NVTX ranges with a suffix: "record_param_comms, op_id = 7".
_COLLECTIVE_HOST_OP = re.compile(
    r"^(_?c10d(_functional)?(_autograd)?|symm_mem)::|^(nccl|gloo|mpi|ucc|xccl|hccl|rccl|mccl):"
    r"|^record_param_comms\b|(^|::)(all_?to_?all|all_?reduce|all_?gather|reduce_?scatter)",
    re.IGNORECASE)

_RULES: tuple[tuple[Family, re.Pattern[str]], ...] = tuple(
    (family, re.compile(pattern))
    for family, pattern in (
        # Collective keywords in a name (libraries are _LIBRARY); gloo has no kernels.
        (Family.COMMUNICATION, r"all_?reduce|allgather|all_gather|reduce_scatter"
                               r"|alltoall|all_to_all|sendrecv|broadcast_kernel"),
        (Family.COPY, r"^memcpy|^memset|direct_copy_kernel|copy_kernel|catarraybatchedcopy|"
                      r"cudamemcpy|hipmemcpy|__amd_rocclr_copy|__amd_rocclr_fill|fillbuffer"),
        (Family.ATTENTION, r"flash|fmha|attention|attn|sdpa|paged_attention|softmax_warp"
                           r"|cutlass.*mha|xformers"),
        # Implicit-GEMM convolutions carry "gemm" in their names: match convolution first.
        # Not "convert" (vllm::_typeConvert<c10::BFloat16> in every vLLM norm kernel's name).
        (Family.CONVOLUTION, r"conv(?!ert)|winograd|fprop|dgrad|wgrad"),
        (Family.GEMM, r"gemm|sgemm|hgemm|dgemm|matmul|cublas|cutlass|wgmma|nvjet|ampere_.*_nn|"
                      r"ampere_.*_tn|ampere_.*_nt|volta_.*_nn|sm\d+_xmma_gemm|ck_tile.*gemm|"
                      r"tensile|cijk_|hipblaslt|triton_.*mm|_mm_|bmm"),
        (Family.NORMALIZATION, r"norm|bn_fw|bn_bw|layer_norm|batch_norm|rms|welford|group_norm"),
        (Family.CONVOLUTION, r"cudnn|miopen|fft"),
        (Family.REDUCTION, r"reduce|softmax|sum_kernel|argmax|argmin|topk|sort|scan|cumsum|"
                           r"max_kernel|min_kernel|mean_kernel|per_row|triton_red_|triton_per_"),
        (Family.ELEMENTWISE, r"elementwise|vectorized|unrolled|pointwise|triton_poi_|fill_kernel|"
                             r"index_kernel|scatter|gather|act_and_mul|silu|gelu|relu|rotary|"
                             r"quant|cast|where|add_kernel|mul_kernel|clamp"),
    )
)


@lru_cache(maxsize=65536)
def family_by_name(name: str) -> tuple[Family, Rule]:
    """The family of a kernel or GPU activity name and the rule that decided (library or name)."""
    low = name.lower()
    if _LIBRARY.search(low):
        return Family.COMMUNICATION, Rule.LIBRARY
    for family, pattern in _RULES:
        if pattern.search(low):
            return family, Rule.NAME
    return Family.OTHER, Rule.NAME


def kernel_family(name: str) -> Family:
    """The family of a kernel or GPU activity name, by its name alone (``classify_kernels``
    also reads how each kernel was launched)."""
    return family_by_name(name)[0]


@lru_cache(maxsize=8192)
def is_collective_host_op(name: str) -> bool:
    """True for a host op or range that a collective's kernels are launched under."""
    return _COLLECTIVE_HOST_OP.search(name) is not None


#: ``classify_kernels`` columns.
CLASSES_SCHEMA: Final = {Col.ID: pl.Int64, "family": pl.String, "rule": pl.String}
#: A stream counts as communication-only when more than this share of its kernels (copies
#: aside) are communication by the other rules and no name rule calls any of them compute.
#: ProcessGroupNCCL runs collectives on its own per-device NCCL streams, DeepEP on its
#: Buffer's comm_stream: such streams carry the library's kernels and the staging copies
#: of collectives only. A majority, not all: the kernels this rule is for are on it too.
COMM_STREAM_MIN_SHARE: Final = 0.5


def classify_kernels(trace: Trace) -> pl.DataFrame:
    """Family and deciding rule of every kernel: id, family, rule (a ``Rule`` value).

    1. collective args, collective op: the innermost CPU op (or, with none, annotation) around
       the kernel's launch is a collective: by its recorded args first (a "Collective name", as
       record_param_comms carries it), whatever the op is called, else by its name
       (``is_collective_host_op``); a copy the collective runs through an aten op
       (aten::copy_ inside c10d::allgather_) is that op's, not the collective's.
    2. comm-only stream: a kernel whose name says nothing (family "other"; launched under a
       non-collective op, such as a custom op of an expert-parallel library, or with no launch
       context), or a communication kernel whose launch context is unknown (no launch record:
       launched before the profiler started, or a read without launch calls; or launched
       outside any CPU op), on a stream (per process and device) where communication is more
       than COMM_STREAM_MIN_SHARE of the kernels (copies aside) and nothing is compute by name.
    3. library, 4. name: ``family_by_name``.
    A partial Trace read without launch calls has no launches to follow: rules 2-4 only.
    Computed once per Trace (kernels, collectives, overlap and the tensor-core rule all ask;
    a Trace never changes, and of_kind keeps its results the same way).
    """
    return trace.kept("_kernel_classes", lambda: _classify(trace))


def _classify(trace: Trace) -> pl.DataFrame:
    k = trace.of_kind(Kind.KERNEL).select(
        Col.ID, Col.NAME, Col.PID, Col.DEVICE, Col.STREAM, Col.LAUNCH, Col.OP
    )
    if k.height == 0:
        return pl.DataFrame(schema=CLASSES_SCHEMA)
    # Each name is classified once, and rows take its family by the name's category code: a
    # million long templated names cast to strings would cost hundreds of MB.
    names = k.select(pl.col(Col.NAME).unique()).select(
        pl.col(Col.NAME).cast(pl.String), pl.col(Col.NAME).to_physical().alias("_code")
    )
    by_code = {code: family_by_name(name) for name, code in names.iter_rows()}
    code = pl.col(Col.NAME).to_physical()
    k = k.with_columns(
        code.replace_strict({c: f.value for c, (f, _) in by_code.items()}, return_dtype=pl.String).alias("family"),
        code.replace_strict({c: r.value for c, (_, r) in by_code.items()}, return_dtype=pl.String).alias("rule"),
        _launching_collective(trace, k),
    ).with_columns(pl.col("_launched_by").is_not_null().alias("_under"))
    comm = Family.COMMUNICATION.value
    k = k.with_columns(
        pl.when(pl.col("_under")).then(pl.lit(comm)).otherwise(pl.col("family")).alias("family"),
        pl.when(pl.col("_under")).then(pl.col("_launched_by")).otherwise(pl.col("rule")).alias("rule"),
    )
    stream = [Col.PID, Col.DEVICE, Col.STREAM]
    fam = pl.col("family")
    # A kernel whose name says nothing, whatever op launched it (an expert-parallel library's
    # custom op records no collective args); one named by a library keeps the library rule
    # unless its launch context is unknown (then its stream, structure, decides).
    k = k.with_columns((~pl.col("_under") & pl.col(Col.STREAM).is_not_null() & (
        (fam == Family.OTHER.value) | ((fam == comm) & pl.col(Col.OP).is_null()))).alias("_may"))
    if not k.get_column("_may").any():
        return k.select(*CLASSES_SCHEMA)
    # Each stream's share once, by a group_by joined back (nulls are a key, as a window's
    # partition has them): three windows over a million rows took 0.2 s, this 0.04 s.
    comm_only = k.group_by(stream).agg(
        (fam.is_in([comm, Family.COPY.value, Family.OTHER.value]).all()
         & ((fam == comm).sum() > COMM_STREAM_MIN_SHARE * (fam != Family.COPY.value).sum())).alias("_comm_only"))
    k = k.join(comm_only, on=stream, how="left", nulls_equal=True, maintain_order="left")
    by_stream = pl.col("_may") & pl.col("_comm_only")
    return k.with_columns(
        pl.when(by_stream).then(pl.lit(comm)).otherwise(pl.col("family")).alias("family"),
        pl.when(by_stream).then(pl.lit(Rule.COMM_STREAM.value)).otherwise(pl.col("rule")).alias("rule"),
    ).select(*CLASSES_SCHEMA)


#: ``_launching_collective`` codes: how the op that launched a kernel is known as a collective.
_BY_NAME, _BY_ARGS = 1, 2


def _launching_collective(trace: Trace, k: pl.DataFrame) -> pl.Series:
    """Per kernel row: the rule by which the innermost CPU op (else annotation) around its launch
    is a collective (``Rule.COLLECTIVE_ARGS`` or ``Rule.COLLECTIVE_OP``), null where it is not."""
    out = np.zeros(k.height, dtype=np.int8)
    launch = k.get_column(Col.LAUNCH).fill_null(-1).to_numpy()
    if (launch >= 0).any():
        s = trace.slices
        is_host_op = s.get_column(Col.KIND).is_in([Kind.CPU_OP.value, Kind.ANNOTATION.value]).to_numpy()
        op = k.get_column(Col.OP).fill_null(-1).to_numpy()
        # Kernels launched outside any CPU op: the innermost annotation (nsys NVTX ranges).
        no_op = (op < 0) & (launch >= 0)
        if no_op.any():
            parent = s.get_column(Col.PARENT).fill_null(-1).to_numpy()
            op = op.copy()
            op[no_op] = first_flagged(launch[no_op], parent, is_host_op)
        has = op >= 0
        if has.any():
            host_names = s.get_column(Col.NAME).gather(pl.Series(op[has])).cast(pl.String)
            named = {n: is_collective_host_op(n) for n in host_names.unique().to_list() if n is not None}
            by_name = np.zeros(k.height, dtype=bool)
            by_name[has] = host_names.replace_strict(named, default=False, return_dtype=pl.Boolean).to_numpy()
            # Args before names: ParamCommsUtils' RECORD_PARAM_COMMS records the collective's
            # name, sizes and process group as the op's args (Kineto writes "Collective name",
            # "In msg nelems", "Process Group Name"), which say what the op did whatever a
            # library or a fork calls it.
            recorded = trace.op_attrs.filter(pl.col(OpAttrCol.COLLECTIVE).is_not_null()).get_column(Col.ID)
            by_args = has & np.isin(op, recorded.to_numpy())
            out[by_name] = _BY_NAME
            out[by_args] = _BY_ARGS
    code = pl.Series("_code", out)
    return pl.select(pl.when(code == _BY_ARGS).then(pl.lit(Rule.COLLECTIVE_ARGS.value))
                     .when(code == _BY_NAME).then(pl.lit(Rule.COLLECTIVE_OP.value))
                     .otherwise(None).alias("_launched_by")).to_series()


# --- collectives ------------------------------------------------------------------------------
# PyTorch >= 1.13 wraps each process-group call in a ``<backend>:<op>`` range (Kineto
# user_annotation; with emit_nvtx nsys shows it as "nccl:all_reduce, op_id = N").
#: The backends a process-group range's name begins with, before a colon ("nccl:all_reduce").
COLLECTIVE_BACKENDS: Final = ("nccl", "gloo", "mpi", "ucc", "xccl", "hccl", "rccl", "mccl")
_COLLECTIVE_RANGE = re.compile(rf"^({'|'.join(COLLECTIVE_BACKENDS)}):([A-Za-z_]+)")
# Normalized op per spelling, tried in order on the name lower-cased with non-letters removed:
# "all_reduce" (ranges), "allreduce" (record_param_comms' Collective name), "AllReduce"
# (ncclKernel_AllReduce_*, ncclDevKernel_AllReduce_*), "multimem_all_reduce" (symm_mem).
_COLLECTIVE_OPS: tuple[tuple[str, str], ...] = (
    ("allreduce", "all_reduce"),
    ("reducescatter", "reduce_scatter"),
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("sendrecv", "send_recv"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("reduce", "reduce"),
    ("send", "send"),
    ("recv", "recv"),
)
_NON_LETTERS = re.compile(r"[^a-z]")


@lru_cache(maxsize=8192)
def collective_op(name: str) -> str | None:
    """The collective a name stands for (``all_reduce``, ``all_gather``...), None if none.

    Works on range names, record_param_comms' collective names and communication kernel
    names alike, so the same collective gets the same op whichever of them a trace has.
    """
    letters = _NON_LETTERS.sub("", name.lower())
    for token, op in _COLLECTIVE_OPS:
        if token in letters:
            return op
    return None


@lru_cache(maxsize=8192)
def collective_range(name: str) -> tuple[str, str] | None:
    """(backend, op) of a process-group range such as ``nccl:all_reduce``; None otherwise."""
    m = _COLLECTIVE_RANGE.match(name)
    if m is None:
        return None
    return m.group(1), collective_op(m.group(2)) or m.group(2).strip("_")
