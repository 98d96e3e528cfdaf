"""Compiled kernels traced back to source lines (``lines --logs``). The generated capture plants one
slow line among cheap ones in a compiled forward (``scripts/gen_traces/provenance_traces.py``);
which kernel is the planted line's, and how long its runs took, is worked out here from the
output code text and the raw trace events, not from tracewhy."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import polars as pl
import pytest

import tracewhy
from conftest import GENERATED, ROOT
from tracewhy.analyses.account import AccountCol
from tracewhy.analyses.lines import LineCol, LinesResult
from tracewhy.analyses.ops import OpCol
from tracewhy.analyses.source_lines import LineKind
from tracewhy.cli import main
from tracewhy.errors import TraceError
from tracewhy.model.kernel_provenance import ProvenanceCol
from tracewhy.model.trace import Trace
from tracewhy.readers.torch_logs.provenance import read_kernel_provenance
from tracewhy.readers.torch_trace.lines import iter_torch_trace
from tracewhy.reports.account import AccountReportOptions, account_report
from tracewhy.reports.lines import LinesReportOptions, lines_report
from tracewhy.reports.ops import OpsReportOptions, ops_report

TRACE = GENERATED / "cpu_provenance.pt.trace.json.gz"
TORCH_TRACE = GENERATED / "cpu_provenance.torch_trace.log.gz"
OUTPUT_CODE_LOG = GENERATED / "cpu_provenance.output_code.txt.gz"
SCRIPT = ROOT / "scripts" / "gen_traces" / "provenance_traces.py"
#: The generator as the trace's frames name it (relative to sys.path, its directory); the FX
#: graph's "# File:" says scripts/gen_traces/provenance_traces.py.
TRACED_FILE = "provenance_traces.py"


def _planted_line() -> int:
    """The line of the generator that carries the planted comment (read from the file)."""
    numbered = enumerate(SCRIPT.read_text(encoding="utf-8").splitlines(), 1)
    (line,) = [n for n, text in numbered if "# the planted slow line" in text and "=" in text]
    return line


def _cpp_calls_in_output_code() -> list[str]:
    """The C++ kernels ``call`` runs, in order, read from the TORCH_LOGS=output_code text."""
    text = gzip.decompress(OUTPUT_CODE_LOG.read_bytes()).decode()
    body = [re.sub(r"^.*\[__output_code\] ?", "", line) for line in text.splitlines() if "[__output_code]" in line]
    defined = {m.group(1) for line in body if (m := re.match(r"^(cpp_fused_\w+) = async_compile", line))}
    start = next(i for i, line in enumerate(body) if line.strip().startswith("def call("))
    return [m.group(1) for line in body[start:] if (m := re.match(r"^\s+(\w+)\(", line)) and m.group(1) in defined]


def _kernel_frame_durations_ns() -> list[list[int]]:
    """Per run of the compiled graph's ``call`` frame, its ``<built-in function kernel>`` frames'
    durations in time order, from the raw JSON (containment in time on the same thread)."""
    events = json.loads(gzip.decompress(TRACE.read_bytes()))["traceEvents"]
    frames = [e for e in events if e.get("cat") == "python_function"]
    calls = [e for e in frames if re.search(r"\.py\(\d+\): call$", e["name"]) and "inductor_cache" in e["name"]]
    kernels = [e for e in frames if e["name"] == "<built-in function kernel>"]
    runs = []
    for c in calls:
        inside = sorted((k for k in kernels if c["tid"] == k["tid"] and c["ts"] <= k["ts"] <= c["ts"] + c["dur"]),
                        key=lambda k: k["ts"])
        runs.append([round(k["dur"] * 1000) for k in inside])
    return runs


@pytest.fixture(scope="module")
def trace() -> Trace:
    loaded = tracewhy.load(TRACE)
    loaded.check()
    return loaded


@pytest.fixture(scope="module")
def with_logs(trace: Trace) -> LinesResult:
    return lines_report(trace, LinesReportOptions(logs=TORCH_TRACE))


@pytest.fixture(scope="module")
def without_logs(trace: Trace) -> LinesResult:
    return lines_report(trace)


def _compiled_rows(r: LinesResult) -> pl.DataFrame:
    return r.table.filter(pl.col(LineCol.LINE_KIND) == LineKind.COMPILED)


def test_planted_line_gets_its_kernel_time(with_logs: LinesResult) -> None:
    calls = _cpp_calls_in_output_code()
    slow = next(i for i, name in enumerate(calls) if "sin" in name and "cos" in name and "sum" in name)
    runs = _kernel_frame_durations_ns()
    assert len(runs) == 3 and all(len(r) == len(calls) for r in runs)
    slow_ns = sum(r[slow] for r in runs)
    rows = _compiled_rows(with_logs).sort(LineCol.HOST_SELF, descending=True)
    top = rows.row(0, named=True)
    assert (top[LineCol.FILE], top[LineCol.LINE], top[LineCol.FUNCTION]) == (TRACED_FILE, _planted_line(), "forward")
    assert top[LineCol.CALLS] == 3
    # The planted kernel also fuses the relu and +1 of the line before (2 of its 7 nodes, 1% of
    # the elements): the planted line keeps at least 95% of that kernel's time, and no more.
    assert 0.95 * slow_ns <= top[LineCol.HOST_SELF] <= slow_ns
    assert top[LineCol.HOST_SELF] > 10 * rows.row(1, named=True)[LineCol.HOST_SELF]
    assert with_logs.compiled_kernel_runs == with_logs.compiled_attributed == 3 * len(calls)


def test_kernel_time_moves_from_the_forward_frame(with_logs: LinesResult, without_logs: LinesResult) -> None:
    """Every kernel's time leaves the frame it ran under and is split among its lines: the
    lines' compiled time adds up to the kernel frames' time, and the frame loses exactly that."""
    kernels_ns = sum(sum(r) for r in _kernel_frame_durations_ns())
    assert _compiled_rows(without_logs).height == 0
    compiled = _compiled_rows(with_logs)
    assert abs(compiled.get_column(LineCol.HOST_SELF).sum() - kernels_ns) <= compiled.height
    assert sorted(compiled.get_column(LineCol.LINE).to_list()) == [_planted_line() + d for d in (-1, 0, 1, 2)]

    def forward_self(r: LinesResult) -> int:
        row = r.table.filter((pl.col(LineCol.FUNCTION) == "forward") & (pl.col(LineCol.LINE_KIND) == LineKind.DEF))
        return int(row.get_column(LineCol.HOST_SELF).item())

    assert forward_self(without_logs) - forward_self(with_logs) == kernels_ns


def test_the_torch_trace_reader_pairs_envelopes_and_payloads() -> None:
    text = gzip.decompress(TORCH_TRACE.read_bytes()).decode()
    records = list(iter_torch_trace(TORCH_TRACE))
    codes = [(e, p) for e, p in records if "inductor_output_code" in e]
    assert len(codes) == 1 and "def call(" in codes[0][1]
    assert sum(1 for line in text.splitlines() if not line.startswith("\t") and '] {"' in line) == len(records)


def test_output_code_alone_names_kernels_but_no_lines() -> None:
    """TORCH_LOGS=output_code: C++ kernels carry no Source Nodes comment, so no line is claimed;
    the warning says what capture gives them."""
    provenance = read_kernel_provenance(OUTPUT_CODE_LOG)
    assert provenance.kernels == len(_cpp_calls_in_output_code())
    assert provenance.table.height == 0
    assert any("INDUCTOR_PROVENANCE=1" in w for w in provenance.warnings)


def test_source_nodes_comments_and_fx_graph_give_triton_lines(tmp_path: Path) -> None:
    """The GPU route: a Triton kernel's definition carries ``# Topologically Sorted Source
    Nodes`` (torch/_inductor/utils.py get_kernel_metadata); the Dynamo graph the same compile
    id logs under graph_code gives each node's "# File:" line and shape."""
    prefix = "V1128 20:00:00.000000 1 torch/_inductor/graph.py:1] [0/0] [__output_code] "
    gprefix = "V1128 20:00:00.000000 1 torch/_dynamo/output_graph.py:1] [0/0] [__graph_code] "
    code = ["Output code: ",
            "# Topologically Sorted Source Nodes: [relu, h], Original ATen: [aten.relu, aten.add]",
            "triton_poi_fused_add_relu_0 = async_compile.triton('triton_poi_fused_add_relu_0', '''",
            "''')", "def call(args):", "    arg0_1, = args",
            "    # Topologically Sorted Source Nodes: [relu, h], Original ATen: [aten.relu, aten.add]",
            "    stream0 = get_raw_stream(0)",
            "    triton_poi_fused_add_relu_0.run(arg0_1, buf0, 2048, stream=stream0)",
            "    return (buf0, )", ""]
    graph = ["TRACED GRAPH", "    def forward(self, L_x_: \"f32[32, 64][64, 1]cuda:0\"):",
             "        # File: /home/u/model.py:12 in forward, code: h = torch.relu(x) + 1.0",
             "        relu: \"f32[32, 64][64, 1]cuda:0\" = torch.relu(l_x_)",
             "        h: \"f32[32, 64][64, 1]cuda:0\" = relu + 1.0", ""]
    log = tmp_path / "run.log"
    log.write_text("\n".join([*(gprefix + g for g in graph), *(prefix + c for c in code),
                              prefix + "Output code written to: /tmp/torchinductor_u/ab/cabc.py"]) + "\n")
    table = read_kernel_provenance(log).table
    assert table.select(ProvenanceCol.KERNEL, ProvenanceCol.GRAPH, ProvenanceCol.CALL, ProvenanceCol.FILE,
                        ProvenanceCol.LINE, ProvenanceCol.NODES, ProvenanceCol.WEIGHT).rows() == [
        ("triton_poi_fused_add_relu_0", "cabc.py", None, "/home/u/model.py", 12, 2, 1.0)]


def test_cli_lines_with_logs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lines", str(TRACE), "--logs", str(TORCH_TRACE), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    top = next(r for r in doc["lines"] if r["line_kind"] == LineKind.COMPILED)
    assert (top["file"], top["line"]) == (TRACED_FILE, _planted_line())
    assert doc["compiled_kernel_runs"] == doc["compiled_attributed"] == 6


def test_bad_logs_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\x00\x01" * 100)
    empty = tmp_path / "empty.log"
    empty.write_text("no compile here\n")
    for bad in (binary, empty, tmp_path / "missing.log"):
        assert main(["lines", str(TRACE), "--logs", str(bad)]) not in (0, 70)
        err = capsys.readouterr().err
        assert str(bad.name) in err and "Traceback" not in err
    with pytest.raises(TraceError):
        read_kernel_provenance(empty)


def test_the_trace_is_the_compiled_run(trace: Trace) -> None:
    """One Torch-Compiled Region per profiled step: the forward ran compiled, not eagerly."""
    names = trace.slices.get_column("name").cast(pl.String)
    assert names.str.starts_with("Torch-Compiled Region").sum() == 3


def test_step_account_names_the_planted_line(trace: Trace) -> None:
    """The account's host part for a compiled kernel frame is named by its largest line; per
    step it is that kernel's time in the analysed (steady) steps, from the raw events, and the
    few microseconds of Python around the frame that the path's host edge (between two
    recorded ops, named by what is open at its midpoint) also spans."""
    calls = _cpp_calls_in_output_code()
    slow = next(i for i, name in enumerate(calls) if "sin" in name and "cos" in name and "sum" in name)
    before = account_report(trace).account.parts
    after = account_report(trace, AccountReportOptions(logs=TORCH_TRACE)).account.parts
    planted = f"host: provenance_traces.py:{_planted_line()} forward (compiled)"
    assert not before.get_column(AccountCol.PART).str.contains("(compiled)", literal=True).any()
    top = after.sort(AccountCol.NS_PER_STEP, descending=True).row(0, named=True)
    assert top[AccountCol.PART] == planted
    steady = _kernel_frame_durations_ns()[1:]  # step #0 of the three is warm-up
    expected = sum(r[slow] for r in steady) / len(steady)
    assert expected <= top[AccountCol.NS_PER_STEP] <= 1.05 * expected


def test_ops_lists_compiled_kernels_with_their_line(trace: Trace) -> None:
    """Each compiled kernel is an ops row named with its largest line, holding its frames'
    time, which the graph call op it ran under gives up."""
    calls = _cpp_calls_in_output_code()
    runs = _kernel_frame_durations_ns()
    before = ops_report(trace).table
    after = ops_report(trace, OpsReportOptions(logs=TORCH_TRACE)).table
    slow = next(i for i, name in enumerate(calls) if "sin" in name and "cos" in name and "sum" in name)
    row = after.filter(pl.col(OpCol.NAME) == f"{calls[slow]} (provenance_traces.py:{_planted_line()} forward)")
    assert row.get_column(OpCol.CALLS).item() == 3
    assert row.get_column(OpCol.CPU_SELF).item() == sum(r[slow] for r in runs)
    graph_call = pl.col(OpCol.NAME).str.starts_with("## Call CompiledFxGraph")
    given_up = before.filter(graph_call).get_column(OpCol.CPU_SELF).item() - \
        after.filter(graph_call).get_column(OpCol.CPU_SELF).item()
    assert given_up == sum(sum(r) for r in runs)
    assert after.get_column(OpCol.CPU_SELF).sum() == before.get_column(OpCol.CPU_SELF).sum()


def test_kernel_runs_without_a_line_are_counted(trace: Trace) -> None:
    """With only TORCH_LOGS=output_code, the C++ kernels are found (their graph's call frame)
    but none has a line: 6 runs, 0 traced, and the time stays on def forward."""
    r = lines_report(trace, LinesReportOptions(logs=OUTPUT_CODE_LOG))
    assert (r.compiled_kernel_runs, r.compiled_attributed) == (3 * len(_cpp_calls_in_output_code()), 0)
    assert _compiled_rows(r).height == 0
    log = gzip.decompress(OUTPUT_CODE_LOG.read_bytes()).decode()
    (written,) = set(re.findall(r"Output code written to: \S+/(\S+\.py)", log))
    assert read_kernel_provenance(OUTPUT_CODE_LOG).graphs == (written,)


def test_compiled_lines_take_the_traces_spelling_of_a_file(trace: Trace, tmp_path: Path) -> None:
    """Dynamo writes a user file as it saw it (often absolute); the trace's frames name it
    relative to sys.path: a compiled line is named as the trace names its file."""
    text = gzip.decompress(TORCH_TRACE.read_bytes()).decode().replace(
        "# File: scripts/gen_traces/", "# File: /home/someone/checkout/scripts/gen_traces/")
    log = tmp_path / "torch_trace.log"
    log.write_text(text)
    files = set(_compiled_rows(lines_report(trace, LinesReportOptions(logs=log))).get_column(LineCol.FILE))
    assert files == {TRACED_FILE}
    assert "# File: scripts/gen_traces/provenance_traces.py:" in gzip.decompress(TORCH_TRACE.read_bytes()).decode()
