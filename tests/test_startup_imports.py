"""A command imports only what it uses: ``which`` reads no trace, so it never imports
polars or numpy; a ``--json`` run, or ``check``'s plain lines, print no table, so they never
import rich; a command that runs no rule never imports the rules; a trace served from the cache
imports no reader. Each case runs the command in a fresh interpreter and reads the modules it
ended with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import shared_trace

#: Runs ``tracewhy.cli.main`` on its arguments, output swallowed, and prints the exit code and
#: every module the interpreter holds at the end.
PROBE = """
import contextlib, io, json, sys
from tracewhy.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""
TRACE = "hta/tracecompare_tiny_base_rank1.json.gz"


def loaded(*argv: str) -> set[str]:
    """The modules a fresh interpreter holds after ``tracewhy ARGV`` (which must succeed)."""
    env = {**os.environ, "TRACEWHY_NO_CACHE": "1"}  # a cache hit would take another path
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env, check=True)
    doc = json.loads(proc.stdout.splitlines()[-1])
    assert doc["code"] == 0, proc.stderr
    return set(doc["modules"])


def test_which_reads_no_trace_and_imports_no_polars() -> None:
    text = loaded("which", "idle")
    assert not {"polars", "numpy", "tracewhy.readers", "tracewhy.model"} & text
    assert "rich" in text  # its table is drawn: the probe sees what a command imports
    assert not {"polars", "numpy", "rich"} & loaded("which", "--json")


@pytest.mark.parametrize("argv", [
    ("diagnose", "{trace}", "--json"),
    ("gaps", "{trace}", "--json"),
    ("steps", "{trace}", "--json"),
    ("kernels", "{trace}", "--json"),
    ("check", "{trace}", "--max-gpu-idle", "100%"),  # plain lines, no table
])
def test_output_without_a_table_imports_no_rich(argv: tuple[str, ...]) -> None:
    trace = str(shared_trace(TRACE))
    modules = loaded(*(a.format(trace=trace) for a in argv))
    assert "polars" in modules  # it read the trace
    assert not {"rich", "duckdb", "matplotlib"} & modules


def test_gaps_imports_no_rules() -> None:
    modules = loaded("gaps", str(shared_trace(TRACE)), "--json")
    assert "tracewhy.analyses.gaps" in modules
    assert not {"tracewhy.reports.diagnose", "tracewhy.findings.idle", "tracewhy.findings.host"} & modules


#: What a diagnosis needs beyond steps, gaps and blocks: its rules, the step account and its
#: dependency graph, the what-if replays, and the comparison of two runs.
DIAGNOSIS_ONLY = {"tracewhy.reports.diagnose", "tracewhy.findings.idle", "tracewhy.analyses.account",
                  "tracewhy.analyses.critical_path_graph", "tracewhy.analyses.what_if", "tracewhy.reports.diff"}


@pytest.mark.parametrize("argv", [
    ("check", "{trace}", "--max-gpu-idle", "100%", "--max-step-p50", "10s"),
    ("blocks", "{trace}", "--json"),
    ("overlap", "{trace}", "--json"),
])
def test_a_command_that_needs_no_diagnosis_imports_none(argv: tuple[str, ...]) -> None:
    # The diagnosis context imports the step account and the replays where they are asked for;
    # check's metrics import the rules, memory, compile and the baseline's comparison likewise.
    modules = loaded(*(a.format(trace=str(shared_trace(TRACE))) for a in argv))
    assert "tracewhy.findings.context" in modules  # it measured through the diagnosis' context
    assert not DIAGNOSIS_ONLY & modules
    assert "tracewhy.analyses.memory" not in modules


def test_check_imports_what_its_metrics_measure_with() -> None:
    trace = str(shared_trace(TRACE))
    modules = loaded("check", trace, "--max-high-findings", "100", "--baseline", trace)
    assert {"tracewhy.reports.diagnose", "tracewhy.analyses.account", "tracewhy.reports.diff"} <= modules


def test_ranks_on_small_files_starts_no_pool() -> None:
    pair = [str(shared_trace(f"hta/sampled_128rank_job_rank{r}.json.gz")) for r in (0, 1)]
    modules = loaded("ranks", *pair, "--json")
    assert "tracewhy.analyses.rank_compare" in modules
    assert not {"concurrent.futures.process", "rich"} & modules


#: Reads a trace through the cache in ``argv[2]`` (any size is cached) and prints every module
#: the interpreter then holds.
CACHED_READ = """
import json, sys
from pathlib import Path
from tracewhy.model.cache import CacheOptions
from tracewhy.readers import read_trace
read_trace(sys.argv[1], cache=CacheOptions(directory=Path(sys.argv[2]), min_bytes=0))
print(json.dumps(sorted(sys.modules)))
"""


def test_a_cached_read_imports_no_reader(tmp_path: Path) -> None:
    def read() -> set[str]:
        argv = [sys.executable, "-c", CACHED_READ, str(shared_trace(TRACE)), str(tmp_path)]
        env = {k: v for k, v in os.environ.items() if k != "TRACEWHY_NO_CACHE"}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
        return set(json.loads(done.stdout.splitlines()[-1]))

    assert "tracewhy.readers.kineto.reader" in read()  # parsed, and stored
    formats = [m for m in read() if m.startswith("tracewhy.readers.") and m.count(".") >= 3]
    assert formats == []  # served from the cache: no format's module, not even a sniff
