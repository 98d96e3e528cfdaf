"""How right the step-time predictions are: for each fix of ``tests/data/calibration`` (real
before/after pairs, ``scripts/gen_traces/calibration.py``), the step predicted from each *before*
trace with the fix's edit, against the step measured in the *after* traces.

Per trace, the step is the median of its analysed steady windows (``step_model``'s). Per fix:
*before* and *measured after* are the medians over the repeats' traces; *predicted after* the
median over the before traces of the median predicted window (each window replayed alone with
the edit); the savings are before minus after; the spread is the range of the pairs' own
savings (before and after of the same repeat, captured one after the other). The error is
|predicted - measured saving| as a share of the measured saving. Beside it, the *paired*
savings: the median of the pairs' own savings, against the median of the savings each before
trace predicts for itself (its step minus its predicted step), and the error between the two: a
capture that drifts or runs slow as a whole moves one pair, and both sides of it, rather than
the medians of both sides apart. *picked* says whether
``suggested_edits`` proposes that edit by itself from each before trace's account.

The pairs of ``tests/data/holdout`` (``HOLDOUT``) are checked the same way in a table of their
own, never in the medians: each a fix type calibrated above, on a program its edit was not
written for.

Usage: python bench/calibrate.py [--data DIR] [--no-write]
The table goes to stdout, to ``bench/results_calibration.md``, into docs/account.md's
"Calibration" section (between its calibration markers) and, shorter, into the README's; the
held-out table to the first two.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec

from tracewhy.analyses.account import step_account, step_model
from tracewhy.analyses.backward_passes import ReduceOnce
from tracewhy.analyses.what_if import predict, suggested_edits, window_edges
from tracewhy.analyses.what_if_edits import (
    DropSync,
    Fix,
    HideCollective,
    MultiTensorOptimizer,
    PrefetchData,
    RemoveCompile,
    RemoveRecompute,
)
from tracewhy.analyses.what_if_host_edits import BatchLoop, Preallocate, RemoveCode, SetGradsToNone
from tracewhy.readers import read_trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pages import write_between_markers  # bench/ is a folder of scripts, not a package

BENCH = Path(__file__).resolve().parent
DATA = BENCH.parent / "tests" / "data" / "calibration"
HOLDOUT_DATA = BENCH.parent / "tests" / "data" / "holdout"
RESULTS = BENCH / "results_calibration.md"
DOCS = BENCH.parent / "docs" / "account.md"
README = BENCH.parent / "README.md"
MARKERS = ("<!-- calibration:start -->", "<!-- calibration:end -->")
HOLDOUT_MARKERS = ("<!-- holdout:start -->", "<!-- holdout:end -->")

#: The fix each pair applies (scripts/gen_traces/calibration.py), as the edit that models it.
#: ``.item()`` on a CPU tensor waits for nothing: what the read costs is the ops it forces (the
#: account's ``host: up to aten::item``) and the hook's Python that runs them, so that fix is the
#: wait dropped and that code gone. Per-step logging with ``.item()`` reads is the same part
#: (its ops up to the reads), removed with the Python around it (the sha256, the formatting);
#: the gradients all-reduced by hand are the account's ``communication: all_reduce``.
EDITS: dict[str, tuple[str, tuple[Fix, ...]]] = {
    "dataloader_workers": ("DataLoader workers", (PrefetchData(),)),
    "foreach_optimizer": ("foreach optimizer", (MultiTensorOptimizer(),)),
    "item_reads": (".item() removed", (DropSync("aten::item"), RemoveCode("host: up to aten::item"))),
    "checkpointing": ("checkpointing off", (RemoveRecompute(),)),
    "recompile": ("recompile removed", (RemoveCompile(),)),
    "host_loop": ("host loop vectorised", (BatchLoop("preprocess"),)),
    "cat_growth": ("preallocated buffer", (Preallocate("aten::cat"),)),
    "zero_grad_none": ("zero_grad(set_to_none)", (SetGradsToNone(),)),
    "host_logging": ("logging moved off the step", (RemoveCode("host: up to aten::item"),)),
    "grad_allreduce": ("all-reduce hidden (DDP)", (HideCollective("all_reduce"),)),
    "grad_accumulation": ("no_sync() while accumulating (DDP)", (ReduceOnce(),)),
}
#: Held-out pairs (scripts/gen_traces/calibration.py's HOLDOUT), with the edit of their fix type.
HOLDOUT: dict[str, tuple[str, tuple[Fix, ...]]] = {
    "checkpointing_transformer": ("checkpointing off, transformer layers (torch 2.13)", (RemoveRecompute(),)),
    "dataloader_tokens": ("DataLoader worker, CPU-bound tokenising", (PrefetchData(),)),
}


def _fix(key: str) -> tuple[str, tuple[Fix, ...]]:
    return EDITS[key] if key in EDITS else HOLDOUT[key]


#: captures.log's line for the machine's first-touch cost (scripts/gen_traces/calibration.py's
#: ``first_touch_line``), under the line of the interpreter that measured it.
_FIRST_TOUCH = re.compile(r"^\s+first touch (\d+(?:\.\d+)?)x")


def capture_first_touch(key: str, data: Path = DATA) -> float | None:
    """The first-touch ratio the machine that captured ``key``'s pairs measured beside them:
    from the last interpreter in captures.log that wrote ``key``'s traces; None where it
    measured none."""
    log = data / "captures.log"
    if not log.is_file():
        return None
    ratio: float | None = None
    mine = False
    for line in log.read_text(encoding="utf-8").splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            mine = f"{key}_before_1.pt.trace.json.gz" in line.split("\t", 1)[0]
            if mine:
                ratio = None
        elif mine and (found := _FIRST_TOUCH.match(line)):
            ratio = float(found.group(1))
    return ratio


def edits_for(key: str, data: Path = DATA) -> tuple[Fix, ...]:
    """``key``'s edits as its pairs' machine prices them: ``SetGradsToNone`` charges a first
    touch at the ratio the capturing machine measured (a cost of the machine, not of the trace;
    left at its default where none was recorded)."""
    ratio = capture_first_touch(key, data)
    return tuple(msgspec.structs.replace(e, first_touch_per_zeroing=ratio)
                 if isinstance(e, SetGradsToNone) and e.first_touch_per_zeroing and ratio is not None else e
                 for e in _fix(key)[1])


@dataclass(frozen=True)
class Calibration:
    """One fix, in ns: medians over the repeats (see the module docstring)."""

    key: str
    fix: str
    before_ns: int
    predicted_ns: int
    measured_ns: int
    pair_savings_ns: tuple[int, ...]  # per repeat: its before minus its after
    pair_predictions_ns: tuple[int, ...]  # per repeat: its before minus the step it predicts
    picked: int  # before traces whose suggested edits hold the fix's edit
    repeats: int

    @property
    def predicted_saving_ns(self) -> int:
        return self.before_ns - self.predicted_ns

    @property
    def measured_saving_ns(self) -> int:
        return self.before_ns - self.measured_ns

    @property
    def noise_ns(self) -> int:
        """Half the range of the pairs' own savings: how far one repeat's saving strays."""
        return (max(self.pair_savings_ns) - min(self.pair_savings_ns)) // 2

    @property
    def error(self) -> float:
        """|predicted - measured saving| / measured saving."""
        return abs(self.predicted_saving_ns - self.measured_saving_ns) / max(abs(self.measured_saving_ns), 1)

    @property
    def sign_right(self) -> bool:
        return (self.predicted_saving_ns > 0) == (self.measured_saving_ns > 0)

    @property
    def paired_saving_ns(self) -> int:
        return round(statistics.median(self.pair_savings_ns))

    @property
    def paired_prediction_ns(self) -> int:
        return round(statistics.median(self.pair_predictions_ns))

    @property
    def paired_error(self) -> float:
        """|paired prediction - paired saving| / paired saving: each side a median over the
        pairs, so a before trace's own step is on both sides of its saving."""
        return abs(self.paired_prediction_ns - self.paired_saving_ns) / max(abs(self.paired_saving_ns), 1)


def step_ns(path: Path, edits: tuple[Fix, ...] = ()) -> tuple[int, int, bool]:
    """(measured step, predicted step with ``edits``, whether ``suggested_edits`` picks them):
    medians over the trace's analysed steady windows, each replayed alone."""
    trace = read_trace(path)
    model = step_model(trace)
    windows = window_edges(model, max_steps=len(model.paths))
    measured = statistics.median(w.path.window_end - w.path.window_start for w in windows)
    if not edits:
        return round(measured), round(measured), False
    predicted = statistics.median(predict(model, list(edits), [w]).predicted_ns for w in windows)
    labels = {e.label for e in suggested_edits(model, step_account(trace, model=model))}
    return round(measured), round(predicted), any(e.label in labels for e in edits)


def calibrate(key: str, data: Path = DATA) -> Calibration:
    fix = _fix(key)[0]
    edits = edits_for(key, data)
    befores = sorted(data.glob(f"{key}_before_*.pt.trace.json.gz"))
    afters = sorted(data.glob(f"{key}_after_*.pt.trace.json.gz"))
    if not befores or len(befores) != len(afters):
        raise SystemExit(f"{data}: {key} needs as many after traces as before traces (found {len(befores)}, "
                         f"{len(afters)})")
    before = [step_ns(p, edits) for p in befores]
    after = [step_ns(p)[0] for p in afters]
    return Calibration(key=key, fix=fix, before_ns=round(statistics.median(b[0] for b in before)),
                       predicted_ns=round(statistics.median(b[1] for b in before)),
                       measured_ns=round(statistics.median(after)),
                       pair_savings_ns=tuple(b[0] - a for b, a in zip(before, after, strict=True)),
                       pair_predictions_ns=tuple(b[0] - b[1] for b in before),
                       picked=sum(b[2] for b in before), repeats=len(befores))


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.2f}"


def _pct(error: float) -> str:
    """One decimal under 100%: the errors are read against the 15% target, and the fixes
    around the median (14.65% and 14.88%) would both print as 15%."""
    return f"{error:.1%}" if error < 1 else f"{error:.0%}"


def table(rows: list[Calibration]) -> list[str]:
    lines = ["| fix | before (ms) | predicted after | measured after | predicted saving | measured saving "
             "(pairs' range) | error (% of measured saving) | paired prediction | paired saving | "
             "error (% of paired) | picked by `what_if` |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        spread = f"{_ms(min(r.pair_savings_ns))} to {_ms(max(r.pair_savings_ns))}"
        sign = "" if r.sign_right else " (sign wrong)"
        lines.append(f"| {r.fix} | {_ms(r.before_ns)} | {_ms(r.predicted_ns)} | {_ms(r.measured_ns)} | "
                     f"{_ms(r.predicted_saving_ns)} | {_ms(r.measured_saving_ns)} ({spread}) | "
                     f"{_pct(r.error)}{sign} | {_ms(r.paired_prediction_ns)} | {_ms(r.paired_saving_ns)} | "
                     f"{_pct(r.paired_error)} | "
                     f"{r.picked} of {r.repeats} |")
    errors = [r.error for r in rows]
    paired = [r.paired_error for r in rows]
    right = sum(r.sign_right for r in rows)
    # One decimal for the medians: they are read against the 15% target, and 15.1% is not within it.
    lines += ["", f"Median absolute error: {statistics.median(errors):.1%} of the measured saving "
              f"(largest {max(errors):.0%}), {statistics.median(paired):.1%} of the paired saving "
              f"(largest {max(paired):.0%}); the sign right for {right} of {len(rows)} fixes."]
    return lines


def short_table(rows: list[Calibration]) -> list[str]:
    """The README's table: each fix's saving predicted and measured, and the error."""
    lines = ["| fix | predicted saving (ms) | measured saving (ms) | error |", "|---|---:|---:|---:|"]
    for r in rows:
        sign = ", sign wrong" if not r.sign_right else ""
        lines.append(f"| {r.fix} | {_ms(r.predicted_saving_ns)} | {_ms(r.measured_saving_ns)} | "
                     f"{_pct(r.error)}{sign} |")
    return [*lines, "", table(rows)[-1]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    rows = [calibrate(key, args.data) for key in EDITS]
    lines = table(rows)
    held = table([calibrate(key, HOLDOUT_DATA) for key in HOLDOUT])[:-2]  # (no medians: not calibrated on)
    print("\n".join([*lines, "", "Held out:", "", *held]))
    if not args.no_write:
        RESULTS.write_text("<!-- written by bench/calibrate.py: rerun it, do not edit -->\n" + "\n".join(lines)
                           + "\n\nHeld out (not in the medians):\n\n" + "\n".join(held) + "\n", encoding="utf-8")
        write_between_markers(DOCS, MARKERS, lines)
        write_between_markers(DOCS, HOLDOUT_MARKERS, held)
        write_between_markers(README, MARKERS, short_table(rows))


if __name__ == "__main__":
    main()
