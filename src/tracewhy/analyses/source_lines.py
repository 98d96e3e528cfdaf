"""Python source lines behind host slices: frame names parsed into (file, line, function) and
user/library code, and ``line_of`` for findings to name a line (the host nesting they walk is
``host_tree.HostTree``).

With ``with_stack`` the profiler names a frame ``file.py(N): function``, N being where the
function starts (``co_firstlineno``), or the line being run when the profiler started for a
frame already open then. PyTorch <= 1.9 wrote a ``Call stack`` arg on each op instead
(innermost entry first, each the line being run). ``LineKind`` says which of these a line is,
so that a def line is never named as the line of a call.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt
import polars as pl

from tracewhy.analyses.host_tree import HostTree
from tracewhy.model.schema import Col, OpAttrCol
from tracewhy.model.trace import Trace

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
B = npt.NDArray[np.bool_]


class LineKind:
    """What the line number of a frame is. torch's Python tracer keeps the caller's line of each
    call in memory but writes none to the trace (torch 2.6 and 2.13 checked: a
    ``python_function`` event has its name, ``Python id``, ``Python parent id`` and, for a
    module, ``Python module id``), so the line of a call is only known where the trace wrote
    the line being run."""

    CALL: Final = "call"  # the line of the call toward the work: a Call stack entry, or a frame
    #                       open when the profiler started, toward its child open then
    DEF: Final = "def"  # where the function starts: a frame entered while the profiler ran
    AT_START: Final = "at_start"  # the line run when the profiler started (a prof.step() or
    #                               `with profile` line), not the call toward the work under it
    COMPILED: Final = "compiled"  # a line of user code whose FX nodes a compiled kernel fuses
    #                               (from the compile logs): the kernel's time is put on it


#: LineKind as small integers in arrays, in this order.
_KINDS: Final = (LineKind.CALL, LineKind.DEF, LineKind.AT_START)
_CALL, _DEF, _AT_START = range(len(_KINDS))


class SourceLine(NamedTuple):
    """A Python source line a finding can name, with what its number is (``LineKind``)."""

    file: str
    line: int
    function: str
    kind: str = LineKind.CALL


# "path/to/file.py(123): func" (with_stack frames and legacy Call stack entries).
_SOURCE = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<function>.+)$")
# The first path part of a library that torch >= 2.x writes relative to sys.path.
_LIBRARY_ROOTS: Final = frozenset({
    "torch", "torchvision", "torchaudio", "torchtext", "functorch", "triton", "numpy", "scipy", "pandas",
    "transformers", "accelerate", "datasets", "tokenizers", "huggingface_hub", "safetensors", "deepspeed",
    "apex", "lightning", "pytorch_lightning", "lightning_fabric", "timm", "einops", "fairscale", "xformers",
    "flash_attn", "vllm", "sglang", "PIL", "tqdm", "typing_extensions", "sympy", "jinja2", "filelock",
    "fsspec", "networkx", "packaging", "_pytest", "pytest", "pluggy", "google", "absl", "jax", "optree",
    "flashinfer", "torchao", "peft", "bitsandbytes", "liger_kernel", "aiter", "ray", "zmq", "cv2", "sklearn",
    "tensorflow", "keras", "onnxruntime", "torch_tensorrt", "pydantic", "msgspec", "requests", "urllib3",
})
# "<built-in method mul_ of Tensor object at 0x7f7ba8820280>": the object's address differs per run.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>$")
# Installed packages, the standard library, and code without a file (<frozen ...>, <string>: exec).
_LIBRARY_DIRS = re.compile(r"(^|/)(site-packages|dist-packages)/|(^|/)lib/python\d+(\.\d+)?/|^<")


def parse_frame(name: str) -> tuple[str, int, str, bool]:
    """(file, line, function, user) of a frame name. A builtin call (``<built-in method item of
    Tensor object>``) or a module scope (``nn.Module: Linear_0``) has no file: line 0, not user."""
    m = _SOURCE.match(name)
    if m is None:
        return "", 0, _ADDRESS.sub(">", name), False
    path = m.group("file").replace("\\", "/")
    return path, int(m.group("line")), m.group("function"), not is_library(path)


def is_library(path: str) -> bool:
    """Installed packages, the standard library and code without a file; for the relative paths
    torch >= 2 writes (relative to sys.path, so site-packages is gone), a first part naming the
    standard library or a common ML library. Anything else is the user's code."""
    if _LIBRARY_DIRS.search(path):
        return True
    if path.startswith("/"):  # an absolute path outside any Python installation: the user's
        return False
    top = path.split("/", 1)[0].removesuffix(".py")
    return top in _LIBRARY_ROOTS or top in sys.stdlib_module_names


def _per_tree(name: str, trace: Trace, tree: HostTree, compute: Callable[[], B]) -> B:
    """``compute()`` once per (trace, tree): a diagnosis asks for the same frames from several
    rules (a source line per finding, the step account), each a pass over every Python frame's
    name. Kept on the tree, read-only, as ``Trace.of_kind`` keeps its tables on the trace."""
    kept: dict[tuple[str, int], B] = tree.__dict__.setdefault("_per_tree", {})
    key = (name, id(trace.slices))
    if key not in kept:
        value = compute()
        value.flags.writeable = False
        kept[key] = value
    return kept[key]


def running_at_start(trace: Trace, tree: HostTree) -> B:
    """Python frames that were already open when the profiler started (``_running_at_start``,
    once per trace and tree)."""
    return _per_tree("running_at_start", trace, tree, lambda: _running_at_start(trace, tree))


def _running_at_start(trace: Trace, tree: HostTree) -> B:
    """Python frames that were already open when the profiler started. The tracer records each
    thread's stack as it starts, outermost frame first, before it is installed (torch's
    ``PythonTracer::start``), so on a thread they are its leading chain: its first root frame,
    that frame's first child, and so on while each is a frame of source code (a builtin call is
    only recorded once the tracer runs: it ends the chain). A thread's chain counts only if it
    starts before the first slice that follows a chain: a thread started later has none open.
    A chain ends before a frame whose name (line included) is also a frame outside the chains:
    a function entered while profiling is named by its def line, which no line running inside
    it repeats, so such a frame was entered, not found (a trace cut from a longer one). The
    chain can run on into the profiler's own first calls (torch code, never the user's)."""
    n = tree.parent.size
    running = np.zeros(n, dtype=bool)
    py = np.flatnonzero(tree.is_python)
    if py.size == 0:
        return running
    names = trace.slices.get_column(Col.NAME).gather(py).cast(pl.String)
    sourced = [u for u in names.unique().drop_nulls().to_list() if parse_frame(u)[1] > 0]
    has_source = np.zeros(n, dtype=bool)
    has_source[py[names.is_in(sourced).to_numpy()]] = True
    child = np.flatnonzero(tree.parent >= 0)
    order = child[np.lexsort((child, tree.ts[child], tree.parent[child]))]
    parents, first = np.unique(tree.parent[order], return_index=True)
    first_child = np.full(n, -1, dtype=np.int64)
    first_child[parents] = order[first]
    s = trace.slices
    host_roots = np.flatnonzero((tree.depth >= 0) & (tree.parent < 0))
    roots = (pl.DataFrame({"id": host_roots, "pid": s.get_column(Col.PID).gather(host_roots),
                           "tid": s.get_column(Col.TID).gather(host_roots), "ts": tree.ts[host_roots]})
             .sort("ts", "id").unique(["pid", "tid"], keep="first", maintain_order=True).get_column("id").to_list())
    chains: list[tuple[int, list[int]]] = []
    first_after = np.iinfo(np.int64).max
    for root in roots:
        chain, at = [], root
        while at >= 0 and has_source[at]:
            chain.append(at)
            at = int(first_child[at])
        if chain:
            chains.append((root, chain))
        if chain and at >= 0:
            first_after = min(first_after, int(tree.ts[at]))
    for root, chain in chains:
        if tree.ts[root] < first_after:
            running[chain] = True
    if running.any():
        chained = running[py]
        entered = names.filter(~pl.Series(chained)).unique().to_list()
        repeated = np.zeros(n, dtype=bool)
        repeated[py[chained & names.is_in(entered).to_numpy()]] = True
        running &= ~(tree.nearest(repeated) >= 0)
    return running


def call_stacks(trace: Trace) -> pl.DataFrame:
    """Slices with a non-empty legacy ``Call stack``: id and the text."""
    return trace.op_attrs.select(OpAttrCol.ID, OpAttrCol.CALL_STACK).filter(
        pl.col(OpAttrCol.CALL_STACK).is_not_null() & (pl.col(OpAttrCol.CALL_STACK) != ""))


def line_of(trace: Trace, slice_ids: list[int] | I64, *, within: bool = False,
            tree: HostTree | None = None) -> SourceLine | None:
    """The user source line behind these host slices, for a finding to name; None when no user
    frame is found (no ``with_stack``, or only library code).

    ``within=False`` (a sync, a launch, a slow op): the innermost user frame above each slice,
    the one above the most of their time. ``within=True`` (a DataLoader fetch, a block): the user
    frame inside them with the most self time, else the one above. Legacy ``Call stack``
    traces: the innermost user entry of the stacks at or above (inside) the slices. ``kind``
    says what the number is: with ``with_stack`` it is mostly where the function starts, the
    calling line being nowhere in the trace. ``tree``: the trace's ``HostTree``, when the caller has it.
    """
    ids = np.asarray(slice_ids, dtype=np.int64)
    if ids.size == 0:
        return None
    tree = tree if tree is not None else HostTree.of(trace)
    chosen = np.zeros(tree.parent.size, dtype=bool)
    chosen[ids] = True
    inside = tree.nearest(chosen) >= 0
    if tree.is_python.any():
        user = _user_frames(trace, tree)
        owner = tree.nearest(user)
        running = running_at_start(trace, tree)
        votes_at, weight = owner[ids], np.maximum(tree.dur[ids], 1)
        # A frame open at the start names the line it was running: the call toward the work
        # only when that work is under its child open then (a deeper frame open at the start).
        deepest_running = tree.nearest(running)[ids]
        toward_child = running[np.maximum(votes_at, 0)] & (deepest_running != votes_at)
        kinds = np.where(toward_child, _CALL, _kind_codes(running, votes_at))
        if within:
            frames = np.flatnonzero(user & inside)
            if frames.size:
                votes_at, weight = frames, _user_self_ns(tree, user, owner, frames)
                kinds = _kind_codes(running, frames)
        keep = votes_at >= 0
        if not keep.any():
            return None
        name, kind = _heaviest(trace, votes_at[keep], weight[keep], kinds[keep])
        return _source(parse_frame(name), kind)
    stacked = call_stacks(trace)
    has = np.zeros(tree.parent.size, dtype=bool)
    has[stacked.get_column(OpAttrCol.ID).to_numpy()] = True
    at = tree.nearest(has)[ids]
    if within and (has & inside).any():
        at = np.flatnonzero(has & inside & (tree.nearest(has & inside, strict=True) < 0))
    at = at[at >= 0]
    text = dict(zip(stacked.get_column(OpAttrCol.ID).to_list(), stacked.get_column(OpAttrCol.CALL_STACK).to_list(),
                    strict=True))
    votes: dict[tuple[str, int, str, bool], float] = {}
    for op, w in zip(at.tolist(), np.maximum(tree.dur[at], 1).tolist(), strict=True):
        entry = next((p for e in text[op].split(";") if (p := parse_frame(e))[3]), None)
        if entry is not None:
            votes[entry] = votes.get(entry, 0.0) + w
    return _source(max(votes, key=lambda k: votes[k]), LineKind.CALL) if votes else None


class WindowSelfCol:
    """Columns of ``user_self_by_window``: per window and user frame, the frames' self time."""

    WINDOW: Final = "window"  # the window's index in the starts/ends given
    FILE: Final = "file"
    LINE: Final = "line"
    FUNCTION: Final = "function"
    KIND: Final = "kind"  # LineKind of the line
    SELF: Final = "self_ns"


WINDOW_SELF_SCHEMA: Final = pl.Schema({
    WindowSelfCol.WINDOW: pl.Int64(), WindowSelfCol.FILE: pl.String(), WindowSelfCol.LINE: pl.Int64(),
    WindowSelfCol.FUNCTION: pl.String(), WindowSelfCol.KIND: pl.String(), WindowSelfCol.SELF: pl.Int64(),
})


def user_self_by_window(trace: Trace, starts: I64, ends: I64) -> pl.DataFrame:
    """Per window [starts[i], ends[i]) (sorted by start) and user frame (WINDOW_SELF_SCHEMA): the
    self time (time less the user frames directly below, as ``line_of(within=True)`` weighs
    them) of the frames that start in the window. Empty without ``python_function`` frames: a
    legacy ``Call stack`` has no frame durations."""
    tree = HostTree.of(trace)
    empty = pl.DataFrame(schema=WINDOW_SELF_SCHEMA)
    if not tree.is_python.any() or starts.size == 0:
        return empty
    user = _user_frames(trace, tree)
    frames = np.flatnonzero(user)
    window = np.searchsorted(starts, tree.ts[frames], side="right") - 1
    inside = (window >= 0) & (tree.ts[frames] < ends[np.maximum(window, 0)])
    frames, window = frames[inside], window[inside]
    if frames.size == 0:
        return empty
    names = trace.slices.get_column(Col.NAME).gather(frames).cast(pl.String)
    kinds = _kind_codes(running_at_start(trace, tree), frames)
    per_name = (pl.DataFrame({"window": window, "name": names, "kind": kinds,
                              "self_ns": _user_self_ns(tree, user, tree.nearest(user), frames)})
                .group_by("window", "name", "kind").agg(pl.col("self_ns").sum()))
    parsed = [parse_frame(n) for n in per_name.get_column("name").to_list()]
    return pl.DataFrame({
        WindowSelfCol.WINDOW: per_name.get_column("window"), WindowSelfCol.FILE: [p[0] for p in parsed],
        WindowSelfCol.LINE: [p[1] for p in parsed], WindowSelfCol.FUNCTION: [p[2] for p in parsed],
        WindowSelfCol.KIND: [_KINDS[k] for k in per_name.get_column("kind").to_list()],
        WindowSelfCol.SELF: per_name.get_column("self_ns"),
    }, schema=WINDOW_SELF_SCHEMA).sort(WindowSelfCol.WINDOW, WindowSelfCol.FILE, WindowSelfCol.LINE,
                                       WindowSelfCol.FUNCTION, WindowSelfCol.KIND)


def _user_frames(trace: Trace, tree: HostTree) -> B:
    """Which slices are Python frames of user code (once per trace and tree)."""
    return _per_tree("user_frames", trace, tree, lambda: _find_user_frames(trace, tree))


def _find_user_frames(trace: Trace, tree: HostTree) -> B:
    py = np.flatnonzero(tree.is_python)
    names = trace.slices.get_column(Col.NAME).gather(py).cast(pl.String)
    user_names = [u for u in names.unique().to_list() if parse_frame(u)[3]]
    user = np.zeros(tree.parent.size, dtype=bool)
    user[py[names.is_in(user_names).to_numpy()]] = True
    return user


def _user_self_ns(tree: HostTree, user: B, owner: I64, frames: I64) -> I64:
    """Each of these user frames' time less that of the user frames whose nearest user frame
    above is it (``owner``: tree.nearest(user)); every user frame below counts, not just ``frames``."""
    every = np.flatnonzero(user)
    up = np.where(tree.parent[every] >= 0, owner[np.maximum(tree.parent[every], 0)], -1)
    below = np.bincount(up[up >= 0], weights=tree.dur[every][up >= 0], minlength=tree.parent.size)
    self_ns: I64 = np.maximum(tree.dur[frames] - below[frames].astype(np.int64), 0)
    return self_ns


def _kind_codes(running: B, frames: I64) -> I64:
    """A frame's line as its name gives it: the line run at the start for a frame open then,
    else where its function starts."""
    codes: I64 = np.where(running[np.maximum(frames, 0)], _AT_START, _DEF).astype(np.int64)
    return codes


def _heaviest(trace: Trace, frames: I64, weight: I64, kinds: I64) -> tuple[str, str]:
    """The frame name and LineKind (of these frame slices) with the most weight in all."""
    names = trace.slices.get_column(Col.NAME).gather(frames).cast(pl.String)
    by_name = pl.DataFrame({"name": names, "kind": kinds, "w": weight})
    top = by_name.group_by("name", "kind").agg(pl.col("w").sum()).sort(
        ["w", "name", "kind"], descending=[True, False, False]).row(0, named=True)
    return str(top["name"]), _KINDS[int(top["kind"])]


def _source(parsed: tuple[str, int, str, bool], kind: str = LineKind.CALL) -> SourceLine:
    return SourceLine(file=parsed[0], line=parsed[1], function=parsed[2], kind=kind)
