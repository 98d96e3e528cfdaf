"""The threads that run the autograd graph (the dependency graph's hand-off edges and the step
account's host contexts both read them)."""

from __future__ import annotations

import polars as pl

from tracewhy.analyses import api_names
from tracewhy.analyses.name_codes import decide
from tracewhy.model.schema import Col, Kind, OpAttrCol
from tracewhy.model.trace import Trace


def backward_threads(trace: Trace) -> frozenset[tuple[int, int]]:
    """(pid, tid) of the threads that run the autograd graph: those running autograd engine
    nodes (``api_names.is_autograd_node``; HTA finds the same thread by "autograd" in names),
    and, in traces of PyTorch before 1.9 that name a node by its function alone
    ("CudnnBatchNormBackward", "torch::autograd::AccumulateGrad"), those whose top-level ops
    carry a non-zero ``Fwd thread id``: functions run for a forward recorded on another thread.
    Found once per Trace, as ``families.classify_kernels`` is: the dependency graph and the step
    account's host contexts both ask (a name test of every distinct host name, ~5 ms on the 2.3 MB
    nsys export)."""
    return trace.kept("_backward_threads", lambda: _backward_threads(trace))


def _backward_threads(trace: Trace) -> frozenset[tuple[int, int]]:
    # The five columns read, not all fifteen (an nsys export's 4.8 M ranges are annotations).
    host = trace.kind_columns((Kind.CPU_OP, Kind.ANNOTATION), Col.ID, Col.NAME, Col.PID, Col.TID, Col.DEPTH)
    names = host.get_column(Col.NAME)
    texts = names.unique().drop_nulls().cast(pl.String).to_list()
    is_node = decide(texts, api_names.is_autograd_node, api_names.PRETESTS[api_names.is_autograd_node], False)
    hits = [n for n, yes in zip(texts, is_node, strict=True) if yes]
    nodes = host.filter(pl.col(Col.NAME).is_in(hits)).select(Col.PID, Col.TID)
    foreign = trace.op_attrs.filter(pl.col(OpAttrCol.FWD_TID) > 0).select(OpAttrCol.ID)
    top = host.filter((pl.col(Col.DEPTH) == 0) & pl.col(Col.ID).is_in(foreign.get_column(OpAttrCol.ID).implode()))
    both = pl.concat([nodes, top.select(Col.PID, Col.TID)]).fill_null(-1).unique()
    return frozenset((int(p), int(t)) for p, t in both.iter_rows())
