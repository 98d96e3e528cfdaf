"""The arrays a diagnosis holds from the step account to its last prediction keep slice, node and
edge ids and codes as int32 where they fit (``analyses/id_arrays.py``): half their memory on a
large export. Narrowing changes their width, never a value, so the diagnosis must be the same
as with every array left int64; arithmetic on such values (the packed keys of
``distinct_rows``) is done in int64."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import shared_trace

from tracewhy.analyses import (
    account,
    account_host,
    account_parts,
    account_unrecorded,
    critical_path_graph,
    critical_path_replay,
    host_activity,
    host_tree,
)
from tracewhy.analyses.account import step_model
from tracewhy.analyses.account_host import Collectives
from tracewhy.analyses.distinct_rows import distinct_rows
from tracewhy.analyses.id_arrays import narrow
from tracewhy.readers import read_trace

#: An nsys export (NVTX ranges around runtime calls), a DDP rank with activation checkpointing
#: (recompute, collectives in backward) and a trace with Python frames (user-code lines).
TRACES = ("nsys/nsysai_mfu_2gpu_before.sqlite.gz", "tracelens/mi300x_resnet_actckpt_ddp8_rank0.json.gz",
          "hta/a100_ddp2_rank0_nccl2.17.json.gz")
#: The modules that narrow what they keep.
NARROWING = (account, account_host, account_parts, account_unrecorded, critical_path_graph, critical_path_replay,
             host_activity, host_tree)


def test_narrow_keeps_every_value_and_narrows_only_what_fits() -> None:
    fits = np.array([-1, 0, 2**31 - 1, -(2**31)])
    assert narrow(fits).dtype == np.int32
    assert narrow(fits).tolist() == fits.tolist()
    for wide in (np.array([-1, 2**31]), np.array([-(2**31) - 1, 0])):
        assert narrow(wide) is wide
    assert narrow(np.zeros(0, dtype=np.int64)).dtype == np.int32
    already = np.array([3], dtype=np.int32)
    assert narrow(already) is already


def test_packed_keys_of_narrow_columns_do_not_wrap() -> None:
    """Two int32 columns whose packed key passes 2^31: (65536, 0) packs to 65536 * 65536, which
    in int32 wraps to (0, 0)'s key. Packed in int64 the three rows stay three kinds."""
    a = np.array([0, 65536, 0], dtype=np.int32)
    b = np.array([0, 0, 65535], dtype=np.int32)
    first, inverse = distinct_rows([a, b])
    assert first.tolist() == [0, 1, 2]
    assert inverse.tolist() == [0, 1, 2]
    wide_first, wide_inverse = distinct_rows([a.astype(np.int64), b.astype(np.int64)])
    assert (first.tolist(), inverse.tolist()) == (wide_first.tolist(), wide_inverse.tolist())


def test_collectives_read_like_the_list_they_replace() -> None:
    names = Collectives(5)
    names[1] = "all_reduce"
    names[4] = "broadcast"
    as_list = [None, "all_reduce", None, None, "broadcast"]
    for i in range(-5, 5):
        assert names[i] == as_list[i], i
    assert len(names) == 2  # (only the named slices are held)


def _diagnosis(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    from tracewhy.cli import main

    assert main(["diagnose", str(path), "--json", "--no-cache"]) == 0
    return json.dumps(json.loads(capsys.readouterr().out), sort_keys=True)


@pytest.mark.parametrize("relative", TRACES)
def test_the_narrowed_arrays_give_the_diagnosis_of_wide_ones(relative: str, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = shared_trace(relative)
    narrowed = _diagnosis(path, capsys)
    for module in NARROWING:
        monkeypatch.setattr(module, "narrow", lambda values: values.astype(np.int64))
    wide = _diagnosis(path, capsys)
    assert narrowed == wide


@pytest.mark.parametrize("relative", TRACES)
def test_what_the_step_model_holds_is_narrowed(relative: str) -> None:
    trace = read_trace(shared_trace(relative))
    model, tree = step_model(trace), host_tree.HostTree.of(trace)
    rules, ctx = model.rules, model.rules.ctx
    held = {"outer_op": ctx.outer_op, "outer_block": ctx.outer_block, "user_frame": ctx.user_frame,
            "recorded": ctx.recorded, "recompute": ctx.recompute, "launch": rules.launch, "name_code": rules.name_code,
            "gpu_label": rules.gpu_label, "device": rules.first_gpu.device, "node_pid": model.graph.node_pid,
            "host parent": rules.host.parent, "host annotation": rules.host.annotation_ctx,
            "tree parent": tree.parent, "tree depth": tree.depth, "path": model.paths[0].edges}
    assert {name: str(a.dtype) for name, a in held.items()} == dict.fromkeys(held, "int32")
    assert rules.kind_code.dtype == np.int8
    assert len(ctx.collective) < ctx.outer_op.size  # (a name per collective slice, not a slot per slice)
    p = model.paths[0]
    window = model.replay.window(p.window_start, p.window_end)
    assert window.edges.dtype == np.int32
    assert window.edited(p.sink, critical_path_replay.GraphEdit(), p.edges).edges.dtype == np.int32
