"""The name rules' quick pre-tests (a prefix, a substring, an ASCII lower-case look) answer
exactly as the bare patterns do, and so do their column pre-tests (``api_names.PRETESTS``, run
over many names at once by ``name_codes.decide``): on every name of two real traces, read from
the raw files, on names built to sit at each pattern's edges, and on generated text."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from nsys_support import raw_db
from tracewhy.analyses import api_names as a
from tracewhy.analyses import compile_markers as cm
from tracewhy.analyses import compile_slices, name_codes
from tracewhy.analyses.name_codes import decide
from tracewhy.findings import applicability, platform
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.readers import read_trace

#: Each rule and what its pattern alone says (the definitions before the pre-tests).
BARE: dict[str, tuple[Callable[[str], object], Callable[[str], object]]] = {
    "sync": (a.is_sync_call, lambda n: a._SYNC.match(n) is not None),
    "alloc": (a.is_alloc_call, lambda n: a._ALLOC.match(n) is not None),
    "launch": (a.is_launch_call, lambda n: a._LAUNCH.match(n) is not None or a._GRAPH.match(n) is not None),
    "graph": (a.is_graph_launch, lambda n: a._GRAPH.match(n) is not None),
    "dataloader": (a.is_dataloader, lambda n: a._DATALOADER.search(n) is not None),
    "comm": (a.is_comm, lambda n: a._COMM.search(n) is not None),
    "autograd": (a.is_autograd_node, lambda n: n[:35] == "autograd::engine::evaluate_function"),
    "op_range_name": (a.op_range_name, lambda n: a._OP_RANGE_SUFFIX.sub("", n)),
    "phase": (a.annotation_phase, lambda n: None if a._OP_RANGE_SUFFIX.search(n) else next(
        (phase for phase, word in a._PHASE_WORDS if word.search(n)), None)),
    "compile_data": (lambda n: _groups(cm.compile_data(n)), lambda n: _groups(cm.COMPILE_DATA.match(n))),
    "resume": (lambda n: _groups(cm.resume(n)), lambda n: _groups(cm.RESUME.match(n))),
}

def _groups(match: re.Match[str] | None) -> tuple[str | None, ...] | None:
    return match.groups() if match else None


EDGES = [
    "cudaDeviceSynchronize", "cuStreamSynchronize", "hipMemcpy", "cuMemcpyDtoH_v2", "cudaMalloc", "cuMemAlloc_v2",
    "cudaLaunchKernel", "cuLaunchKernelEx", "hipExtLaunchKernelGGL", "cudaGraphLaunch", "cuGraphLaunch",
    "xcudaLaunchKernel", "CUDALaunchKernel", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
    "DataLoader.__next__", "dataloader.__next__", "nccl:all_reduce", "ncclAllReduce", "ncclx", "gloo:broadcast",
    "mpi:send", "ucc:x", "rccl:x", "c10d::allreduce_", "record_param_comms", "record_param_comms_x",
    "ProcessGroupNCCL::allreduce", "my ProcessGroup", "autograd::engine::evaluate_function: MulBackward0",
    "autograd::engine::evaluate_functio", "## forward ##", "## Backward ##", "backwards", "feedforward",
    "zero_grad", "Optimizer.step#SGD.step", "OPTIMIZER", "aten::mul, seq = 3, op_id = 7", "forward, op_id = 1",
    "aten::to, op_id = 999599", "x, seq = 1\n", "forward\n", "\u212aackward", "backward\u0131", "forw\u0131rd",
    "optim\u0130zer", "zero_grad\u017f", "", "=", "a, op_id = ", "backward, op_id = 2",
    "inductor_compile_data: {'compile_id': '0/0'}", "aot_collect_metadata_data: compile_id=0/1, x",
    "x_data: compile_id=!1/2/3", "f.py(12): torch_dynamo_resume_in_forward_at_65", "torch_dynamo_resume_in_f_at_1",
    "torch_dynamo_resume_in_", "compile_id=1/2",
]


def _uncached(rule: Callable[[str], object]) -> Callable[[str], object]:
    """The rule itself, past its cache (which would answer a name seen before from memory)."""
    inner: Callable[[str], object] = getattr(rule, "__wrapped__", rule)
    return inner


@cache
def _real_names() -> list[str]:
    """Every name in the nsys export's string table and NVTX texts, and every event name of the
    BERT Kineto trace, read straight from the files."""
    db = raw_db("nsysai_h100_2gpu_1s")
    names = {row[0] for row in db.execute("SELECT value FROM StringIds")}
    names |= {row[0] for row in db.execute("SELECT DISTINCT text FROM NVTX_EVENTS WHERE text IS NOT NULL")}
    kineto = json.loads(gzip.decompress(shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz").read_bytes()))
    names |= {e["name"] for e in kineto["traceEvents"] if isinstance(e.get("name"), str)}
    return sorted(n for n in names if isinstance(n, str))


@pytest.mark.parametrize("rule", sorted(BARE))
def test_real_names_answer_as_the_bare_pattern(rule: str) -> None:
    names = _real_names()
    assert len(names) > 16_000  # the export's emit_nvtx ranges are there
    quick, bare = BARE[rule]
    wrong = [n for n in names if _uncached(quick)(n) != bare(n)]
    assert wrong == []


@pytest.mark.parametrize("rule", sorted(BARE))
def test_edge_names_answer_as_the_bare_pattern(rule: str) -> None:
    quick, bare = BARE[rule]
    hits = [n for n in EDGES if bare(n) not in (None, False, n)]
    assert hits  # the edges reach both answers of every rule
    assert [(n, quick(n)) for n in EDGES] == [(n, bare(n)) for n in EDGES]


_PIECES = st.sampled_from(["cu", "hip", "da", "Launch", "Kernel", "nccl", "A", ":", "c10d::", "ProcessGroup",
                           ", op_id =", "\x1c", "\x0b", "7", "\u0661",
                           "DataLoader", "__next__", "forward", "BACKWARD", "optimizer", "zero_grad", ", seq = 1",
                           ", op_id = 2", " ", "\n", "\u212a", "\u0130", "\u0131", "x", "autograd::engine::",
                           "evaluate_function", "record_param_comms", "_data: ", "compile_id=", "1/2",
                           "torch_dynamo_resume_in_", "_at_", "(3): "])


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES | st.text(max_size=3), max_size=6).map("".join))
def test_generated_names_answer_as_the_bare_pattern(name: str) -> None:
    for rule, (quick, bare) in BARE.items():
        assert _uncached(quick)(name) == bare(name), rule


def _decided_as_one_by_one(names: list[str]) -> dict[str, list[tuple[str, object]]]:
    """Per rule with a column pre-test, the names ``decide`` answers otherwise than the rule does."""
    wrong: dict[str, list[tuple[str, object]]] = {}
    for test, pretest in a.PRETESTS.items():
        fill = None if test is a.annotation_phase else False
        one_by_one = [_uncached(test)(n) for n in names]
        decided = decide(names, test, pretest, fill)
        bad = [(n, got) for n, got, want in zip(names, decided, one_by_one, strict=True) if got != want]
        if bad:
            wrong[getattr(test, "__name__", repr(test))] = bad
    return wrong


#: Names where polars' regex dialect and Python's read the op-range suffix apart, or nearly.
_DIALECT_EDGES = ["a, op_id = 1\n", "a, op_id = 1\n\n", "a,\x1cop_id = 1", "a, op_id =\x1f1", "a,\x0bseq = 2",
                  "a, seq = \u0661", "\u00e9, op_id = 3", "a, op_id = 1\r", "a,\tseq\t=\t1, op_id = 2"]


def test_column_pretests_answer_every_real_and_edge_name_as_the_rule() -> None:
    names = [*_real_names(), *EDGES, *_DIALECT_EDGES, "aten::item", "aten::items", "Optimizer.zero_grad#SGD.zero_grad"]
    assert _decided_as_one_by_one(names) == {}
    assert a.op_range_names(names) == [_uncached(a.op_range_name)(n) for n in names]
    for test in a.PRETESTS:  # every rule answers some name other than its fill
        assert any(_uncached(test)(n) not in (None, False) for n in names), test


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_PIECES | st.text(max_size=3), max_size=6).map("".join), max_size=20))
def test_column_pretests_answer_generated_names_as_the_rule(names: list[str]) -> None:
    with pytest.MonkeyPatch.context() as few_names_too:  # the column path also for these few names
        few_names_too.setattr(name_codes, "PRETEST_MIN_NAMES", 0)
        few_names_too.setattr(a, "_AT_ONCE_MIN_NAMES", 0)
        assert _decided_as_one_by_one(names) == {}
        assert a.op_range_names(names) == [_uncached(a.op_range_name)(n) for n in names]


def test_compile_roles_are_all_among_the_names_the_column_keeps() -> None:
    """``compile_slices._may_have_a_role`` drops only names ``_roles`` gives none: over the real
    names and the markers of two compiled runs (a generated CPU capture, TraceLens' MI300X one)."""
    compiled = [read_trace(GENERATED / "cpu_compile.pt.trace.json.gz"),
                read_trace(shared_trace("tracelens/mi300x_torch_compile_triton_small.json.gz"))]
    names = sorted({*_real_names(), *EDGES, *(n for t in compiled
                                             for n in t.slices.get_column("name").cast(pl.String).drop_nulls())})
    with pytest.MonkeyPatch.context() as every_size:
        every_size.setattr(compile_slices, "PRETEST_MIN_NAMES", 0)
        kept = compile_slices._may_have_a_role(pl.Series(names, dtype=pl.String)).to_list()
    roles = compile_slices._roles(names)
    assert compile_slices._roles(kept) == roles
    assert len(kept) < len(names) // 10
    assert set(roles.values()) >= {"region", "wrapper", "compile"}


#: The rules' name searches a column test of literals precedes (every match holds one of them):
#: DataParallel's ops (findings/platform.py) and the DataLoader's iterators (findings/applicability.py).
LITERAL_SEARCHES: dict[str, tuple[re.Pattern[str], tuple[str, ...]]] = {
    "data_parallel": (platform._DATA_PARALLEL, platform._DATA_PARALLEL_LITERALS),
    "with_workers": (applicability._WITH_WORKERS, applicability._WITH_WORKERS_LITERALS),
    "without_workers": (applicability._WITHOUT_WORKERS, applicability._WITHOUT_WORKERS_LITERALS),
}
#: A name each literal alone lets through, and names near them that the patterns refuse.
LITERAL_EDGES = ["Broadcast", "ReduceAddCoalescedBackward", "Gather", "ScatterBackward", "GatherBackward\n",
                 "torch.nn.DataParallel.forward", "Gathering", "xScatter", "DataParallel.forward2", "Broad cast",
                 "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "_worker_loop",
                 "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "_worker_loo", "_SingleProcess"]


@pytest.mark.parametrize("search", sorted(LITERAL_SEARCHES))
def test_literal_pretests_find_what_the_patterns_find(search: str) -> None:
    pattern, literals = LITERAL_SEARCHES[search]
    names = [*_real_names(), *EDGES, *LITERAL_EDGES]
    bare = [pattern.search(n) is not None for n in names]
    for literal in literals:  # each literal lets through a name the pattern finds and no other literal does
        assert any(hit and sum(other in n for other in literals) == 1 and literal in n
                   for n, hit in zip(names, bare, strict=True)), literal
    with pytest.MonkeyPatch.context() as few_names_too:
        few_names_too.setattr(name_codes, "PRETEST_MIN_NAMES", 0)
        assert decide(names, lambda n: pattern.search(n) is not None, a.holding_any(literals), False) == bare


def test_the_run_facts_and_the_data_parallel_rule_find_names_through_the_column_test(tmp_path: Path) -> None:
    # Over 2,000 distinct names (the column test's threshold): a trace of one process driving two
    # GPUs, whose names are the edges above and many plain ops.
    b = KinetoBuilder()
    names = [*LITERAL_EDGES, *(f"aten::op{i}" for i in range(name_codes.PRETEST_MIN_NAMES))]
    for i, name in enumerate(names):
        b.op(name, ts=10.0 * i, dur=5.0)
    b.launch("k0", 0.0, 2.0, 5.0, 3.0, device=0).launch("k1", 10.0, 2.0, 15.0, 3.0, device=1)
    found = [f for f in platform.findings(Context(read_trace(b.write(tmp_path / "t.json")), DiagnoseOptions()))
             if f.code == Code.DATA_PARALLEL_NOT_DDP]
    assert [f.evidence["ops"] for f in found] == [
        sorted(n for n in LITERAL_EDGES if platform._DATA_PARALLEL.search(n))]
    assert found[0].evidence["ops"] == ["Broadcast", "Gather", "GatherBackward\n", "ReduceAddCoalescedBackward",
                                        "ScatterBackward", "torch.nn.DataParallel.forward"]
    assert applicability._loader_workers(names)[0] is True
    assert applicability._loader_workers(names[12:])[0] is False
    assert applicability._loader_workers(names[15:])[0] is None


def test_collective_ranges_are_parsed_where_the_column_test_finds_a_backend() -> None:
    # analyses/collectives.py parses a name as a process-group range ("nccl:all_reduce") only
    # where it holds "<backend>:"; each backend is needed for a name the parse finds.
    from tracewhy.analyses import collectives, families

    starts = collectives._RANGE_STARTS
    edges = [f"{b}:{op}" for b in families.COLLECTIVE_BACKENDS for op in ("all_reduce", "Broadcast_", "_x")]
    names = [*_real_names(), *EDGES, *edges, "xnccl:all_reduce", "nccl::all_reduce", "NCCL:all_reduce", "nccl:"]
    bare = [_uncached(families.collective_range)(n) for n in names]
    for start in starts:
        assert any(p is not None and n.startswith(start) for n, p in zip(names, bare, strict=True)), start
    with pytest.MonkeyPatch.context() as few_names_too:
        few_names_too.setattr(name_codes, "PRETEST_MIN_NAMES", 0)
        assert decide(names, families.collective_range, a.holding_any(starts), None) == bare
    ddp = read_trace(shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz"))
    one_by_one = collectives._collective_ranges(ddp)
    with pytest.MonkeyPatch.context() as few_names_too:
        few_names_too.setattr(name_codes, "PRETEST_MIN_NAMES", 0)
        assert collectives._collective_ranges(ddp).equals(one_by_one) and one_by_one.height > 0
