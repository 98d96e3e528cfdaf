"""The host index (analyses/host_activity.py) holds one small array per host slice: on a large
nsys export it is the largest thing a diagnosis keeps, so kinds a trace lacks cost no array."""

from __future__ import annotations

import numpy as np
import pytest

import tracewhy
from conftest import shared_trace
from nsys_support import load
from tracewhy.analyses.host_activity import Flag, build_host_index
from tracewhy.model.schema import Col, Kind


def test_contexts_of_kinds_an_nsys_export_lacks_are_one_shared_value() -> None:
    t = load("nsysai_mfu_2gpu_before")
    assert t.of_kind(Kind.CPU_OP).height == 0 and t.of_kind(Kind.PYTHON).height == 0
    host = build_host_index(t)
    for ctx in (host.op_ctx, host.python_ctx):
        assert ctx.shape == host.ids.shape and not ctx.flags.writeable and ctx.strides == (0,)
        assert (ctx == -1).all()
    # Annotations are there: their context is a real array, each annotation its own innermost.
    ann = host.is_kind(Kind.ANNOTATION)
    assert host.annotation_ctx.strides == (host.annotation_ctx.itemsize,)  # (a real array: int32 where ids fit)
    assert (host.annotation_ctx[ann] == host.ids[ann]).all()
    assert host.depth.dtype == np.int32
    # So is a flag no slice carries (no DataLoader in this capture), in both of its tables.
    for table in (host.self_flag, host.on_stack):
        assert not table[Flag.DATALOADER].flags.writeable and not table[Flag.DATALOADER].any()
    assert host.self_flag[Flag.SYNC].any() and host.on_stack[Flag.SYNC].flags.writeable


@pytest.mark.parametrize("rel", ["hta/v100_ddp2_rank1_memprofile.json.gz"])
def test_kineto_op_context_is_the_innermost_op_above(rel: str) -> None:
    t = tracewhy.load(shared_trace(rel))
    host = build_host_index(t)
    ops = host.is_kind(Kind.CPU_OP)
    assert ops.any() and host.op_ctx.flags.writeable
    assert (host.op_ctx[ops] == host.ids[ops]).all()
    # A launch call's op context is its nearest CPU-op ancestor, checked up the parent links.
    parents = t.slices.get_column(Col.PARENT).fill_null(-1).to_numpy()
    kinds = t.slices.get_column(Col.KIND)
    is_op = (kinds == Kind.CPU_OP.value).to_numpy()
    runtime = np.flatnonzero(host.is_kind(Kind.RUNTIME))[:200]
    for row in runtime.tolist():
        cur = int(parents[host.ids[row]])
        while cur >= 0 and not is_op[cur]:
            cur = int(parents[cur])
        assert host.op_ctx[row] == cur
