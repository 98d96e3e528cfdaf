"""The shared state of one diagnosis: the trace, the options, and analyses computed once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tracewhy.analyses.steps import StepsOptions, StepsResult, steps
from tracewhy.model.trace import Trace

T = TypeVar("T")


@dataclass(frozen=True)
class DiagnoseOptions:
    step_marker: str | None = None
    warmup: int | None = None


@dataclass
class Context:
    """Rules ask the context for analyses; each analysis runs at most once per diagnosis."""

    trace: Trace
    options: DiagnoseOptions = field(default_factory=DiagnoseOptions)
    _cache: dict[str, Any] = field(default_factory=dict)

    def cached(self, key: str, compute: Callable[[], T]) -> T:
        if key not in self._cache:
            self._cache[key] = compute()
        value: T = self._cache[key]
        return value

    def steps(self) -> StepsResult:
        return self.cached(
            "steps", lambda: steps(self.trace, StepsOptions(marker=self.options.step_marker, warmup=self.options.warmup))
        )
