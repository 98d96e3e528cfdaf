"""``account``: where the step goes, alone: the step account of the trace's steady steps (or its
iterations, or the whole trace), the lines ``diagnose`` opens with, and the parts per step."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from tracewhy.analyses.account import AccountOptions, AccountResult, step_account
from tracewhy.analyses.account_classes import parts_by_class
from tracewhy.analyses.mfu_steps import MfuResult, measure_mfu
from tracewhy.analyses.step_bytes import DecodeBandwidth, decode_bandwidth
from tracewhy.analyses.step_classes import StepClasses, step_classes
from tracewhy.analyses.steps import StepsOptions, steps
from tracewhy.findings.where_step_goes import AccountLine, account_lines
from tracewhy.readers.registry import read_kernel_provenance
from tracewhy.reports.inputs import PLAIN, Loader, TraceSource
from tracewhy.rows import Rows


@dataclass(frozen=True)
class AccountReportOptions:
    step_marker: str | None = None
    #: Steps to treat as warm-up (default: as ``steps`` decides).
    warmup: int | None = None
    #: At most this many steady steps are analysed, spread evenly over the run.
    max_steps: int = AccountOptions().max_steps
    #: A TORCH_TRACE directory (or log) or TORCH_LOGS=output_code capture of the same run.
    logs: Path | None = None
    #: Bytes one decode step reads, as the user gave them (``--decode-bytes``).
    decode_bytes: int | None = None


@dataclass(frozen=True)
class AccountReport(Rows, rows="account.parts", key="part"):
    """The account of ``path``, the lines that say where the step goes (largest parts to 80%
    of the step, the rest summed), and how much of the step the matrix math would take at peak (MFU)."""

    path: str
    account: AccountResult
    lines: list[AccountLine]
    #: On an inference trace: the steps by class, the account's parts per class
    #: (``account_classes.PARTS_BY_CLASS_SCHEMA``) and the decode steps' memory bandwidth.
    classes: StepClasses | None = None
    parts_by_class: pl.DataFrame | None = None
    decode: DecodeBandwidth | None = None
    mfu: MfuResult | None = None


def account_report(trace: TraceSource, options: AccountReportOptions | None = None,
                   loader: Loader = PLAIN) -> AccountReport:
    options = options or AccountReportOptions()
    provenance = None
    if options.logs is not None:
        provenance = read_kernel_provenance(options.logs)
        if provenance.warnings:
            loader.warn(options.logs, provenance.warnings)
    t = loader.trace(trace)
    t.require_whole()
    found = steps(t, StepsOptions(marker=options.step_marker, warmup=options.warmup))
    r = step_account(t, AccountOptions(marker=options.step_marker, max_steps=options.max_steps,
                                       provenance=provenance), steps_result=found)
    classes = step_classes(t, found)
    return AccountReport(path=t.meta.path, account=r, lines=account_lines(r) if r.mean_step_ns > 0 else [],
                         classes=classes, parts_by_class=parts_by_class(r, classes) if classes else None,
                         decode=decode_bandwidth(t, classes, options.decode_bytes) if classes else None,
                         mfu=measure_mfu(t, found))
