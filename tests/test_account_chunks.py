"""The step account decides its edges a chunk at a time (``account_parts.DECIDE_CHUNK``) so that a
whole-trace window of a large export does not hold every edge's key columns at once. Chunking
changes nothing: on real traces the account, the parts and items in the order they were
numbered, and each edge's part, item and owner on a whole window are the same with chunks of a
few dozen edges as in one pass."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from conftest import shared_trace
from tracewhy.analyses import account_parts, what_if_removals
from tracewhy.analyses.account import step_account, step_model
from tracewhy.analyses.what_if import window_edges
from tracewhy.analyses.what_if_removals import window_parts
from tracewhy.model.trace import Trace
from tracewhy.readers import read_trace

#: An nsys export (NVTX ranges and runtime calls) and a DDP rank (ops, collectives).
TRACES = ("nsys/nsysai_mfu_2gpu_before.sqlite.gz", "hta/a100_ddp2_rank0_nccl2.17.json.gz")


@functools.cache
def _trace(path: str) -> Trace:
    return read_trace(shared_trace(path))


def _everything(path: str) -> tuple[Any, ...]:
    trace = _trace(path)
    model = step_model(trace)
    account = step_account(trace, model=model)
    rules, g = model.rules, model.graph
    e = model.replay.window(model.paths[0].window_start, model.paths[0].window_end).edges
    part, item, owner = rules.of_edges(g.kind[e].astype(np.int64), g.attr[e], rules.category[e], g.src[e], g.dst[e])
    return (account.parts.rows(), account.per_step.rows(), account.evidence.rows(), list(rules.parts),
            list(rules.items), part.tolist(), item.tolist(), owner.tolist())


@pytest.mark.parametrize("path", TRACES)
def test_small_chunks_give_what_one_pass_gives(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    one_pass = _everything(path)
    monkeypatch.setattr(account_parts, "DECIDE_CHUNK", 37)
    chunked = _everything(path)
    assert chunked == one_pass


def _window_part_names(path: str) -> list[str]:
    model = step_model(_trace(path))
    w = window_edges(model)[0]
    parts = window_parts(w)
    names = [p.name for p in model.rules.parts]
    assert w.in_part(names[int(parts[0])]).sum() == (parts == parts[0]).sum()
    return [names[p] for p in parts.tolist()]


@pytest.mark.parametrize("path", TRACES)
def test_a_windows_parts_in_chunks_are_one_passs(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The what-if predictions decide a window's edges' parts a chunk at a time (each on a model
    of its own, so neither pass finds the other's decisions)."""
    monkeypatch.setattr(what_if_removals, "PART_CHUNK", 1 << 40)
    one_pass = _window_part_names(path)
    monkeypatch.setattr(what_if_removals, "PART_CHUNK", 1000)
    chunked = _window_part_names(path)
    assert len(one_pass) > 3000 and len(set(one_pass)) > 3
    assert chunked == one_pass
