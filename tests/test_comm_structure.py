"""Communication is recognised by how a kernel was launched and where it ran before its name:
kernels under a collective op, kernels on a stream that carries only communication, kernels of
a communication library (DeepEP, NVSHMEM...), then name keywords. ``kernels`` says which rule
classified each, and overlap counts them as communication."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from functools import cache
from pathlib import Path

import polars as pl
import pytest

import tracewhy
from builders import KinetoBuilder
from conftest import shared_trace
from tracewhy.analyses.families import Family, Rule, classify_kernels, family_by_name, is_collective_host_op
from tracewhy.analyses.kernels import kernels
from tracewhy.analyses.overlap import overlap
from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import Trace
from tracewhy.reports.diagnose import diagnose

A2A = "hta/a100_16rank_rank0_alltoall.json.gz"
SENDRECV = "ncclKernel_SendRecv"
#: Names with nothing a name rule knows: no library namespace, no collective keyword.
OPAQUE = "void my_moe::exchange_tokens<8, 128>(int*, float*)"
#: DeepEP's kernel symbols (csrc/kernels/internode.cu, intranode.cu: namespaces deep_ep::internode
#: and ::intranode; notify_dispatch, dispatch, cached_notify, combine).
DEEPEP = ("void deep_ep::internode::dispatch<false, 8, false, 12, 8>(int4*, float*, int*)",
          "void deep_ep::internode::combine<__nv_bfloat16, 8, 1024>(int4*, float*, int*)",
          "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int)",
          "void deep_ep::internode::cached_notify<8>(int, int, int*, int)")


@cache
def _a2a() -> Trace:
    return tracewhy.load(shared_trace(A2A))


def _renamed(trace: Trace, rename: dict[str, str] | None = None, kernels_only: bool = False,
             pattern: str = SENDRECV, to: str = OPAQUE) -> Trace:
    """The trace with every kernel whose name contains ``pattern`` renamed to ``to`` (or per
    ``rename``: old name -> new); ``kernels_only`` drops the launch links, as a kernels-only
    read would have them."""
    s = trace.slices.with_columns(pl.col(Col.NAME).cast(pl.String))
    is_kernel = pl.col(Col.KIND) == Kind.KERNEL.value
    if rename is None:
        new = pl.when(is_kernel & pl.col(Col.NAME).str.contains(pattern, literal=True)).then(pl.lit(to))
    else:
        new = pl.when(is_kernel & pl.col(Col.NAME).is_in(list(rename))).then(
            pl.col(Col.NAME).replace_strict(rename, default=None))
    s = s.with_columns(new.otherwise(pl.col(Col.NAME)).cast(pl.Categorical).alias(Col.NAME))
    meta = trace.meta
    if kernels_only:
        s = s.filter(is_kernel).with_columns(
            pl.Series(Col.ID, range(s.filter(is_kernel).height), dtype=pl.Int64),
            pl.lit(None, pl.Int64).alias(Col.LAUNCH), pl.lit(None, pl.Int64).alias(Col.OP),
            pl.lit(None, pl.Int64).alias(Col.CORRELATION))
        meta = dataclasses.replace(meta, kinds_read=(Kind.KERNEL.value,))
    empty = {name: trace.table(name).clear() for name in ("kernel_attrs", "copy_attrs", "op_attrs")}
    out = dataclasses.replace(trace, meta=meta, slices=s, **(empty if kernels_only else {}))
    out.__dict__.pop("_of_kind", None)
    out.check()
    return out


def _comm_ns(trace: Trace) -> int:
    fam = {r["family"]: r["total_ns"] for r in kernels(trace).by_family.iter_rows(named=True)}
    return int(fam.get(Family.COMMUNICATION.value, 0))


def _raw_sendrecv_ns(trace: Trace) -> int:
    k = trace.of_kind(Kind.KERNEL).filter(pl.col(Col.NAME).cast(pl.String).str.contains(SENDRECV, literal=True))
    return int(k.get_column(Col.DUR).sum())


def test_kernels_under_a_collective_op_are_communication_whatever_their_name() -> None:
    """All-to-all kernels renamed to a name no rule knows: 75 of the 80 NCCL kernels were
    launched under record_param_comms / c10d:: ops, the other 5 (launched before the profiler
    started, no launch record) run on the three NCCL streams, which carry nothing else. The
    old name-only rules called all 80 compute: comm 0 ns."""
    trace = _a2a()
    expected = _raw_sendrecv_ns(trace)  # 190.345 ms, summed from the trace's own kernel rows
    assert expected == 190_345_000
    renamed = _renamed(trace)
    assert family_by_name(OPAQUE) == (Family.OTHER, Rule.NAME)
    rows = kernels(renamed).by_name.filter(pl.col("name") == OPAQUE)
    by_rule = {r["rule"]: (r["family"], r["count"]) for r in rows.iter_rows(named=True)}
    assert by_rule == {Rule.COLLECTIVE_OP.value: ("communication", 75), Rule.COMM_STREAM.value: ("communication", 5)}
    assert _comm_ns(renamed) == expected
    # Overlap splits the device's time with the same classification.
    dev = overlap(renamed).devices.filter(pl.col(Col.DEVICE) == 0).row(0, named=True)
    dev_orig = overlap(trace).devices.filter(pl.col(Col.DEVICE) == 0).row(0, named=True)
    assert dev["comm_ns"] == dev_orig["comm_ns"] > 0
    assert dev["compute_ns"] == dev_orig["compute_ns"]


def test_a_copy_run_by_an_aten_op_inside_a_collective_stays_a_copy() -> None:
    """Innermost op decides: aten::copy_ launched inside c10d:: is the copy's, not the collective's."""
    trace = _a2a()
    classes = classify_kernels(trace).join(trace.of_kind(Kind.KERNEL).select(Col.ID, Col.OP), on=Col.ID)
    names = trace.slices.get_column(Col.NAME).cast(pl.String)
    under_aten = classes.filter(pl.col(Col.OP).is_not_null()).with_columns(
        pl.col(Col.OP).map_elements(lambda i: names[i], return_dtype=pl.String).alias("op"))
    comm_ops = set(under_aten.filter(pl.col("rule") == Rule.COLLECTIVE_OP.value).get_column("op").to_list())
    assert comm_ops == {"record_param_comms", "c10d::_allgather_base_"}
    assert under_aten.filter(pl.col("op").str.starts_with("aten::") & (pl.col("family") == "communication")).height == 0


#: DeepEP's namespaces: deep_ep:: before 2026, deep_ep::legacy:: since (csrc/kernels/legacy/
#: intranode.cu, internode.cu, internode_ll.cu), and a fork that renames the top namespace but
#: keeps the kernels' own (intranode, internode, internode_ll).
@pytest.mark.parametrize("namespace", ["deep_ep::", "deep_ep::legacy::", "ep_fork::"])
def test_deepep_kernels_are_communication_by_library_even_without_launches(namespace: str) -> None:
    """DeepEP's dispatch/combine/notify kernels, in a kernels-only read (no launch links, the way
    `tracewhy kernels` reads an nsys file): the library rule, and the streams it shows to carry
    nothing but communication."""
    names = [n.replace("deep_ep::", namespace) for n in DEEPEP]
    trace = _a2a()
    sendrecv = sorted(n for n in trace.of_kind(Kind.KERNEL).get_column(Col.NAME).cast(pl.String).unique().to_list()
                      if SENDRECV in n)
    assert len(sendrecv) == 1  # one NCCL kernel name: rename its instances by stream instead
    streams = trace.of_kind(Kind.KERNEL).filter(pl.col(Col.NAME).cast(pl.String) == sendrecv[0])
    by_stream = sorted(streams.get_column(Col.STREAM).unique().to_list())
    assert by_stream == [84, 285, 363]
    s = trace.slices.with_columns(pl.col(Col.NAME).cast(pl.String))
    name_of = {84: names[0], 285: names[1], 363: names[2]}
    s = s.with_columns(
        pl.when((pl.col(Col.KIND) == Kind.KERNEL.value) & (pl.col(Col.NAME) == sendrecv[0]))
        .then(pl.col(Col.STREAM).replace_strict(name_of, default=None, return_dtype=pl.String))
        .otherwise(pl.col(Col.NAME)).cast(pl.Categorical).alias(Col.NAME))
    deepep = dataclasses.replace(trace, slices=s)
    deepep.__dict__.pop("_of_kind", None)
    for partial in (False, True):
        t = _renamed(deepep, rename={}, kernels_only=partial)
        rows = kernels(t).by_name.filter(pl.col("name").str.starts_with(f"void {namespace}"))
        assert set(rows.get_column("family").to_list()) == {"communication"}
        rules = set(rows.get_column("rule").to_list())
        if partial:  # no launches to follow: the library names them, which makes their streams
            # communication-only, and a stream is structure: it decides first
            assert rules == {Rule.COMM_STREAM.value}
        else:
            assert Rule.COLLECTIVE_OP.value in rules
        assert _comm_ns(t) == 190_345_000
    for name in names:
        assert family_by_name(name) == (Family.COMMUNICATION, Rule.LIBRARY)


def test_mtia_hccl_work_is_communication_by_library() -> None:
    """Kineto gives an MTIA CCP event the collective's metadata when its name starts "hccl::"
    (libkineto/src/output_json.cpp, handleActivity): MTIA's collective library."""
    assert family_by_name("hccl::all_reduce") == (Family.COMMUNICATION, Rule.LIBRARY)
    assert family_by_name("aten::mul.out-dtype_Float")[0] is not Family.COMMUNICATION


def test_collective_host_ops_as_kineto_and_nsys_name_them() -> None:
    collective = ("record_param_comms", "record_param_comms, op_id = 993823", "c10d::alltoall_base_",
                  "nccl:all_to_all, op_id = 992364", "_c10d_functional::all_reduce", "gloo:broadcast",
                  "vllm::all_reduce", "all_to_all_single")
    compute = ("aten::copy_", "aten::mm", "## alltoall_fwd_single ##", "ProfilerStep#3", "vllm::moe_forward")
    assert all(is_collective_host_op(n) for n in collective)
    assert not any(is_collective_host_op(n) for n in compute)


def test_stream_rule_needs_a_communication_stream(tmp_path: Path) -> None:
    """A kernel nobody knows on the compute stream stays 'other'; one on an NCCL stream is communication."""
    b = KinetoBuilder()
    for i in range(3):  # the NCCL stream: three all-reduces under their ops, one launched before the capture
        b.op("record_param_comms", i * 100, 20)
        b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", i * 100 + 1, 2, gpu_ts=i * 100 + 5, gpu_dur=30,
                 stream=20)
    b.events.append({"ph": "X", "cat": "kernel", "name": "my_lib::push_kernel", "pid": 0, "tid": 20, "ts": 400,
                     "dur": 10, "args": {"device": 0, "stream": 20, "correlation": 99}})
    b.launch("my_lib::push_kernel", 500, 2, gpu_ts=505, gpu_dur=10, stream=7)  # compute stream
    b.launch("k_a", 600, 2, gpu_ts=605, gpu_dur=50, stream=7)
    b.launch("k_a", 700, 2, gpu_ts=705, gpu_dur=50, stream=7)
    trace = tracewhy.load(b.write(tmp_path / "s.json"))
    rows = {(r["name"], r["rule"]): (r["family"], r["count"]) for r in kernels(trace).by_name.iter_rows(named=True)}
    assert rows == {
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", Rule.COLLECTIVE_OP.value): ("communication", 3),
        ("my_lib::push_kernel", Rule.COMM_STREAM.value): ("communication", 1),
        ("my_lib::push_kernel", Rule.NAME.value): ("other", 1),
        ("k_a", Rule.NAME.value): ("other", 2),
    }


def test_kernels_renders_the_deciding_rule() -> None:
    """`tracewhy kernels` says, per kernel, which rule decided its family."""
    from rich.console import Console

    from tracewhy.renderers.kernels import render_kernels

    console = Console(width=200, record=True)
    console.print(render_kernels(kernels(_renamed(_a2a())), 3))
    text = console.export_text()
    assert re.search(r"exchange_tokens.*communication.*collective op", text)
    assert "by: what decided the family" in text


DDP = "hta/a100_ddp2_rank0_nccl2.17.json.gz"
#: The host ops and ranges (and their GPU projections) of the DDP trace's collectives, renamed
#: the way a custom communication op (an expert-parallel dispatch bound through pybind or
#: torch.library) names its own: nothing a name rule knows. Their args stay: record_param_comms'
#: "Collective name", "In msg nelems", "Process Group Name" (what ParamCommsDebugInfo holds,
#: torch/csrc/distributed/c10d/ParamCommsUtils.hpp, RECORD_PARAM_COMMS).
CUSTOM_HOST = {"record_param_comms": "ep::exchange", "c10d::allreduce_": "ep::exchange_outer",
               "c10d::broadcast_": "ep::exchange_outer", "nccl:all_reduce": "ep_exchange_range",
               "nccl:broadcast": "ep_exchange_range"}


def _custom_comm_copy(tmp_path: Path, *, drop_args_of: str | None = None) -> Path:
    """The DDP trace written again with its NCCL kernels renamed to ``OPAQUE`` and its collective
    host ops and ranges renamed by ``CUSTOM_HOST``; streams, correlations, flows and args kept.
    ``drop_args_of``: the collective (as record_param_comms names it) whose ops also lose their
    args, as a custom op that records none."""
    doc = json.loads(gzip.decompress(shared_trace(DDP).read_bytes()))
    renamed_kernels = 0
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_"):
            e["name"] = OPAQUE
            renamed_kernels += 1
        elif e.get("cat") in ("cpu_op", "user_annotation", "gpu_user_annotation") and e.get("name") in CUSTOM_HOST:
            e["name"] = CUSTOM_HOST[e["name"]]
            if drop_args_of is not None and e.get("args", {}).get("Collective name") == drop_args_of:
                e["args"] = {k: v for k, v in e["args"].items() if k in ("External id", "Ev Idx")}
    assert renamed_kernels == 21  # 15 all-reduces and 6 broadcasts on NCCL's stream 40
    out = tmp_path / "custom_comm.json.gz"
    out.write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    return out


def test_kernels_under_an_op_whose_args_describe_a_collective_are_communication(tmp_path: Path) -> None:
    """Kernels and host ops both renamed to names no rule knows: record_param_comms' args still
    say which collective each op ran, so exposed communication and the comm share are what they
    are for the original trace (by name every kernel was 'other': comm 0 ns)."""
    original = tracewhy.load(shared_trace(DDP))
    custom = tracewhy.load(_custom_comm_copy(tmp_path))
    names = set(custom.slices.get_column(Col.NAME).cast(pl.String).unique().to_list())
    assert not any(is_collective_host_op(n) for n in names)  # no name left to go by
    # Independent expectation: the NCCL kernels' durations summed from the original's rows.
    nccl = original.of_kind(Kind.KERNEL).filter(pl.col(Col.NAME).cast(pl.String).str.starts_with("ncclKernel_"))
    expected = int(nccl.get_column(Col.DUR).sum())
    assert expected == 46_876_493
    assert _comm_ns(custom) == expected
    rows = kernels(custom).by_name.filter(pl.col("name") == OPAQUE)
    assert {(r["rule"], r["family"], r["count"]) for r in rows.iter_rows(named=True)} == {
        (Rule.COLLECTIVE_ARGS.value, "communication", 21)}
    dev = overlap(custom).devices.filter(pl.col(Col.DEVICE) == 0).row(0, named=True)
    dev_orig = overlap(original).devices.filter(pl.col(Col.DEVICE) == 0).row(0, named=True)
    for col in ("comm_ns", "comm_exposed_ns", "compute_ns"):
        assert dev[col] == dev_orig[col], col
    assert dev_orig["comm_exposed_ns"] > 0
    # diagnose finds the same exposed communication, with the same severity. (Its host time in
    # collective calls on the critical path is 1.35 ms per step, not 2.03: the outer c10d:: op
    # renamed has no args, only the record_param_comms op inside it does.)
    found = [next(f for f in diagnose(t).findings if f.code == "comm-exposed") for t in (custom, original)]
    assert found[0].severity == found[1].severity
    for key in ("comm_ns", "comm_exposed_ns", "fix"):
        assert found[0].evidence[key] == found[1].evidence[key], key


def test_kernels_of_a_custom_op_on_a_communication_stream_are_communication(tmp_path: Path) -> None:
    """As above, and the broadcasts' ops record no args either (a custom op of an expert-parallel
    library records none): the 6 broadcast kernels were launched under an op that nothing says is
    a collective, but on NCCL's stream, where the 15 all-reduces (by their ops' args) are all the
    rest. The stream decides: they are communication, and the totals are the original's."""
    original = tracewhy.load(shared_trace(DDP))
    custom = tracewhy.load(_custom_comm_copy(tmp_path, drop_args_of="broadcast"))
    rows = kernels(custom).by_name.filter(pl.col("name") == OPAQUE)
    assert {(r["rule"], r["family"], r["count"]) for r in rows.iter_rows(named=True)} == {
        (Rule.COLLECTIVE_ARGS.value, "communication", 15), (Rule.COMM_STREAM.value, "communication", 6)}
    assert _comm_ns(custom) == _comm_ns(original) == 46_876_493
    dev = overlap(custom).devices.filter(pl.col(Col.DEVICE) == 0).row(0, named=True)
    dev_orig = overlap(original).devices.filter(pl.col(Col.DEVICE) == 0).row(0, named=True)
    for col in ("comm_ns", "comm_exposed_ns", "compute_ns"):
        assert dev[col] == dev_orig[col], col
