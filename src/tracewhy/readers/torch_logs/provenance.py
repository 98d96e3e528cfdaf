"""Which source lines each inductor kernel comes from, read from a ``TORCH_TRACE`` directory
(or one of its logs) or a ``TORCH_LOGS=output_code[,graph_code]`` capture.

Three things written at compile time are joined (torch 2.13's inductor; the names below are
what ``torch/_inductor/graph.py``, ``codegen/wrapper.py``, ``debug.py`` and
``torch/_dynamo/output_graph.py`` write):

- the output code (``inductor_output_code`` payload, or the ``[__output_code]`` log lines): its
  file name, the kernels it defines, and its ``call`` function, whose kernel calls run in the
  order written; before a call or a Triton kernel's definition, ``# Topologically Sorted Source
  Nodes: [a, b]`` names the FX nodes fused (``utils.get_kernel_metadata``; C++ kernels get none)
  and, with ``INDUCTOR_PROVENANCE=1``, ``# [Provenance debug handles] NAME:N`` names the call;
- ``inductor_provenance_tracking_node_mappings`` (``INDUCTOR_PROVENANCE=1``): ``cppCodeToPost``
  maps ``NAME:N`` to the post-grad FX nodes it fuses, for C++ and Triton kernels alike;
- the FX graph dumps (``inductor_post_grad_graph``; ``dynamo_output_graph`` or the
  ``[__graph_code]`` log, whose node names the Source Nodes comments use): each group of nodes
  follows a ``# File: path:LINE in fn, code: text`` comment, and each node's annotation gives
  its shape (``name: "f32[32, 64][64, 1]cpu" = ...``).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from tracewhy.errors import TraceError
from tracewhy.model.kernel_provenance import PROVENANCE_SCHEMA, KernelProvenance, ProvenanceCol
from tracewhy.readers.source import content_head, read_bytes, refuse_special
from tracewhy.readers.torch_trace.lines import iter_torch_trace

#: A TORCH_TRACE log or TORCH_LOGS capture bigger than this is not one job's compile record.
MAX_LOG_BYTES = 512 * 1024**2
#: Warnings kept; the rest are counted.
MAX_WARNINGS = 5

# TORCH_TRACE (torch/_logging/_internal.py, structured logging): a glog prefix, then the JSON
# envelope on one line; its payload, if any, follows as lines that start with a tab.
# TORCH_LOGS lines of one artifact: "V1128 20:03:04.974000 31579 torch/_inductor/graph.py:2722]
# [0/0] [__output_code] text".
_LOG_LINE = re.compile(r"^[VIWEDC]\d{4} [\d:.]+\s+\d+ \S+\] (?:\[(?:!\d+/)?(\d+/\d+)(?:_\d+)?\] )?"
                       r"\[__(output_code|graph_code)\] ?(.*)$")
_WRITTEN_TO = re.compile(r"^Output code written to: (\S+)")
_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.(cpp_pybinding|cpp|triton)\(")
_SOURCE_NODES = re.compile(r"^\s*# (?:Topologically Sorted |Unsorted )?Source Nodes: \[([^\]]*)\]")
_HANDLE = re.compile(r"^\s*# \[Provenance debug handles\] (\w+):(\d+)")
_CALL_DEF = re.compile(r"^(\s*)def call\(")
_CALL = re.compile(r"^\s+(\w+)(\.run)?\(")
_ANY_CALL = re.compile(r"^\s+[\w.]+\(")
_FILE = re.compile(r"^\s*# File: (.+?):(\d+) in ([^,]+), code: (.*)$")
_NODE = re.compile(r'^\s*(\w+): "\w+\[([^\]]*)\]')


@dataclass(frozen=True)
class _Node:
    file: str
    line: int
    function: str
    code: str
    numel: int | None  # elements the node produces; None with a symbolic size


@dataclass
class _Graph:
    """One inductor graph's output code and what names its kernels' nodes and lines."""

    compile_id: str | None
    code: str
    filename: str = ""
    post_nodes: dict[str, _Node] = field(default_factory=dict)  # post-grad graph
    source_nodes: dict[str, _Node] = field(default_factory=dict)  # Dynamo graph (Source Nodes names)
    kernel_to_post: dict[str, list[str]] = field(default_factory=dict)  # cppCodeToPost


@dataclass(frozen=True)
class _Call:
    kernel: str
    cpp_index: int | None
    handle: str | None
    source_nodes: tuple[str, ...]


def read_kernel_provenance(path: Path) -> KernelProvenance:
    """Read a TORCH_TRACE directory, one TORCH_TRACE log, or a TORCH_LOGS capture (plain or gz)."""
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    graphs: list[_Graph] = []
    for f in files:
        refuse_special(f)  # a pipe or device would block the read
        head = content_head(f, 200_000) or b""
        if b"\x00" in head[:65536]:
            raise TraceError(f, "not a TORCH_TRACE or TORCH_LOGS text file (binary data)")
        structured = b'] {"' in head
        graphs += _from_torch_trace(iter_torch_trace(f)) if structured else _from_torch_logs(_text(f))
    if not graphs:
        raise TraceError(path, "no inductor output code in it (capture TORCH_TRACE=DIR, or TORCH_LOGS=output_code)")
    return _provenance(graphs)


def _text(path: Path) -> str:
    return bytes(read_bytes(path, MAX_LOG_BYTES)).decode("utf-8", errors="replace")


def _from_torch_trace(records: Iterable[tuple[dict[str, object], str]]) -> list[_Graph]:
    """Graphs from structured-log records, paired in order within each compile id (a forward
    and a backward graph each log a post-grad graph, a node mapping and an output code)."""
    codes: dict[str | None, list[_Graph]] = defaultdict(list)
    post: dict[str | None, list[dict[str, _Node]]] = defaultdict(list)
    maps: dict[str | None, list[dict[str, list[str]]]] = defaultdict(list)
    dynamo: dict[str | None, dict[str, _Node]] = {}
    for envelope, payload in records:
        cid = _compile_id(envelope)
        artifact = envelope.get("artifact")
        name = artifact.get("name") if isinstance(artifact, dict) else None
        if "inductor_output_code" in envelope:
            meta = envelope["inductor_output_code"]
            filename = meta.get("filename") if isinstance(meta, dict) else None
            codes[cid].append(_Graph(cid, payload, filename=_basename(filename if isinstance(filename, str) else "")))
        elif "dynamo_output_graph" in envelope:
            dynamo[cid] = _fx_nodes(payload)
        elif name == "inductor_post_grad_graph":
            post[cid].append(_fx_nodes(payload))
        elif name == "inductor_provenance_tracking_node_mappings":
            maps[cid].append(_kernel_to_post(payload))
    graphs = []
    for cid, found in codes.items():
        for i, g in enumerate(found):
            g.source_nodes = dynamo.get(cid, {})
            g.post_nodes = post[cid][i] if i < len(post[cid]) else {}
            g.kernel_to_post = maps[cid][i] if i < len(maps[cid]) else {}
            graphs.append(g)
    return graphs


def _from_torch_logs(text: str) -> list[_Graph]:
    """Graphs from TORCH_LOGS lines: each "Output code:" block ends at "Output code written
    to: PATH"; ``graph_code`` blocks give the Dynamo graph of the same compile id."""
    graphs: list[_Graph] = []
    dynamo: dict[str | None, dict[str, _Node]] = defaultdict(dict)
    block: list[str] | None = None
    graph_lines: dict[str | None, list[str]] = defaultdict(list)
    for line in text.splitlines():
        m = _LOG_LINE.match(line)
        if m is None:
            continue
        cid, artifact, rest = m.group(1), m.group(2), m.group(3)
        if artifact == "graph_code":
            graph_lines[cid].append(rest)
            continue
        if rest.startswith("Output code:"):
            block = []
        elif (w := _WRITTEN_TO.match(rest)) is not None:
            if block is not None:
                graphs.append(_Graph(cid, "\n".join(block), filename=_basename(w.group(1))))
            block = None
        elif block is not None:
            block.append(rest)
    for cid, lines in graph_lines.items():
        dynamo[cid] = _fx_nodes("\n".join(lines))
    for g in graphs:
        g.source_nodes = dynamo.get(g.compile_id, {})
    return graphs


def _compile_id(envelope: dict[str, object]) -> str | None:
    frame, compile_ = envelope.get("frame_id"), envelope.get("frame_compile_id")
    return f"{frame}/{compile_}" if isinstance(frame, int) and isinstance(compile_, int) else None


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _kernel_to_post(payload: str) -> dict[str, list[str]]:
    try:
        doc = json.loads(payload)
    except ValueError:
        return {}
    mapping = doc.get("cppCodeToPost") if isinstance(doc, dict) else None
    if not isinstance(mapping, dict):
        return {}
    return {str(k): [str(n) for n in v] for k, v in mapping.items() if isinstance(v, list)}


def _fx_nodes(code: str) -> dict[str, _Node]:
    """Each annotated node of an FX graph's readable code with the "# File:" line above it (a
    blank line ends a group: the nodes after it have no known line until the next comment)."""
    nodes: dict[str, _Node] = {}
    where: tuple[str, int, str, str] | None = None
    for line in code.splitlines():
        if not line.strip():
            where = None
            continue
        if (f := _FILE.match(line)) is not None:
            where = (f.group(1), int(f.group(2)), f.group(3).strip(), f.group(4).strip())
            continue
        if where is not None and (n := _NODE.match(line)) is not None:
            nodes.setdefault(n.group(1), _Node(*where, numel=_numel(n.group(2))))
    return nodes


def _numel(dims: str) -> int | None:
    parts = [d.strip() for d in dims.split(",") if d.strip()]
    if not all(p.isdigit() for p in parts):
        return None
    return math.prod(int(p) for p in parts)


def _calls(code: str) -> tuple[list[_Call], list[str]]:
    """The kernel calls of ``call`` in order, with the nodes and handle written before each."""
    kinds: dict[str, str] = {}
    definition_nodes: dict[str, tuple[str, ...]] = {}
    pending: tuple[str, ...] = ()
    lines = code.splitlines()
    body_start = None
    for i, line in enumerate(lines):
        if (s := _SOURCE_NODES.match(line)) is not None:
            pending = _names(s.group(1))
        elif (d := _KERNEL_DEF.match(line)) is not None:
            kinds[d.group(1)] = d.group(2)
            definition_nodes[d.group(1)] = pending
            pending = ()
        elif (c := _CALL_DEF.match(line)) is not None:
            body_start = (i + 1, len(c.group(1)))
            break
    calls: list[_Call] = []
    if body_start is None:
        return calls, list(kinds)
    start, indent = body_start
    nodes: tuple[str, ...] = ()
    handle = None
    cpp = 0
    for line in lines[start:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        if (s := _SOURCE_NODES.match(line)) is not None:
            nodes = _names(s.group(1))
        elif (h := _HANDLE.match(line)) is not None:
            handle = h.group(2)
        elif (c := _CALL.match(line)) is not None and c.group(1) in kinds:
            kernel = c.group(1)
            is_cpp = kinds[kernel] != "triton"
            calls.append(_Call(kernel, cpp if is_cpp else None, handle, nodes or definition_nodes.get(kernel, ())))
            cpp += is_cpp
            nodes, handle = (), None
        elif _ANY_CALL.match(line) is not None:  # an extern kernel's call takes the comment above it
            nodes, handle = (), None
    return calls, list(kinds)


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _provenance(graphs: list[_Graph]) -> KernelProvenance:
    rows: list[dict[str, object]] = []
    warnings: list[str] = []
    n_calls = 0
    for g in graphs:
        calls, _ = _calls(g.code)
        n_calls += len(calls)
        for call in calls:
            mapped = g.kernel_to_post.get(f"{call.kernel}:{call.handle}") if call.handle else None
            known = [g.post_nodes[n] for n in mapped if n in g.post_nodes] if mapped else \
                [g.source_nodes[n] for n in call.source_nodes if n in g.source_nodes]
            if not known:
                warnings.append(f"{call.kernel} in {g.filename or 'an output code'}: no source line "
                                "(C++ kernels name their nodes only with INDUCTOR_PROVENANCE=1 in a TORCH_TRACE "
                                "capture; Triton kernels need the FX graph: TORCH_TRACE, or TORCH_LOGS=graph_code)")
                continue
            rows += _line_rows(g, call, known)
    table = pl.DataFrame(rows, schema=PROVENANCE_SCHEMA, orient="row") if rows else pl.DataFrame(
        schema=PROVENANCE_SCHEMA)
    kept = tuple(warnings[:MAX_WARNINGS]) + ((f"{len(warnings) - MAX_WARNINGS} more kernels without a source "
                                               "line",) if len(warnings) > MAX_WARNINGS else ())
    return KernelProvenance(table=table, kernels=n_calls, warnings=kept,
                            graphs=tuple(sorted({g.filename for g in graphs if g.filename})))


def _line_rows(g: _Graph, call: _Call, nodes: list[_Node]) -> list[dict[str, object]]:
    """One row per source line of the call's nodes; weights by elements produced when every
    node's shape is known, else by node count."""
    by_numel = all(n.numel is not None for n in nodes) and sum(n.numel or 0 for n in nodes) > 0
    work: dict[tuple[str, int, str, str], list[float]] = {}
    for n in nodes:
        entry = work.setdefault((n.file, n.line, n.function, n.code), [0, 0.0])
        entry[0] += 1
        entry[1] += float(n.numel or 0) if by_numel else 1.0
    total = sum(w for _, w in work.values())
    return [{ProvenanceCol.GRAPH: g.filename, ProvenanceCol.COMPILE_ID: g.compile_id,
             ProvenanceCol.KERNEL: call.kernel, ProvenanceCol.CALL: call.cpp_index,
             ProvenanceCol.FILE: file, ProvenanceCol.LINE: line, ProvenanceCol.FUNCTION: function,
             ProvenanceCol.CODE: code, ProvenanceCol.NODES: int(count), ProvenanceCol.WEIGHT: weight / total}
            for (file, line, function, code), (count, weight) in work.items()]
