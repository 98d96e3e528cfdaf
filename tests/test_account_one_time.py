"""A step a one-time recompile made slow is no steady step: the step account and its predictions
leave it out and say so, while a recompile in every step stays a per-step cost. On real CPU
captures made by scripts/gen_traces/compile_traces.py; the expected step times are read from the
raw ProfilerStep events."""

from __future__ import annotations

import gzip
import json
import statistics

import pytest

from conftest import GENERATED
from tracewhy.analyses.account import step_account
from tracewhy.cli import main
from tracewhy.readers import read_trace


def _raw_steps(case: str) -> dict[str, float]:
    """ProfilerStep name -> duration in µs, from the raw JSON."""
    with gzip.open(GENERATED / f"{case}.pt.trace.json.gz", "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    return {e["name"]: float(e["dur"]) for e in events
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")}


def test_a_one_time_recompile_step_is_left_out_of_the_account() -> None:
    raw = _raw_steps("cpu_compile_recompile_once")
    # The plan: the batch size changes once, in ProfilerStep#2; that step holds the recompile.
    slow = max((n for n in raw if n != "ProfilerStep#0"), key=raw.__getitem__)  # #0: warm-up
    assert slow == "ProfilerStep#2" and raw[slow] > 1e6  # over a second, in µs
    a = step_account(read_trace(GENERATED / "cpu_compile_recompile_once.pt.trace.json.gz"))
    assert [s.name for s in a.one_time] == ["ProfilerStep#2"]
    assert a.one_time[0].compile_ns > 0.5 * a.one_time[0].window_ns
    # The mean step is that of the other steady steps (#0 is warm-up), not 8 s spread over six.
    others = [d for n, d in raw.items() if n not in ("ProfilerStep#0", slow)]
    assert a.mean_step_ns < 3 * statistics.median(others) * 1e3
    assert "ProfilerStep#2" not in a.windows.get_column("step").cast(str).to_list()
    assert a.note and "one-time compile" in a.note
    compiling = a.parts.filter(a.parts.get_column("kind") == "compilation")
    assert compiling.is_empty() or float(compiling.get_column("share").sum()) < 0.5


@pytest.mark.parametrize("case", ["cpu_compile_recompile_every", "cpu_compile_item_every"])
def test_a_recompile_in_every_step_stays_in_the_account(case: str) -> None:
    a = step_account(read_trace(GENERATED / f"{case}.pt.trace.json.gz"))
    assert a.one_time == ()
    compiling = a.parts.filter(a.parts.get_column("kind") == "compilation")
    assert float(compiling.get_column("share").sum()) > 0.5


def test_diagnose_names_the_step_it_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", str(GENERATED / "cpu_compile_recompile_once.pt.trace.json.gz")]) == 0
    out = capsys.readouterr().out
    where = next(line for line in out.splitlines() if line.startswith("Where the step goes"))
    assert "left out as one-time compiles: ProfilerStep#2" in where
    # The steps' own statistics keep that step, and the line above says so.
    stats = next(line for line in out.splitlines() if "steady steps: duration" in line)
    assert "ProfilerStep#2 included: a one-time compile" in stats
    assert "compilation" not in out.split("Where the step goes", 1)[1].split("\n2.", 1)[0]


def test_a_branch_compiled_once_is_no_per_step_spike(capsys: pytest.CaptureFixture[str]) -> None:
    """compile_traces.py's branch case: step 3 takes the other side of a data-dependent branch
    for the first time and compiles its resume function (a new compile id, so no recompile
    finding claims it). The raw file says step 3 is seconds long and the others about a
    millisecond; the account leaves it out as a one-time compile, and the spikes rule must not
    then charge its compile to every step: it had, as the whole replayed step recoverable
    ('~930.9 µs per step', high) and the first cause of the diagnosis."""
    raw = _raw_steps("cpu_compile_branch_once")
    others = [d for n, d in raw.items() if n not in ("ProfilerStep#0", "ProfilerStep#3")]
    assert raw["ProfilerStep#3"] > 100 * max(others)
    path = GENERATED / "cpu_compile_branch_once.pt.trace.json.gz"
    assert [s.name for s in step_account(read_trace(path)).one_time] == ["ProfilerStep#3"]
    assert main(["diagnose", str(path), "--json", "--no-cache"]) == 0
    findings = json.loads(capsys.readouterr().out)["findings"]
    spikes = [f for f in findings if f["code"] == "step-time-spikes"]
    assert all(f["recoverable_ns_per_step"] == 0 and 3 not in f["evidence"]["spike_steps"] for f in spikes), spikes
    first_cause = next(f for f in findings if f["severity"] != "trust")
    assert first_cause["code"] != "step-time-spikes"
