"""What the step account and its what-if predictions cost, beside the diagnosis they will lead.

Per trace, in one process, each the median of ``--repeats`` rounds (CPU seconds of all threads,
steadier than wall time on a shared machine): ``diagnose`` as it is today; the account (the
dependency graph, the windows, the part rules, the walks: ``step_model`` + ``step_account``);
and ``what_if`` with its suggested edits (each replayed alone on every analysed step, then the
three that save most together). The trace is read once beforehand. Traces: the largest shared
ones (by events, by bytes, an nsys export) and the 1 MB BERT trace, plus any extra paths given.
The table goes to stdout and to ``bench/results_account.md``.

Usage: python bench/bench_account.py [--repeats 3] [--no-write] [EXTRA_TRACE ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracewhy.analyses.account import AccountOptions, step_account, step_model
from tracewhy.analyses.what_if import PREDICTED_STEPS, REPLAY_ALL_MAX_EDGES, what_if
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.readers import read_trace
from tracewhy.reports.diagnose import diagnose_in

BENCH = Path(__file__).resolve().parent
TRACES = BENCH.parent.parent / "shared" / "traces"
RESULTS = BENCH / "results_account.md"
SHARED = ("hta/v100_ddp2_rank1_memprofile.json.gz", "tracelens/h100_owlv2-large_zero-shot.json.gz",
          "hta/tracediff_control_a100_rank3of8.json.gz", "nsys/nsysai_h100_2gpu_1s.sqlite.gz",
          "tracelens/h100_bert-small_bs1_seq512.json.gz")


def _median(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    cpu: list[float] = []
    result: Any = None
    for _ in range(repeats):
        c0 = time.process_time()
        result = fn()
        cpu.append(time.process_time() - c0)
    return statistics.median(cpu), result


def _row(path: Path, label: str, repeats: int) -> str:
    trace = read_trace(path)

    def diagnosis() -> Context:
        ctx = Context(trace, DiagnoseOptions())
        diagnose_in(ctx)
        return ctx

    diag_s, ctx = _median(diagnosis, repeats)
    options = AccountOptions()

    def account() -> Any:
        model = step_model(trace, options)
        return model, step_account(trace, options, model)

    def shared() -> Any:  # as the diagnosis will run it: its steps and host index already there
        model = step_model(trace, options, steps_result=ctx.steps(), host=ctx.host())
        return step_account(trace, options, model)

    acc_s, (model, acc) = _median(account, repeats)
    shared_s, _ = _median(shared, repeats)
    wi_s, wi = _median(lambda: what_if(model, acc), repeats)
    return (f"| {label} | {trace.slices.height:,} | {acc.steps_analysed} of {acc.steps_found} | {diag_s:.2f} | "
            f"{acc_s:.2f} ({acc_s / diag_s:.0%}) | {shared_s:.2f} ({shared_s / diag_s:.0%}) | {wi.table.height} | "
            f"{wi_s:.2f} ({wi_s / diag_s:.0%}) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("extra", nargs="*", type=Path, help="more traces (timed once)")
    args = ap.parse_args()
    lines = [
        "# What the step account and its predictions cost (bench_account.py)",
        "",
        f"CPU seconds, median of {args.repeats} rounds in one process (extra traces: one round). "
        "`diagnose`: today's diagnosis, without the account; `account`: step_model + step_account (at "
        f"most {AccountOptions().max_steps} steady steps) alone; `shared`: the same with the steps and "
        "the host index the diagnosis has computed, as the wiring will run it; `what-if`: what_if with "
        "the suggested edits, each alone and the top three together, replayed on every analysed step of a "
        f"graph of up to {REPLAY_ALL_MAX_EDGES:,} edges, else on {PREDICTED_STEPS} of them; in brackets, each "
        "as a share of `diagnose`.",
        "",
        "| trace | slices | steps analysed | diagnose s | account s | shared s | predictions | what-if s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rel in SHARED:
        lines.append(_row(TRACES / rel, rel, args.repeats))
        print(lines[-1], flush=True)
    for path in args.extra:
        lines.append(_row(path, path.name, 1))
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
