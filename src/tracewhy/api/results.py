"""The results the API returns where a command shows more than its analysis' result: the
diagnosis shown as its findings, and the throughput ``--items-per-step`` adds to ``diagnose``,
``steps`` and ``diff``. Each is the report's result with those fields added, so that everything
the result already has (its rows among them) stays as it is."""

from __future__ import annotations

import html
from dataclasses import dataclass, fields
from pathlib import PurePath
from typing import Any, TypeVar

from tracewhy.analyses.steps import StepsResult
from tracewhy.analyses.throughput import Throughput
from tracewhy.findings.compare import Comparison
from tracewhy.reports.diagnose import Report, recoverable_unit
from tracewhy.units import printable

T = TypeVar("T")


@dataclass(frozen=True, repr=False)
class Diagnosis(Report):
    """The Report ``diagnose`` returns, with the throughput at its steady step times when
    ``items_per_step`` is given (None without steady steps): shown as its findings, one line each
    (a table in a notebook), where the generated repr printed every table the Report holds."""

    throughput: Throughput | None = None

    def __repr__(self) -> str:
        lines = [f"{self._title()}:"]
        lines += [f"  {f.severity.value:<6} {f.code}: {f.statement}" for f in self.findings]
        return "\n".join(printable(line) for line in lines)  # a trace's names may hold terminal escapes

    def _repr_html_(self) -> str:
        """A small table for Jupyter; every string is escaped (statements quote the trace's names)."""
        unit = recoverable_unit(self)
        rows = "".join(
            f"<tr><td>{html.escape(f.severity.value)}</td><td><code>{html.escape(f.code)}</code></td>"
            f"<td>{html.escape(f.statement)}</td>"
            f'<td style="text-align:right">{f.recoverable_ns_per_step / 1e6:,.3f}</td></tr>'
            for f in self.findings
        )
        return (f"<table><caption>{html.escape(self._title())}</caption><thead><tr><th>severity</th>"
                f"<th>code</th><th>statement</th><th>recoverable ms {html.escape(unit)}</th></tr></thead>"
                f"<tbody>{rows}</tbody></table>")

    def _title(self) -> str:
        n = len(self.findings)
        return f"tracewhy diagnosis of {PurePath(self.path).name}: {n} finding{'s' if n != 1 else ''}"


@dataclass(frozen=True)
class Steps(StepsResult):
    """The steps ``steps`` returns, with the throughput at the steady step times when
    ``items_per_step`` is given (None without steady steps)."""

    throughput: Throughput | None = None


@dataclass(frozen=True)
class Diff(Comparison):
    """Run B against baseline A, with each run's throughput when ``items_per_step`` is given
    (None for a run without steady steps)."""

    throughput_a: Throughput | None = None
    throughput_b: Throughput | None = None


def extended(cls: type[T], base: object, **added: Any) -> T:
    """``base`` (an instance of ``cls``'s parent) as a ``cls``, with the ``added`` fields."""
    parent = cls.__mro__[1]
    return cls(**{f.name: getattr(base, f.name) for f in fields(parent) if f.init}, **added)
