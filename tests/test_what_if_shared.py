"""What the predictions share per window and per step model changes no number: each edge's part
decided once (``StepModel.edge_parts``) is the part ``PartRules.of_edges`` gives it, in any order
and after the account's paths were remembered; a fix's edit made once per window
(``WindowEdges.edit_of``) replays as on a fresh window; DropSync's and HideCollective's edits,
built from what they share per window, select the edges their definitions name (computed here
over every edge of the window, as the edits did before)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import shared_trace
from tracewhy.analyses import api_names
from tracewhy.analyses.account import StepModel, step_account, step_model
from tracewhy.analyses.account_parts import CATEGORY_CODE
from tracewhy.analyses.critical_path_edges import Edge
from tracewhy.analyses.critical_path_walk import Category
from tracewhy.analyses.what_if import predict, suggested_edits, window_edges
from tracewhy.analyses.what_if_edits import DropSync, HideCollective
from tracewhy.analyses.what_if_window import WindowEdges
from tracewhy.readers import read_trace

#: An nsys export (blocking syncs under ops) and a DDP rank (NCCL collectives in backward).
TRACES = ("nsys/nsysai_mfu_2gpu_before.sqlite.gz", "hta/a100_ddp2_rank0_nccl2.17.json.gz")


@pytest.fixture(scope="module", params=TRACES)
def model(request: pytest.FixtureRequest) -> StepModel:
    return step_model(read_trace(shared_trace(request.param)))


def _of_edges(m: StepModel, e: np.ndarray) -> np.ndarray:
    g, rules = m.graph, m.rules
    return rules.of_edges(g.kind[e].astype(np.int64), g.attr[e], rules.category[e], g.src[e], g.dst[e])[0]


def test_an_edges_part_decided_once_is_of_edges_part(model: StepModel) -> None:
    m = step_model(model.trace)  # a model of its own: nothing decided yet
    step_account(m.trace, model=m)  # remembers the measured paths' parts
    w = window_edges(m)[0]
    rng = np.random.default_rng(3)
    shuffled = rng.permutation(w.ids)
    got = _names(m, m.edge_parts.of(shuffled, chunk=997))
    # (Parts by name: each model numbers its parts in the order it meets them.)
    assert got == _names(model, _of_edges(model, shuffled))
    assert _names(m, m.edge_parts.of(w.ids)) == _names(m, _of_edges(m, w.ids)) == _names(model, _of_edges(model, w.ids))
    assert len(set(got)) > 3


def _names(m: StepModel, part: np.ndarray) -> list[str]:
    names = [p.name for p in m.rules.parts]
    return [names[i] for i in part.tolist()]


def test_edits_made_once_per_window_replay_as_on_a_fresh_window(model: StepModel) -> None:
    account = step_account(model.trace, model=model)
    fixes = suggested_edits(model, account)[:3]
    assert len(fixes) >= 2
    shared = window_edges(model)
    for f in fixes:
        predict(model, [f], shared)
    together = predict(model, fixes, shared)
    fresh = predict(model, fixes, window_edges(model))
    assert together == fresh
    assert together.changed


def _old_drop_sync(w: WindowEdges, under: str | None) -> tuple[set[int], set[int]]:
    """DropSync's edges as the edit selected them over every edge of the window."""
    ctx = w.model.rules.ctx
    sync = (w.kind == int(Edge.SYNC)) & (w.attr >= 0)
    in_call = (w.kind == int(Edge.HOST)) & (w.category == CATEGORY_CODE[Category.SYNC])
    calls = np.unique(w.attr[sync | in_call])
    blocking = [int(c) for c in calls.tolist() if api_names.is_sync_call(ctx.name(int(c)))]
    own_copy = w.model.rules.launch[w.model.graph.node_slice[w.src]] == w.attr
    chosen = sync & (np.isin(w.attr, blocking) | own_copy)
    inside = (w.kind == int(Edge.HOST)) & np.isin(w.attr, blocking)
    if under is not None:
        outer = ctx.outer_op[np.maximum(w.attr, 0)]
        named = [o for o in np.unique(outer).tolist() if o >= 0 and ctx.name(int(o)) == under]
        chosen &= np.isin(outer, named)
        inside &= np.isin(outer, named)
    return set(w.ids[chosen].tolist()), set(w.ids[inside].tolist())


def test_drop_sync_selects_the_edges_its_definition_names(model: StepModel) -> None:
    w = window_edges(model)[0]
    ctx = model.rules.ctx
    sync = (w.kind == int(Edge.SYNC)) & (w.attr >= 0)
    outers = {ctx.name(int(o)) for o in np.unique(ctx.outer_op[np.maximum(w.attr[sync], 0)]).tolist() if o >= 0}
    unders: list[str | None] = [None, *sorted(outers)[:3], "no such op"]
    for under in unders:
        edit = w.edit_of(DropSync(under))
        assert (set(edit.drop.tolist()), set(edit.scaled.tolist())) == _old_drop_sync(w, under)
    assert window_edges(model)[0].edit_of(DropSync(None)).drop.size > 0 or not sync.any()


def test_hide_collective_per_collective_is_as_on_a_fresh_window(model: StepModel) -> None:
    """Each collective's edit, made after the others on one window, is the edit a fresh window
    makes for it alone."""
    names = sorted({c for c in model.rules.ctx.collective if c})[:3]
    shared = window_edges(model)[0]
    for name in [None, *names]:
        a, b = shared.edit_of(HideCollective(name)), window_edges(model)[0].edit_of(HideCollective(name))
        for field in ("drop", "scaled", "factor", "add_src", "add_dst", "add_weight", "add_kind", "add_attr"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), (name, field)
