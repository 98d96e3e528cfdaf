"""The step-time predictions against real before/after pairs (tests/data/calibration, made by
scripts/gen_traces/calibration.py, tabled by bench/calibrate.py): for each fix, the saving
predicted from each before trace with the fix's edit, against the saving measured from the raw
files' own step markers (the spacing of ``ProfilerStep#N``, read here without tracewhy).

The tolerance is the one the bench shows is honest: the larger of 25% of the measured saving
and the noise of the repeats, on both sides (half the range of the pairs' own savings, plus half
the range of the savings predicted from each before trace); the sign always. Three fixes miss and
are marked so, with why (docs/account.md, "Calibration"); every fix's sign is right."""

from __future__ import annotations

import functools
import gzip
import importlib.util
import itertools
import json
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conftest import ROOT
from tracewhy.analyses.what_if_edits import Fix
from tracewhy.analyses.what_if_host_edits import SetGradsToNone

DATA = ROOT / "tests" / "data" / "calibration"
TOLERANCE_SHARE = 0.25


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "bench" / "calibrate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


BENCH = _bench()
EDITS: dict[str, tuple[str, tuple[Fix, ...]]] = BENCH.EDITS


def marker_step_ns(path: Path) -> float:
    """Median spacing of the file's ProfilerStep#N markers (the last one: its own length), ns;
    the first step left out as warm-up."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    marks = sorted((e["ts"], e["dur"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    lengths = [b[0] - a[0] for a, b in itertools.pairwise(marks)] + [marks[-1][1]]
    return statistics.median(lengths[1:]) * 1000.0


#: bench/calibrate.py's replay of one trace with one set of edits, made once in this module: the
#: sign and match tests and the tables' check ask for the same ones.
STEP_NS = functools.cache(BENCH.step_ns)
BENCH.step_ns = STEP_NS


def predicted_saving_ns(path: Path, edits: tuple[Fix, ...]) -> float:
    """The trace's median analysed window minus the median of those windows each replayed with
    ``edits`` (bench/calibrate.py's ``step_ns``)."""
    measured, predicted, _ = STEP_NS(path, edits)
    return float(measured - predicted)


MISSES = {
    # The first touch of the new gradients' pages is priced at 12x the zeroing (the first 2-core
    # machine's bench/first_touch.py; 3.3x to 4.4x on its successor); the pairs were captured on a
    # third machine, which logged no ratio, where the measured loss implies about 5x: the sign is
    # right, the size 3x too large. Whether the pages fault at all depends on glibc's heap
    # (docs/account.md, Calibration).
    "zero_grad_none": "the first-touch price is another machine's; the pairs' machine logged none",
    # The logging's ops and Python leave (3.2 to 3.5 ms predicted per pair); in three of the five
    # before captures and one of the afters backward's weight-gradient mm ran 2x slower (4.1 to
    # 4.5 ms of mm per step against 2.8 to 3.0), with or without the logging: noise that moves the
    # medians' before. 3.53 predicted of 4.89 (of 3.84 paired, 8%).
    "host_logging": "backward's mm ran 2x slower in three before captures (and one after), with or without logging",
    # ReduceOnce takes the earlier passes' communication and the DDP reducer's ops there (66.6 ms
    # predicted); DDP's gradient hook in every AccumulateGrad node (55.3 against 27.4 ms per step)
    # and backward's gemms beside gloo's threads on the two cores (55.6 against 39.5 ms) also fall
    # with no_sync(), and the before trace has no pass without them to price them from.
    "grad_accumulation": "DDP's gradient hooks and the cores gloo shares with backward: no reference in the trace",
}


@functools.cache
def savings_ns(key: str) -> tuple[float, float, float]:
    """(predicted, measured, noise) saving of one fix: the medians over its repeats, and the
    half ranges of the pairs' own savings and of the predictions added."""
    edits = BENCH.edits_for(key)  # at the first-touch ratio the pair's machine logged, where it logged one
    befores = sorted(DATA.glob(f"{key}_before_*.pt.trace.json.gz"))
    afters = sorted(DATA.glob(f"{key}_after_*.pt.trace.json.gz"))
    assert len(befores) == len(afters) >= 3
    before = [marker_step_ns(p) for p in befores]
    after = [marker_step_ns(p) for p in afters]
    measured = statistics.median(before) - statistics.median(after)
    pairs = [b - a for b, a in zip(before, after, strict=True)]
    predictions = [predicted_saving_ns(p, edits) for p in befores]
    noise = (max(pairs) - min(pairs) + max(predictions) - min(predictions)) / 2
    return statistics.median(predictions), measured, noise


@pytest.mark.parametrize("key", list(EDITS))
def test_the_predicted_saving_has_the_measured_sign(key: str) -> None:
    predicted, measured, _ = savings_ns(key)
    assert (predicted > 0) == (measured > 0), f"predicted {predicted / 1e6:.2f} ms, measured {measured / 1e6:.2f} ms"


@pytest.mark.parametrize("key", [
    pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=MISSES[k])) if k in MISSES else k for k in EDITS])
def test_the_predicted_saving_matches_the_measured_pair(key: str) -> None:
    predicted, measured, noise = savings_ns(key)
    tolerance = max(TOLERANCE_SHARE * abs(measured), noise)
    assert abs(predicted - measured) <= tolerance, (
        f"predicted {predicted / 1e6:.2f} ms, measured {measured / 1e6:.2f} ms (tolerance {tolerance / 1e6:.2f})")


def test_the_tables_in_the_readme_and_the_docs_are_the_benchs() -> None:
    """bench/calibrate.py writes the table into docs/account.md and, shorter, into the README:
    both must be what it computes from the committed traces now (rerun it after a change)."""
    bench = BENCH
    rows = [bench.calibrate(key) for key in bench.EDITS]
    for page, lines in ((bench.DOCS, bench.table(rows)), (bench.README, bench.short_table(rows))):
        text = page.read_text(encoding="utf-8")
        between = text.split(bench.MARKERS[0], 1)[1].split(bench.MARKERS[1], 1)[0]
        assert between.strip("\n") == "\n".join(lines), f"{page.name}: run python bench/calibrate.py"
    held = bench.table([bench.calibrate(key, bench.HOLDOUT_DATA) for key in bench.HOLDOUT])[:-2]
    text = bench.DOCS.read_text(encoding="utf-8")
    between = text.split(bench.HOLDOUT_MARKERS[0], 1)[1].split(bench.HOLDOUT_MARKERS[1], 1)[0]
    assert between.strip("\n") == "\n".join(held), "account.md's held-out table: run python bench/calibrate.py"


def test_a_pair_is_priced_at_its_machines_first_touch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``SetGradsToNone`` charges a cost of the machine: a pair is priced at the first-touch ratio
    its capturing interpreter logged (scripts/gen_traces/calibration.py's line, as it wrote it on
    this project's machine), the last run of that pair winning; none logged keeps the default."""
    bench = BENCH
    log = tmp_path / "captures.log"
    names = " ".join(f"zero_grad_none_{v}_1.pt.trace.json.gz" for v in ("before", "after"))
    log.write_text(f"# a machine\n{names}\tload 0.1 -> 0.2\t5.0 s\n"
                   "  first touch 4.42x a warm zero_() (48 MiB: 34.58 ms against 7.79 ms)\n"
                   f"item_reads_before_1.pt.trace.json.gz\tload 0.1 -> 0.2\t5.0 s\n"
                   "  first touch 9.00x a warm zero_() (48 MiB: 1.00 ms against 0.11 ms)\n", encoding="utf-8")
    assert bench.capture_first_touch("zero_grad_none", tmp_path) == 4.42
    (edit,) = bench.edits_for("zero_grad_none", tmp_path)
    assert edit == SetGradsToNone(first_touch_per_zeroing=4.42)
    log.write_text(log.read_text(encoding="utf-8") + f"{names}\tload 0.1 -> 0.2\t5.0 s\n", encoding="utf-8")
    assert bench.capture_first_touch("zero_grad_none", tmp_path) is None
    assert bench.edits_for("zero_grad_none", tmp_path) == (SetGradsToNone(),)
    # An edit that charges no first touch (the step with the memory kept) stays so.
    log.write_text(f"{names}\tload 0.1 -> 0.2\t5.0 s\n  first touch 4.42x a warm zero_()\n", encoding="utf-8")
    kept = (SetGradsToNone(first_touch_per_zeroing=0.0),)
    monkeypatch.setitem(bench.EDITS, "zero_grad_none", ("kept", kept))
    assert bench.edits_for("zero_grad_none", tmp_path) == kept
