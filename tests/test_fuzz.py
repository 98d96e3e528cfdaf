"""Fuzzing: real traces of every format, mutated (tests/fuzzing.py), through the reader and the
main commands in this process. Whatever the damage, tracewhy either reads the file (and the
Trace passes ``check()``) or refuses it with its own one-line error: no other exception, no
exit 70, no traceback.

Derandomized with a fixed number of examples so CI sees the same inputs every run and stays
within its budget; ``python scripts/fuzz.py --minutes 30`` is the long, random run.

The fuzz tests are marked ``slow``: the plain ``python -m pytest -q`` (CI) runs them,
``python -m pytest -m "not slow"`` is the quick run without them. Their budget is 90 s together
on a 2-core machine, and the example counts below are set to it from the CPU time one example
costs (the reader and the commands in this process, plus the reader's helper processes): about
0.4 s for an nsys table mutation, 0.25-0.3 s for a Kineto structure, cut or byte mutation,
0.03-0.05 s for the rest. Measured on a 2-core machine shared with other jobs: the seven
together took 45-50 s of CPU each run, so about that on a quiet machine; 60-80 s wall at load
5-6.5, 108 s at load 9-13. With the former counts (150/120/100/100/60/200/30): 143 s of CPU,
238 s wall at load 5-9.
"""

from __future__ import annotations

import gzip
import os
import random
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

import tracewhy.cli.commands.kernels as kernels_command
import tracewhy.reports.kernels as kernels_report
from conftest import TRACES, shared_trace
from fuzzing import (
    BYTE_MUTATORS,
    SEEDS,
    Seed,
    mutate,
    mutate_kineto_doc,
    mutate_ncu_csv,
    mutate_sqlite_db,
    seed_bytes,
)
from fuzzing_run import Outcome, check_read, run_cli, run_input
from tracewhy.errors import TraceError
from tracewhy.model.trace import ModelError, Trace

TRACE_COMMANDS = [("info",), ("kernels",), ("diagnose",), ("gaps",), ("overlap",)]
NCU_COMMANDS = [("roofline",), ("roofline", "--json", "--launches")]

#: Small seeds of each kind: the first three Kineto traces, the mock nsys export, two CSVs, one report.
KINETO = [s for s in SEEDS if s.kind == "kineto"][:3]
NSYS = [s for s in SEEDS if s.kind == "nsys"][:1]
NCU_CSV = [s for s in SEEDS if s.kind == "ncu-csv"]
NCU_REP = [s for s in SEEDS if s.kind == "ncu-rep"][:1]

#: No shrinking: the inputs come from a seeded random mutator, so a shrunk example says little
#: more than the failing one, and shrinking would cost minutes of the CI budget.
_NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
_FUZZ = settings(derandomize=True, deadline=None, database=None, print_blob=True, phases=_NO_SHRINK,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fuzz(examples: int) -> settings:
    """Derandomized settings with a fixed number of examples (the CI budget is set here)."""
    return settings(_FUZZ, max_examples=examples)


_ORIGINALS: dict[Seed, bytes] = {}


def _original(seed: Seed) -> bytes:
    if seed not in _ORIGINALS:
        shared_trace(seed.relative)  # skips when ../shared is absent
        _ORIGINALS[seed] = seed_bytes(seed, TRACES)
    return _ORIGINALS[seed]


def _run(seed: Seed, data: bytes, suffix: str, commands: list[tuple[str, ...]], steps: object) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="tracewhy-fuzz-") as tmp:
        path = Path(tmp) / f"input{suffix}"
        path.write_bytes(data)
        outcome = run_input(path, seed.format, TRACES / seed.relative, commands, random.Random(len(data)))
    assert outcome.verdict != "internal", f"{seed.relative} after {steps}:\n" + "\n---\n".join(outcome.problems)
    event(outcome.verdict)  # --hypothesis-show-statistics shows how many were read, warned, refused
    return outcome


@pytest.fixture(autouse=True)
def _shared() -> None:
    shared_trace(KINETO[0].relative)


@pytest.mark.slow
@fuzz(50)
@given(seed=st.sampled_from(KINETO), rng=st.randoms(use_true_random=False), gz=st.booleans(),
       steps=st.integers(1, 3))
def test_kineto_structure(seed: Seed, rng: random.Random, gz: bool, steps: int) -> None:
    """Type swaps, deleted fields, extreme numbers, reordered and duplicated events, top-level fields."""
    data, done = mutate_kineto_doc(_original(seed), rng, steps)
    _run(seed, gzip.compress(data) if gz else data, ".json.gz" if gz else ".json", TRACE_COMMANDS, done)


@pytest.mark.slow
@fuzz(30)
@given(seed=st.sampled_from(KINETO), share=st.floats(0, 1), gz=st.booleans())
def test_kineto_truncated_anywhere(seed: Seed, share: float, gz: bool) -> None:
    """A trace cut at any byte, of the JSON text or of its gzip stream."""
    data = gzip.compress(_original(seed), mtime=0) if gz else _original(seed)
    cut = round(share * len(data))
    _run(seed, data[:cut], ".json.gz" if gz else ".json", [("info",), ("diagnose",)], f"cut at {cut}")


@pytest.mark.slow
@fuzz(25)
@given(seed=st.sampled_from(KINETO), rng=st.randoms(use_true_random=False), gz=st.booleans())
def test_kineto_bytes(seed: Seed, rng: random.Random, gz: bool) -> None:
    """Flipped, deleted, repeated and inserted bytes, in the text or in its gzip stream."""
    data = gzip.compress(_original(seed), mtime=0) if gz else _original(seed)
    mutator = rng.choice(BYTE_MUTATORS)
    data, what = mutator(data, rng)
    _run(seed, data, ".json.gz" if gz else ".json", [("info",), ("kernels",), ("gaps",)], what)


@pytest.mark.slow
@fuzz(30)
@given(seed=st.sampled_from(NSYS), rng=st.randoms(use_true_random=False), steps=st.integers(1, 3))
def test_nsys_tables(seed: Seed, rng: random.Random, steps: int) -> None:
    """NULLs, wrong types, extreme and reversed times, dropped tables and columns, lost strings."""
    data, done = mutate_sqlite_db(_original(seed), rng, steps)
    _run(seed, data, ".sqlite", TRACE_COMMANDS, done)


@pytest.mark.slow
@fuzz(40)
@given(seed=st.sampled_from(NSYS), rng=st.randoms(use_true_random=False), gz=st.booleans())
def test_nsys_bytes(seed: Seed, rng: random.Random, gz: bool) -> None:
    """A damaged database file: truncated or with flipped bytes, plain or gzip."""
    data = gzip.compress(_original(seed), compresslevel=1, mtime=0) if gz else _original(seed)
    mutator = rng.choice(BYTE_MUTATORS)
    data, what = mutator(data, rng)
    _run(seed, data, ".sqlite.gz" if gz else ".sqlite", [("info",), ("diagnose",)], what)


@pytest.mark.slow
@fuzz(100)
@given(seed=st.sampled_from(NCU_CSV), rng=st.randoms(use_true_random=False), steps=st.integers(1, 3))
def test_ncu_csv(seed: Seed, rng: random.Random, steps: int) -> None:
    """Cell edits (empty, text, nan, huge, negative), dropped columns, cut lines, lost headers."""
    data, done = mutate_ncu_csv(_original(seed), rng, steps)
    _run(seed, data, ".csv", NCU_COMMANDS, done)


@pytest.mark.slow
@fuzz(20)
@given(seed=st.sampled_from(NCU_REP), rng=st.randoms(use_true_random=False))
def test_ncu_report_damage(seed: Seed, rng: random.Random) -> None:
    """A truncated or bit-flipped .ncu-rep is read or refused, never a crash."""
    mutant = mutate(seed, _original(seed), rng)
    _run(seed, mutant.data, mutant.suffix, [("roofline",)], mutant.steps)


def test_the_harness_sees_each_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The classifier itself: a crash in a command, a broken model invariant, a many-line error
    and native output on file descriptor 2 are each an internal error; a clean read is handled."""
    seed = KINETO[0]
    path = tmp_path / "input.json"
    path.write_bytes(_original(seed))
    clean = Outcome()
    check_read(path, "kineto", clean)
    run_cli(["kernels", str(path)], clean)
    assert (clean.verdict, clean.problems) == ("handled", [])

    def crash(*_: object) -> None:
        raise ZeroDivisionError("planted")

    def broken(_: Trace) -> None:
        raise ModelError("planted")

    def noisy(*_: object) -> None:
        os.write(2, b"E0000 planted: a C++ library's log line\n")

    def chatty(*_: object) -> None:
        print("planted: a second line before the error", file=sys.stderr)
        raise TraceError(path, "refused")

    cases = [(kernels_report, "kernels", crash), (Trace, "check", broken), (kernels_command, "emit", noisy),
             (kernels_report, "kernels", chatty)]
    for owner, name, replacement in cases:
        with monkeypatch.context() as m:
            m.setattr(owner, name, replacement)
            outcome = Outcome()
            check_read(path, "kineto", outcome)
            run_cli(["kernels", str(path)], outcome)
        assert outcome.verdict == "internal", (name, outcome)
        assert any("planted" in p for p in outcome.problems), outcome.problems
