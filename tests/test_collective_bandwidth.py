"""Bus bandwidth per collective call: NCCL's formula (nccl-tests doc/PERFORMANCE.md), checked on
every shared trace whose collectives carry message sizes against a computation made here from the
raw JSON (each NCCL kernel, the record_param_comms op of the same external id, its element counts
and dtype), and the link it is held against."""

from __future__ import annotations

import functools
import gzip
import json
import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import tracewhy as tw
from conftest import shared_trace
from tracewhy.analyses.collective_bandwidth import bandwidth_by_size, bus_factor, message_bytes
from tracewhy.analyses.collectives import collectives
from tracewhy.analyses.overlap import overlap
from tracewhy.analyses.peaks import peer_link
from tracewhy.findings import thresholds as th
from tracewhy.findings.codes import Code
from tracewhy.findings.collective_bandwidth import slow_bus_findings

#: Every shared trace whose collective calls record "In msg nelems" and whose NCCL kernels were
#: captured (hta/v100_rank0_displayTimeUnit_ns_fractional_us has sizes but no NCCL kernel).
SIZED = ("hta/a100_ddp2_rank0_nccl2.17.json.gz", "tracelens/b200_vllm_eager_tp8_rank0.json.gz",
         "tracelens/mi300x_resnet_actckpt_ddp8_rank0.json.gz")
_WIDTH = {"Float": 4, "BFloat16": 2, "Half": 2, "Long": 8, "Double": 8, "Int": 4, "Byte": 1}


def _expected_busbw(args: dict[str, Any], dur_us: float) -> float | None:
    """Bus bandwidth of one call, written out from nccl-tests' *_perf.cu GetBw functions."""
    name = args["Collective name"].lower().replace("_", "")
    n = args["Group size"]
    width = _WIDTH[args["dtype"]]
    in_b, out_b = args["In msg nelems"] * width, args["Out msg nelems"] * width
    seconds = dur_us * 1e-6
    if n < 2:
        return None
    if "allreduce" in name:
        return in_b / seconds * 2 * (n - 1) / n
    if "allgather" in name:  # count * typesize * nranks: the whole gathered output
        return out_b / seconds * (n - 1) / n
    if "reducescatter" in name or "alltoall" in name:
        return in_b / seconds * (n - 1) / n
    if "broadcast" in name:
        return in_b / seconds
    raise AssertionError(f"no formula written here for {name}")


@functools.cache
def _trace(path: Path) -> tw.Trace:
    """Each trace read once for the module (a Trace never changes)."""
    return tw.load(path)


@functools.cache
def _raw(path: Path) -> dict[str, Any]:
    with gzip.open(path) as f:
        out: dict[str, Any] = json.load(f)
    return out


def _raw_calls(path: Path) -> list[tuple[int, float, dict[str, Any]]]:
    """(kernel start in ns, kernel duration in µs, record_param_comms args) per NCCL kernel."""
    events = _raw(path)["traceEvents"]
    params = {e["args"]["External id"]: e["args"] for e in events
              if e.get("name") == "record_param_comms" and "In msg nelems" in e.get("args", {})}
    out = []
    for e in events:
        if e.get("cat") == "kernel" and e["name"].startswith("nccl"):
            a = params.get(e.get("args", {}).get("External id"))
            if a is not None and a["Collective name"] not in ("wait", "barrier"):
                out.append((round(e["ts"] * 1000), e["dur"], a))
    return out


@pytest.fixture(scope="module", params=SIZED)
def sized(request: pytest.FixtureRequest) -> tuple[Path, pl.DataFrame]:
    path = shared_trace(request.param)
    return path, collectives(_trace(path)).table


def test_bus_bandwidth_is_nccls_formula_on_every_sized_trace(sized: tuple[Path, pl.DataFrame]) -> None:
    path, table = sized
    raw = _raw_calls(path)
    assert raw, "the trace holds NCCL kernels with record_param_comms sizes"
    by_start = {s: r for s, r in zip(table.get_column("start_ns").to_list(), table.iter_rows(named=True),
                                     strict=True)}
    checked = 0
    for start, dur_us, args in raw:
        row = by_start.get(start) or by_start.get(start - 1) or by_start.get(start + 1)
        assert row is not None, f"no call starts with the kernel at {start} ns"
        if row["kernels"] != 1:
            continue
        expected = _expected_busbw(args, dur_us)
        got = row["busbw_bytes_per_s"]
        assert expected is not None and got is not None
        assert math.isclose(got, expected, rel_tol=2e-3), (args["Collective name"], got, expected)
        checked += 1
    assert checked >= 1


def test_the_link_is_the_devices_gpu_to_gpu_link(sized: tuple[Path, pl.DataFrame]) -> None:
    path, table = sized
    names = {p["name"] for p in _raw(path)["deviceProperties"]}
    sized_rows = table.filter(pl.col("busbw_bytes_per_s").is_not_null())
    links = set(zip(sized_rows.get_column("link").to_list(), sized_rows.get_column("link_bytes_per_s").to_list(),
                    strict=True))
    [name] = names
    link = peer_link(name)
    assert link is not None and links == {(link.name, link.bytes_per_s)}


def test_a_group_of_one_crosses_no_link() -> None:
    assert bus_factor("all_reduce", 1) is None
    assert bus_factor("broadcast", 1) is None


@pytest.mark.parametrize(("op", "n", "factor"), [
    ("all_reduce", 8, 14 / 8), ("all_reduce", 2, 1.0), ("all_gather", 8, 7 / 8), ("reduce_scatter", 4, 3 / 4),
    ("all_to_all", 16, 15 / 16), ("broadcast", 8, 1.0), ("send", 2, 1.0), ("recv", 2, 1.0), ("reduce", 8, 1.0),
    ("barrier", 8, None),
])
def test_bus_factors_are_nccl_tests(op: str, n: int, factor: float | None) -> None:
    assert bus_factor(op, n) == factor


def test_message_size_follows_nccl_tests() -> None:
    # All-gather's input is one rank's share (b200 trace: In 25136, Out 201088 of 8 ranks).
    assert message_bytes("all_gather", 25136, 201088, "BFloat16") == 402176
    assert message_bytes("reduce_scatter", 201088, 25136, "BFloat16") == 402176
    assert message_bytes("all_reduce", 2049000, 2049000, "Float") == 8196000
    assert message_bytes("recv", 0, 1024, "Half") == 2048
    assert message_bytes("all_reduce", 10, 10, "NoSuchType") is None
    assert message_bytes("all_reduce", -8, -8, "Float") is None and message_bytes("broadcast", 0, 0, "Float") is None


# --- the diagnose finding --------------------------------------------------------------------

def _raw_busbw(path: Path, collective: str, min_bytes: int) -> list[tuple[int, float, float]]:
    """(message bytes, bus bytes/s, kernel µs) of each raw NCCL kernel of ``collective`` whose
    message is ``min_bytes`` or more."""
    out = []
    for _, dur_us, a in _raw_calls(path):
        nbytes = max(a["In msg nelems"], a["Out msg nelems"]) * _WIDTH[a["dtype"]]
        busbw = _expected_busbw(a, dur_us)
        if a["Collective name"] == collective and nbytes >= min_bytes and busbw is not None:
            out.append((nbytes, busbw, dur_us))
    return out


@pytest.fixture(scope="module")
def a100_diagnosis() -> tuple[Path, tw.Report]:
    path = shared_trace(SIZED[0])
    return path, tw.diagnose(_trace(path))


def test_large_all_reduces_far_below_nvlink_are_a_finding(a100_diagnosis: tuple[Path, tw.Report]) -> None:
    path, report = a100_diagnosis
    raw = _raw_busbw(path, "allreduce", th.COLL_LARGE_MESSAGE_BYTES)
    assert raw, "the trace has all-reduces of 4 MiB and more"
    [f] = [f for f in report.findings if f.code == Code.COLLECTIVE_SLOW_BUS]
    e = f.evidence
    assert (e["op"], e["group_size"], e["link"]) == ("all_reduce", 2, "NVLink 3")
    assert e["link_bytes_per_s"] == 300e9  # A100 SXM: NVLink 600 GB/s both ways
    # The finding's bus bandwidth is the time-weighted mean of calls computed here from the raw JSON.
    per_call = [b for _, b, _ in raw]
    assert min(per_call) <= e["busbw_bytes_per_s"] <= max(per_call)
    assert e["busbw_bytes_per_s"] < th.COLL_SLOW_BUS_SHARE * e["link_bytes_per_s"]
    assert e["calls"] <= len(raw) and e["min_msg_bytes"] >= th.COLL_LARGE_MESSAGE_BYTES
    assert f"{e['busbw_bytes_per_s'] / 1e9:.1f} GB/s" in f.statement and "waiting" in f.statement


def test_small_messages_are_no_finding_however_slow(sized: tuple[Path, pl.DataFrame]) -> None:
    _, table = sized
    small = table.filter(pl.col("msg_bytes") < th.COLL_LARGE_MESSAGE_BYTES)
    slow = small.filter(pl.col("busbw_bytes_per_s") < th.COLL_SLOW_BUS_SHARE * pl.col("link_bytes_per_s"))
    assert slow.height, "every sized trace has small calls far below the link (latency-bound)"
    assert slow_bus_findings(bandwidth_by_size(small), steps=1) == []


def test_overlap_shows_bandwidth_per_message_size(a100_diagnosis: tuple[Path, tw.Report]) -> None:
    path, _ = a100_diagnosis
    rows = overlap(_trace(path)).bandwidth.filter(pl.col("op") == "all_reduce")
    assert rows.height >= 2
    raw: dict[int, list[float]] = {}
    for nbytes, busbw, _ in _raw_busbw(path, "allreduce", 0):
        raw.setdefault(nbytes, []).append(busbw)
    for row in rows.iter_rows(named=True):
        calls = raw[row["msg_bytes"]]
        assert row["calls"] <= len(calls)
        assert min(calls) * 0.999 <= row["busbw_bytes_per_s"] <= max(calls) * 1.001
        assert row["link_share"] == pytest.approx(row["busbw_bytes_per_s"] / 300e9)


def test_the_step_account_gives_communication_kernels_their_message_and_bus_bandwidth() -> None:
    from tracewhy.analyses.account import step_account

    path = shared_trace(SIZED[2])  # MI300X DDP: its all-reduce kernels hold the step's critical path
    ev = step_account(_trace(path)).evidence.filter(
        (pl.col("part") == "communication: all_reduce") & pl.col("item").str.starts_with("ncclDevKernel"))
    [row] = ev.to_dicts()
    raw = _raw_busbw(path, "allreduce", 0)
    sizes = {nbytes for nbytes, _, _ in raw}
    assert min(b for _, b, _ in raw) <= row["gb_per_s"] * 1e9 <= max(b for _, b, _ in raw)
    # Per step: the messages of the calls whose kernels the path ran through, over the steps.
    assert any(row["bytes_per_step"] * k in {a + b for a in sizes | {0} for b in sizes} for k in (1, 2, 3))
